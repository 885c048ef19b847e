#!/usr/bin/env bash
# bench.sh: the step-time figures of docs/lab/gomlx.md.
#
#   integrations/gomlx/scripts/bench.sh [cnn|mlp] [ROUNDS]
#   CONFIGS="mpi-2 lab-2" integrations/gomlx/scripts/bench.sh mlp 3
#
# Builds examples/digitscnn with the mpi tag and runs ROUNDS rounds, each
# of every configuration in turn, for a fixed number of steps each, with
# the same global batch (the ranks split it):
#
#   inproc-N   ddptrain over N = 1, 2, 4 ranks in one process, and plain
#              GoMLX (train.Trainer, one process, one graph a step) in the
#              same process, the two taking turns a step each (-compare)
#   ready-all  inproc-2 with every gradient marked ready at the end of the
#              hand-off instead of as it is copied
#   mpi-N      ddptrain over N = 1, 2, 4 processes under mpirun, each run
#              right after a run of plain GoMLX alone (its baseline)
#   lab-2      ddptrain over 2 test hosts of scripts/netlab.sh, a process
#              each, joined by its shaped links (netlab.sh up first), with
#              the same baseline; not in the default list
#
# so that a slow patch of a shared machine falls on a configuration and
# its baseline alike. Every run prints the medians of its timed steps
# (stderr gets every line); this script prints, per configuration, the
# median over the rounds of: the baseline's step, ddptrain's step, their
# ratio (the run's own), the step's parts (graph, hand-off, reduction,
# optimizer), and the hand-off and reduction's share of the step on rank 0
# (whose reduction includes waiting for slower ranks) and on the rank that
# reached each step's all-reduces last. Needs Open MPI (make mpi-deps).
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:-cnn}
rounds=${2:-5}
case $model in
cnn) steps=30 warmup=5 batch=32 ;;
mlp) steps=6 warmup=2 batch=8 ;;
*) echo "bench.sh: model $model: want cnn or mlp" >&2; exit 2 ;;
esac

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -tags mpi -o "$dir/digitscnn" ./examples/digitscnn
mpirun=(mpirun --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo -x MALLOC_ARENA_MAX=1)
if [[ $(id -u) == 0 ]]; then mpirun+=(--allow-run-as-root); fi
args=(-model "$model" -batch "$batch" -steps "$steps" -warmup "$warmup")
read -r -a configs <<<"${CONFIGS:-inproc-1 inproc-2 inproc-4 ready-all mpi-1 mpi-2 mpi-4}"

# The numbers of a median line: step, graph, hand-off, reduction,
# optimizer (ms), rank 0's share and the last rank's (%).
numbers() {
	sed -n 's/.*median step \([0-9.]*\) ms; graph \([0-9.]*\) ms, hand-off \([0-9.]*\) ms, reduction \([0-9.]*\) ms, optimizer \([0-9.]*\) ms; hand-off+reduction \([0-9.]*\)% of the step\(, \([0-9.]*\)% on the rank that arrived last\)\{0,1\}$/\1,\2,\3,\4,\5,\6,\8/p'
}

# run CONFIG prints "baseline step,ddptrain's numbers".
run() {
	local out base
	case $1 in
	inproc-*) out=$("$dir/digitscnn" -compare -ranks "${1#inproc-}" "${args[@]}") ;;
	ready-all) out=$("$dir/digitscnn" -compare -ranks 2 -ready-batch 1000 "${args[@]}") ;;
	mpi-* | lab-2)
		out="plain: $("$dir/digitscnn" -plain "${args[@]}" | grep 'median step')"
		if [[ $1 == lab-2 ]]; then
			out+=$'\n'"ddpgo: $(../../scripts/netlab.sh mpirun -- "$dir/digitscnn" -backend mpi "${args[@]}" | grep 'median step')"
		else
			out+=$'\n'"ddpgo: $("${mpirun[@]}" -np "${1#mpi-}" "$dir/digitscnn" -backend mpi "${args[@]}" | grep 'median step')"
		fi
		;;
	esac
	echo "$out" | sed "s/^/round $r $1 /" >&2
	base=$(echo "$out" | grep '^plain:' | numbers | cut -d, -f1)
	echo "$base,$(echo "$out" | grep '^ddpgo:' | numbers)"
}

results=$dir/results.csv
for r in $(seq "$rounds"); do
	for c in "${configs[@]}"; do
		echo "$c,$(run "$c")" >>"$results"
	done
done

median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
col() { grep "^$1," "$results" | cut -d, -f"$2" | median; }

echo "model $model, global batch $batch, $steps steps ($warmup untimed) a run, $rounds rounds; medians over the rounds"
echo "| configuration | plain GoMLX ms | ddptrain ms | ratio | graph ms | hand-off ms | reduction ms | optimizer ms | hand-off+reduction, rank 0 | on the last to arrive |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
	ratio=$(grep "^$c," "$results" | awk -F, '{printf "%.3f\n", $3 / $2}' | median)
	echo "| $c | $(col "$c" 2) | $(col "$c" 3) | ${ratio}x | $(col "$c" 4) | $(col "$c" 5) | $(col "$c" 6) | $(col "$c" 7) | $(col "$c" 8)% | $(col "$c" 9)% |"
done
