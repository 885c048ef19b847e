#!/usr/bin/env bash
# bench.sh: the step-time figures of docs/gomlx.md.
#
#   integrations/gomlx/scripts/bench.sh [cnn|mlp] [ROUNDS]
#
# Builds examples/digitscnn with the mpi tag and runs, ROUNDS times in
# turn (so that a slow patch of a shared machine falls on every
# configuration alike), each configuration for a fixed number of steps:
# plain GoMLX (train.Trainer, one process), ddptrain over 1, 2 and 4
# inproc ranks, ddptrain over 1, 2 and 4 processes under mpirun, and 2
# inproc ranks that mark every gradient ready at the end of the hand-off.
# The global batch is the same in every configuration (the ranks split
# it). Each run prints the medians of its timed steps; this script prints
# every run's line to stderr and, per configuration, the median over the
# rounds of those medians: the step and its parts (graph, hand-off,
# reduction, optimizer) in ms and the hand-off and reduction's share of
# the step, on rank 0 (whose reduction includes waiting for slower ranks)
# and on the rank that reached each step's all-reduces last. Needs Open
# MPI (make mpi-deps).
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

configs=("plain" "inproc-1" "inproc-2" "inproc-4" "mpi-1" "mpi-2" "mpi-4" "inproc-2-ready-all")

run() {
	case $1 in
	plain) "$dir/digitscnn" -plain "${args[@]}" ;;
	inproc-2-ready-all) "$dir/digitscnn" -ranks 2 -ready-batch 1000 "${args[@]}" ;;
	inproc-*) "$dir/digitscnn" -ranks "${1#inproc-}" "${args[@]}" ;;
	mpi-*) "${mpirun[@]}" -np "${1#mpi-}" "$dir/digitscnn" -backend mpi "${args[@]}" ;;
	esac
}

# The numbers of a run's line: step, graph, hand-off, reduction,
# optimizer (ms), the share of rank 0 and that of the rank that arrived
# last (%; 0 for plain GoMLX).
numbers() {
	sed -n 's/.*median step \([0-9.]*\) ms; graph \([0-9.]*\) ms, hand-off \([0-9.]*\) ms, reduction \([0-9.]*\) ms, optimizer \([0-9.]*\) ms; hand-off+reduction \([0-9.]*\)% of the step\(, \([0-9.]*\)% on the rank that arrived last\)\{0,1\}$/\1,\2,\3,\4,\5,\6,\8/p'
}

results=$dir/results.csv
for r in $(seq "$rounds"); do
	for c in "${configs[@]}"; do
		line=$(run "$c" | grep 'median step')
		echo "round $r $c: $line" >&2
		echo "$c,$(echo "$line" | numbers)" >>"$results"
	done
done

median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

echo "model $model, global batch $batch, $steps steps ($warmup untimed) a run, $rounds rounds; medians over the rounds"
echo "| configuration | step ms | graph ms | hand-off ms | reduction ms | optimizer ms | hand-off+reduction, rank 0 | on the last to arrive |"
echo "|---|---|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
	row="| $c"
	for col in 2 3 4 5 6; do
		row+=" | $(grep "^$c," "$results" | cut -d, -f$col | median)"
	done
	echo "$row | $(grep "^$c," "$results" | cut -d, -f7 | median)% | $(grep "^$c," "$results" | cut -d, -f8 | sed 's/^$/0/' | median)% |"
done
