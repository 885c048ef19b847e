#!/usr/bin/env bash
# powersgd_lab.sh: ddpgo's PowerSGD against PyTorch DDP's powerSGD_hook on the same shaped links.
#
# Over scripts/netlab.sh's test hosts (one rank per host, every byte through tc-shaped links), for
# each rate, model and PowerSGD rank, in interleaved rounds:
#
#   ddpgo fp32        netlab.sh mpirun -- ddpbench run --backend mpi --compute none --model M
#   ddpgo powersgd    ... --compression powersgd --powersgd-rank R (compressing from step 0)
#   torch fp32        torch_ddp.py --model M, one process per host through netlab.sh exec
#   torch powersgd    torch_ddp.py --model M --hook powersgd --powersgd-rank R --powersgd-start-iter 2
#                     --bucket-cap-mb 1000 (torch 1.13 refuses a start below 2 with error feedback or
#                     warm start, so its first two steps are plain all-reduces; the timed steps come
#                     after them. One bucket: over gloo with several buckets, torch 1.13's hook
#                     issues each bucket's later all-reduces from gloo's completion callbacks, in an
#                     order that differs between the ranks, and the job dies of mismatched
#                     collectives, "op.preamble.length <= op.nbytes"; TORCH_PSGD_BUCKET_MB=25 shows it)
#
# Each run records its median step (slowest rank) and the bytes each host's eth0 sent per step: for
# ddpgo, netlab.sh counters over the whole run (every step of it compresses, warmup included); for
# torch, torch_ddp.py --count-iface eth0 over its timed steps (its plain first steps left out). Raw results go to $OUT/lab.jsonl (one JSON object a run) and the runs' own output beside
# it; the summary prints the median over the rounds of each row, and the ratios the issue asks for.
#
# Usage: scripts/powersgd_lab.sh            the figures: RATES="1gbit 10gbit", both models, RANKS="1 4"
#        SMOKE=1 scripts/powersgd_lab.sh    one short round at 1 Gbit/s, ResNet-50, rank 4 (a minute)
# Environment: RATES, MODELS (manifest files), RANKS, ROUNDS (default 2), HOSTS (default 2), STEPS,
# WARMUP (at least 3: torch's start_powerSGD_iter is 2), OUT (default results/powersgd).
#
# Needs root, network namespaces and tc (netlab.sh check), Open MPI (make mpi-deps) and PyTorch
# (make peers-deps). Exits 2, saying why, where any is missing. Brings the lab up at the first rate,
# reshapes it for the others, and takes it down at the end (a lab already up is reshaped and left up).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
lab=$root/scripts/netlab.sh
py=/usr/bin/python3

skip() { echo "powersgd_lab: skipped: $*" >&2; exit 2; }
"$lab" check >/dev/null 2>&1 || skip "$("$lab" check 2>&1 | tail -1)"
pkg-config --exists ompi-c 2>/dev/null && command -v mpirun >/dev/null || skip "Open MPI not found (make mpi-deps)"
$py -c 'import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook' 2>/dev/null || skip "PyTorch not found for $py (make peers-deps)"

if [[ ${SMOKE:-0} == 1 ]]; then
	: "${RATES:=1gbit}" "${MODELS:=models/manifests/resnet50.json}" "${RANKS:=4}" "${ROUNDS:=1}" "${STEPS:=2}" "${WARMUP:=3}"
fi
rates=${RATES:-1gbit 10gbit}
models=${MODELS:-models/manifests/resnet50.json models/manifests/bert-base.json}
ranks=${RANKS:-1 4}
rounds=${ROUNDS:-2}
hosts=${HOSTS:-2}
steps=${STEPS:-8}
warmup=${WARMUP:-3}
((warmup >= 3)) || { echo "powersgd_lab: WARMUP=$warmup: want at least 3 (torch compresses from step 2)" >&2; exit 1; }
out=${OUT:-results/powersgd}
mkdir -p "$out"
out=$(cd "$out" && pwd)
: >"$out/lab.jsonl"

work=$(mktemp -d)
own_lab=0
cleanup() {
	rm -rf "$work"
	if ((own_lab)); then "$lab" down >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
go build -tags mpi -o "$work/ddpbench" ./cmd/ddpbench

# sent: the bytes every host's eth0 has sent, summed.
sent() { "$lab" counters | awk '{s += $3} END {printf "%.0f\n", s}'; }

# record SIDE HOOK MODEL RATE RANK ROUND MEDIAN_MS BYTES_PER_STEP_PER_HOST
record() {
	printf '{"side":"%s","hook":"%s","model":"%s","rate":"%s","rank":%s,"round":%s,"median_ms":%s,"wire_bytes_per_step":%s}\n' \
		"$@" >>"$out/lab.jsonl"
}

# ddpgo HOOK MODEL RATE RANK ROUND: one ddpbench run over MPI, one rank per host.
ddpgo() {
	local hook=$1 model=$2 rate=$3 rank=$4 round=$5 name file args
	args=()
	name=$(basename "$model" .json)
	file="$out/ddpgo_${name}_${rate}_${hook}_r${rank}_round$round.json"
	[[ $hook == powersgd ]] && args=(--compression powersgd --powersgd-rank "$rank")
	local before after
	before=$(sent)
	"$lab" mpirun -x MALLOC_ARENA_MAX=1 -- "$work/ddpbench" run --backend mpi --compute none --model "$root/$model" \
		--steps "$steps" --warmup "$warmup" --format json "${args[@]}" >"$file"
	after=$(sent)
	local median
	median=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["step_ms"]["median"])' "$file")
	record ddpgo "$hook" "$name" "$rate" "$rank" "$round" "$median" $(((after - before) / hosts / (steps + warmup)))
	echo "  ddpgo $hook rank $rank: step $median ms" >&2
}

port=29500
# torch HOOK MODEL RATE RANK ROUND: torch_ddp.py on every host at once.
torch_run() {
	local hook=$1 model=$2 rate=$3 rank=$4 round=$5 name file args
	args=(--hook "$hook")
	name=$(basename "$model" .json)
	file="$out/torch_${name}_${rate}_${hook}_r${rank}_round$round.json"
	[[ $hook == powersgd ]] && args+=(--powersgd-rank "$rank" --powersgd-start-iter 2 --bucket-cap-mb "${TORCH_PSGD_BUCKET_MB:-1000}")
	port=$((port + 1))
	local pids=() i
	for ((i = 0; i < hosts; i++)); do
		"$lab" exec "h$i" env RANK=$i WORLD_SIZE="$hosts" MASTER_ADDR=198.18.0.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=eth0 \
			$py "$root/scripts/torch_ddp.py" --model "$root/$model" --steps "$steps" --warmup "$warmup" --count-iface eth0 "${args[@]}" \
			>"$file.h$i" 2>"$file.h$i.err" &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i"; done
	cp "$file.h0" "$file"
	local median bytes
	median=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["median_ms"])' "$file")
	bytes=$($py -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["tx_bytes_per_step"]))' "$file")
	record torch "$hook" "$name" "$rate" "$rank" "$round" "$median" "$bytes"
	echo "  torch $hook rank $rank: step $median ms" >&2
}

first=1
for rate in $rates; do
	if ((first)) && ! "$lab" status >/dev/null 2>&1; then
		"$lab" up -n "$hosts" -r "$rate" >&2
		own_lab=1
	else
		"$lab" rate "$rate" >&2
	fi
	first=0
	for model in $models; do
		for round in $(seq "$rounds"); do
			echo "powersgd_lab: $rate, $(basename "$model" .json), round $round of $rounds" >&2
			ddpgo none "$model" "$rate" 0 "$round"
			torch_run none "$model" "$rate" 0 "$round"
			for rank in $ranks; do
				ddpgo powersgd "$model" "$rate" "$rank" "$round"
				torch_run powersgd "$model" "$rate" "$rank" "$round"
			done
		done
	done
done

# The summary: medians over the rounds, and the ratios of the goals.
$py - "$out/lab.jsonl" <<'EOF'
import collections, json, statistics, sys
rows = collections.defaultdict(list)
wire = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["model"], r["rate"], r["side"], r["hook"], r["rank"])
    rows[key].append(r["median_ms"])
    wire[key].append(r["wire_bytes_per_step"])
med = {k: statistics.median(v) for k, v in rows.items()}
print("| model | rate | hook | ddpgo step | PyTorch step | ddpgo / PyTorch | ddpgo / ddpgo fp32 | wire bytes a step per host (ddpgo, PyTorch) |")
print("|---|---|---|---|---|---|---|---|")
for (model, rate, side, hook, rank) in sorted(rows):
    if side != "ddpgo":
        continue
    g = med[(model, rate, "ddpgo", hook, rank)]
    t = med.get((model, rate, "torch", hook, rank))
    f = med.get((model, rate, "ddpgo", "none", 0))
    name = "fp32" if hook == "none" else "powersgd rank %d" % rank
    tw = wire.get((model, rate, "torch", hook, rank), [0])
    print("| %s | %s | %s | %.1f ms | %s | %s | %s | %s, %s |" % (
        model, rate, name, g, "%.1f ms" % t if t else "-", "%.2fx" % (g / t) if t else "-",
        "%.3fx" % (g / f) if f and hook != "none" else "-",
        format(int(statistics.median(wire[(model, rate, side, hook, rank)])), ","), format(int(statistics.median(tw)), ",")))
EOF
echo "powersgd_lab: raw results in $out" >&2
