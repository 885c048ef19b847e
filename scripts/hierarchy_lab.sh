#!/usr/bin/env bash
# hierarchy_lab.sh measures the several-ranks-per-host goals in the lab
# (scripts/netlab.sh, as root): ResNet-50's step (--compute none: the
# reduction of its gradients alone) over 2 hosts, each an Open MPI node,
# in interleaved rounds of
#
#   2x1       one rank per host
#   2x2       two ranks per host, hierarchical (the backend's default there,
#             its all-reduces pipelined in 1 MiB chunks)
#   2x2-flat  two ranks per host, DDPGO_MPI_HIER=0 (every byte through Open MPI)
#   mpi-2x2   Open MPI's own MPI_Allreduce of 64 MiB, 2x2, its C loop
#             (scripts/peers/mpi_allreduce.c, the median of the slowest
#             rank's calls), out of place and in place
#
#   2x2-cN    with CHUNK=N set (bytes, or K or M; 0 for none): two ranks per
#             host, hierarchical, its all-reduces cut into N-byte chunks
#             (DDPGO_MPI_HIER_CHUNK)
#
# and prints each run's figure, the medians over the rounds and the goals'
# ratios. Usage: scripts/hierarchy_lab.sh [RATE] (default 1gbit); ROUNDS
# (default 3) and STEPS (default 8) set the rounds and each ddpbench run's
# measured steps; OUT (default results/hierarchy) keeps the raw output.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1gbit}
rounds=${ROUNDS:-3}
steps=${STEPS:-8}
out=${OUT:-results/hierarchy}
mkdir -p "$out"
work=$(mktemp -d)
lab=scripts/netlab.sh
trap 'bash $lab down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

go build -tags mpi -o "$work/ddpbench" ./cmd/ddpbench
mpicc -O2 -o "$work/mpi_allreduce" scripts/peers/mpi_allreduce.c
bash $lab down >/dev/null 2>&1 || true
bash $lab up -n 2 -r "$rate" >/dev/null

# step RUN N [MPIRUN-ARGS]: one ddpbench run; its median step in ms.
step() {
	local name=$1 n=$2
	shift 2
	bash $lab mpirun -N "$n" -x MALLOC_ARENA_MAX=1 "$@" -- \
		"$work/ddpbench" run --backend mpi --compute none --steps "$steps" --warmup 2 --format json \
		>"$out/$name.json" 2>"$out/$name.err"
	python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["step_ms"]["median"], 1))' "$out/$name.json"
}

# cloop RUN: Open MPI's C loop at 64 MiB, 2x2; "out/in" in ms.
cloop() {
	local name=$1
	rm -f "$out/$name.csv"
	bash $lab mpirun -N 2 -x BENCH_BUDGET_S=0.05 -x BENCH_MAX_BYTES=67108864 -- \
		"$work/mpi_allreduce" "$out/$name.csv" "$name" >"$out/$name.txt" 2>&1
	python3 - "$out/$name.csv" <<'EOF'
import csv, sys
rows = {r["mode"]: float(r["median_us"]) / 1000 for r in csv.DictReader(open(sys.argv[1])) if r["bytes"] == "67108864"}
print(f'{rows["outofplace"]:.1f}/{rows["inplace"]:.1f}')
EOF
}

figs=$out/figures.tsv
: >"$figs"
chunk=${CHUNK:-}
printf '%-6s %10s %10s %10s %16s %10s\n' round 2x1 2x2 2x2-flat "mpi-2x2 (o/i)" "${chunk:+2x2-c$chunk}"
for r in $(seq "$rounds"); do
	a=$(step "2x1_r$r" 1)
	b=$(step "2x2_r$r" 2)
	c=$(step "2x2-flat_r$r" 2 -x DDPGO_MPI_HIER=0)
	d=$(cloop "mpi-2x2_r$r")
	e=-
	if [ -n "$chunk" ]; then
		e=$(step "2x2-c${chunk}_r$r" 2 -x DDPGO_MPI_HIER_CHUNK="$chunk")
	fi
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$a" "$b" "$c" "$d" "$e" >>"$figs"
	printf '%-6s %10s %10s %10s %16s %10s\n' "$r" "$a" "$b" "$c" "$d" "${chunk:+$e}"
done

# The medians and the goals. Open MPI's figure is the better of out of
# place and in place, scaled from 64 MiB to ResNet-50's 102,228,128 bytes
# (arithmetic, as a loop of that size is not run).
python3 - "$figs" "$chunk" <<'EOF'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
med = lambda i: statistics.median(float(r[i]) for r in rows)
one, hier, flat = med(1), med(2), med(3)
mpi = statistics.median(min(float(x) for x in r[4].split("/")) for r in rows) * 102228128 / 67108864
print(f"\nmedians of {len(rows)} rounds: 2x1 {one:.1f} ms, 2x2 hierarchical {hier:.1f} ms, 2x2 flat {flat:.1f} ms, Open MPI 2x2 (scaled) {mpi:.1f} ms")
for what, r, goal in (("2x2 hierarchical / 2x1", hier / one, 1.1), ("2x2 hierarchical / 2x2 flat", hier / flat, 0.75), ("2x2 hierarchical / Open MPI 2x2", hier / mpi, 0.8)):
    print(f"{what}: {r:.2f}x (goal <= {goal}x: {'met' if r <= goal else 'not met'})")
if rows[0][5] != "-":
    ch = med(5)
    print(f"2x2 hierarchical, DDPGO_MPI_HIER_CHUNK={sys.argv[2]}: {ch:.1f} ms; / 2x1 {ch / one:.2f}x, / 2x2 flat {ch / flat:.2f}x, / Open MPI 2x2 {ch / mpi:.2f}x")
EOF
