#!/usr/bin/env bash
# compare.sh runs ddpgo's speed measurements and the peer baselines of
# scripts/peers (memory roofline, Open MPI, PyTorch gloo, numpy, PyTorch
# DDP) in one session on one machine, writes every raw result under
# results/ (or $OUT) and prints the rows of the README's results table.
# Speed goals are ratios between numbers taken in the same run: these
# machines are shared and noisy, so never compare with another day's file.
#
# Needs (Debian): python3-torch python3-numpy openmpi-bin libopenmpi-dev
# gcc; `make peers-deps` installs them.
#
# Usage: scripts/compare.sh
# ROUNDS (default 5) is the number of interleaved rounds of the
# process-against-process rows. PARTS=allreduce runs only what the
# all-reduce's goals need (docs/lab/small-messages.md): the ResNet-50 step
# against gloo's flat all-reduce, the all-reduce against Open MPI's C loop
# with 2, 3 and 4 processes, and the loaded rounds; the full run
# (PARTS=all, the default) runs those too. BASELINE=REV (a git revision)
# also builds that revision's mpi.test, inproc.test and ddpbench and runs
# them in the same interleaved rounds, each right after this tree's: the
# before and after of a change, which the summary prints with each ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
peers=$(pwd)/scripts/peers
out=${OUT:-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The files the rounds append to start empty: a reused directory would
# otherwise hold an earlier run's rows, which the summary would read first.
rm -f "$out/mpi_sweep.csv" "$out/mpi_sweep.txt" "$out/mpi_interleaved.csv" "$out/mpi_interleaved.txt" "$out"/mpi_resnet50_r*.json "$out"/ddp_step_f_r*.csv "$out/go_inproc_loaded.txt"
work=$(mktemp -d)
py=/usr/bin/python3
rounds=${ROUNDS:-5}
parts=${PARTS:-all}
case $parts in all | allreduce) ;; *)
	echo "compare: PARTS=$parts: want all or allreduce" >&2
	exit 2
	;;
esac

step() { printf '\n== %s\n$ %s\n' "$1" "$2" >&2; }

base=${BASELINE:-}
rm -f "$out"/mpi_resnet50_base_r*.json "$out/go_inproc_ab_new.txt" "$out/go_inproc_ab_base.txt"
if [ -n "$base" ]; then
	step "the baseline, $base" "git archive $base | tar -x; go test -c ./inproc/; go test -c -tags mpi ./mpi/; go build -tags mpi ./cmd/ddpbench"
	mkdir "$work/base"
	git archive "$base" | tar -x -C "$work/base"
	(cd "$work/base" && go test -c -o "$work/base-inproc.test" ./inproc/)
	if pkg-config --exists ompi-c 2>/dev/null; then
		(cd "$work/base" && go test -c -tags mpi -o "$work/base-mpi.test" ./mpi/ && go build -tags mpi -o "$work/base-ddpbench-mpi" ./cmd/ddpbench)
	fi
	# In process: the engine's own rows, 2 ranks in place, this tree's
	# binary and the baseline's alternately.
	go test -c -o "$work/inproc.test" ./inproc/
	step "inproc all_reduce against the baseline, $rounds interleaved rounds" "inproc.test -test.bench 'AllReducePerRank/float32/2ranks/^4KiB\$' -test.benchtime 20000x; -test.bench 'AllReduce/float32/2ranks/64MiB\$' -test.benchtime 20x"
	for round in $(seq "$rounds"); do
		for side in new base; do
			bin="$work/inproc.test"
			if [ $side = base ]; then bin="$work/base-inproc.test"; fi
			"$bin" -test.run '^$' -test.bench 'AllReducePerRank/float32/2ranks/^4KiB$' -test.benchtime 20000x >> "$out/go_inproc_ab_$side.txt"
			"$bin" -test.run '^$' -test.bench 'AllReduce/float32/2ranks/64MiB$' -test.benchtime 20x >> "$out/go_inproc_ab_$side.txt"
		done
	done
fi

# The loaded rounds' load: two CPU-bound processes beside both sides, as a
# CPU backward or another job would be, started before and stopped after
# each side's launches of a round alike.
loadpids=()
load_on() {
	for _ in 1 2; do
		bash -c 'while :; do :; done' &
		loadpids+=($!)
	done
}
load_off() {
	if [ ${#loadpids[@]} -gt 0 ]; then
		kill "${loadpids[@]}" 2>/dev/null || true
		wait "${loadpids[@]}" 2>/dev/null || true
	fi
	loadpids=()
}
trap 'load_off; rm -rf "$work"' EXIT

if [ "$parts" = all ]; then
	step "memory roofline" "gcc -O3 -march=native -pthread -o memcpy_bw scripts/peers/memcpy_bw.c && ./memcpy_bw memcpy_bw.csv"
	gcc -O3 -march=native -pthread -o "$work/memcpy_bw" "$peers/memcpy_bw.c"
	"$work/memcpy_bw" "$out/memcpy_bw.csv" > "$out/memcpy_bw.txt"

	step "Open MPI MPI_Allreduce, 2 ranks" "scripts/peers/run_mpi.sh mpi_allreduce.csv"
	bash "$peers/run_mpi.sh" "$out/mpi_allreduce.csv" > "$out/mpi_allreduce.txt" 2>&1

	step "PyTorch gloo all_reduce, 2 ranks" "python3 scripts/peers/gloo_allreduce.py --out gloo.csv"
	$py "$peers/gloo_allreduce.py" --out "$out/gloo_allreduce.csv" > "$out/gloo_allreduce.txt" 2>&1

	step "numpy float32<->float16" "python3 scripts/peers/fp16_convert.py --out fp16.csv"
	$py "$peers/fp16_convert.py" --out "$out/fp16_convert.csv" > "$out/fp16_convert.txt" 2>&1

	step "PyTorch DDP ResNet-50 step, 2 ranks" "python3 scripts/peers/ddp_step.py --out ddp_step.csv"
	$py "$peers/ddp_step.py" --out "$out/ddp_step.csv" > "$out/ddp_step.txt" 2>&1

	step "ddpgo fp16 kernels" "go test -run '^\$' -bench 'Float32ToHalf\$|HalfToFloat32\$|Copy\$' -benchtime 20x -count 5 ./fp16/"
	go test -run '^$' -bench 'Float32ToHalf$|HalfToFloat32$|Copy$' -benchtime 20x -count 5 ./fp16/ > "$out/go_fp16.txt"

	step "ddpgo CommPool" "go test -run '^\$' -bench 'GetPut\$|Mmap' -count 5 ./allocator/"
	go test -run '^$' -bench 'GetPut$|Mmap' -count 5 ./allocator/ > "$out/go_allocator.txt"

	step "ddpgo inproc all_reduce, 2 ranks" "go test -run '^\$' -bench 'AllReduce/float32/2ranks/(4KiB|64MiB)' -benchtime 300ms -count 10 ./inproc/"
	go test -run '^$' -bench 'AllReduce/float32/2ranks/(4KiB|64MiB)' -benchtime 300ms -count 10 ./inproc/ > "$out/go_inproc.txt"

	go build -o "$work/ddpbench" ./cmd/ddpbench
	step "ddpbench ResNet-50 step, 2 ranks" "ddpbench run --steps 40 --compute none --format json"
	"$work/ddpbench" run --steps 40 --compute none --format json > "$out/ddpbench_resnet50.json"
	step "ddpbench ResNet-50 step, fp16" "ddpbench run --steps 40 --compute none --compression fp16 --format json"
	"$work/ddpbench" run --steps 40 --compute none --compression fp16 --format json > "$out/ddpbench_resnet50_fp16.json"
	step "ddpbench ResNet-50 step, compute sleep 10ms" "ddpbench run --steps 40 --compute sleep --compute-time 10ms --format json"
	"$work/ddpbench" run --steps 40 --compute sleep --compute-time 10ms --format json > "$out/ddpbench_resnet50_sleep.json"
	step "ddpbench collective" "ddpbench collective -b 4K -e 256M -f 4"
	"$work/ddpbench" collective -b 4K -e 256M -f 4 > "$out/ddpbench_collective.txt"
fi

# Process against process: ddpgo over Open MPI, 2 ranks under mpirun, where
# Open MPI's development files are installed (the peers above need them too).
if pkg-config --exists ompi-c 2>/dev/null && command -v mpirun >/dev/null; then
	go build -tags mpi -o "$work/ddpbench-mpi" ./cmd/ddpbench
	mr=(mpirun --oversubscribe -np 2 --mca btl self,vader --mca oob_tcp_if_include lo -x MALLOC_ARENA_MAX=1)
	if [ "$(id -u)" = 0 ]; then mr+=(--allow-run-as-root); fi
	# The step against gloo's flat all-reduce (row f), launch for launch:
	# rounds of a ddpbench launch and a ddp_step.py launch of row f alone;
	# each side is quoted at its median over the rounds.
	step "ddpbench over MPI, ResNet-50 step, 2 processes, against gloo's row f, $rounds interleaved rounds" "${mr[*]} ddpbench run --backend mpi --steps 40 --compute none --format json; python3 scripts/peers/ddp_step.py --only f"
	for round in $(seq "$rounds"); do
		"${mr[@]}" "$work/ddpbench-mpi" run --backend mpi --steps 40 --compute none --format json > "$out/mpi_resnet50_r$round.json"
		if [ -n "$base" ]; then
			"${mr[@]}" "$work/base-ddpbench-mpi" run --backend mpi --steps 40 --compute none --format json > "$out/mpi_resnet50_base_r$round.json"
		fi
		$py "$peers/ddp_step.py" --only f --out "$out/ddp_step_f_r$round.csv" > "$out/ddp_step_f_r$round.txt" 2>&1
	done
	if [ "$parts" = all ]; then
		cp "$out/mpi_resnet50_r1.json" "$out/mpi_resnet50.json"
		step "ddpbench over MPI, fp16" "... --compression fp16"
		"${mr[@]}" "$work/ddpbench-mpi" run --backend mpi --steps 40 --compute none --compression fp16 --format json > "$out/mpi_resnet50_fp16.json"
		step "ddpbench over MPI, compute sleep 30ms" "... --compute sleep --compute-time 30ms"
		"${mr[@]}" "$work/ddpbench-mpi" run --backend mpi --steps 40 --compute sleep --compute-time 30ms --format json > "$out/mpi_resnet50_sleep.json"
		# The cap that suits overlap is the sweep's to find: the tail a step
		# cannot hide is the last bucket and whatever waits before it.
		step "ddpbench over MPI, bucket sweep with 30 ms of sleep" "${mr[*]} ddpbench sweep --backend mpi --caps 5,10,25 --steps 30 --compute sleep --compute-time 30ms --format json"
		"${mr[@]}" "$work/ddpbench-mpi" sweep --backend mpi --caps 5,10,25 --steps 30 --compute sleep --compute-time 30ms --format json > "$out/mpi_resnet50_sleep_sweep.json"
	fi
	bytes=4096,65536,1048576,4194304,16777216,67108864,268435456
	# The all-reduce against Open MPI's own C loop, timed alike (every call
	# timed, the median over calls of the slowest rank), in three
	# interleaved rounds: on a shared VM the speed of two processes moves
	# by 2x within minutes, so figures taken minutes apart do not compare.
	# ddpgo's rows are the backend as ddp and ddpbench use it: buffers from
	# its shared memory (-mpi.sweep=shared); one launch a round also runs
	# it on other memory, through MPI_Allreduce (DDPGO_MPI_SHM=0).
	step "ddpgo over MPI against Open MPI's C loop, interleaved, $rounds rounds" "go test -c -tags mpi ./mpi/; ${mr[*]} mpi.test -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=$bytes; ... -x DDPGO_MPI_SHM=0 ... -mpi.sweep=blocking; mpirun ... mpi_allreduce (vader, vader_tuned)"
	go test -c -tags mpi -o "$work/mpi.test" ./mpi/
	mpicc -O2 -o "$work/mpi_allreduce" "$peers/mpi_allreduce.c"
	cmr=(mpirun --oversubscribe -np 2 --mca btl self,vader --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -x BENCH_BUDGET_S=0.3)
	if [ "$(id -u)" = 0 ]; then cmr+=(--allow-run-as-root); fi
	# Each side gets the same two launches a round, plain and with glibc's
	# thresholds raised (Open MPI's vader and vader_tuned): a launch on this
	# VM sometimes runs at a fraction of the usual speed throughout, on
	# either side, and each side's figure for the round is its better one.
	tuned=(-x MALLOC_MMAP_THRESHOLD_=4294967296 -x MALLOC_TRIM_THRESHOLD_=4294967296)
	for round in $(seq "$rounds"); do
		"${mr[@]}" "$work/mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=$bytes \
			-mpi.label="_r$round" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		"${mr[@]}" "${tuned[@]}" "$work/mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=$bytes \
			-mpi.label="_tuned_r$round" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		if [ -n "$base" ]; then
			"${mr[@]}" "$work/base-mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=$bytes \
				-mpi.label="_base_r$round" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
			"${mr[@]}" "${tuned[@]}" "$work/base-mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=$bytes \
				-mpi.label="_tuned_base_r$round" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		fi
		"${mr[@]}" -x DDPGO_MPI_SHM=0 "$work/mpi.test" -test.run TestSweep -mpi.sweep=blocking -mpi.budget=1s -mpi.bytes=$bytes \
			-mpi.label="_r$round" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		"${cmr[@]}" "$work/mpi_allreduce" "$out/mpi_interleaved.csv" "vader_r$round" >> "$out/mpi_interleaved.txt"
		"${cmr[@]}" "${tuned[@]}" "$work/mpi_allreduce" "$out/mpi_interleaved.csv" "vader_tuned_r$round" >> "$out/mpi_interleaved.txt"
	done
	# 3 and 4 processes on the same cores (oversubscribed beyond 2), one
	# interleaved round each.
	for np in 3 4; do
		step "ddpgo over MPI against Open MPI's C loop, $np processes" "same, with -np $np"
		"${mr[@]}" -np $np "$work/mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=$bytes \
			-mpi.label="_np$np" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		"${mr[@]}" -np $np "${tuned[@]}" "$work/mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=$bytes \
			-mpi.label="_tuned_np$np" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		"${cmr[@]}" -np $np "$work/mpi_allreduce" "$out/mpi_interleaved.csv" "vader_np$np" >> "$out/mpi_interleaved.txt"
		"${cmr[@]}" -np $np "${tuned[@]}" "$work/mpi_allreduce" "$out/mpi_interleaved.csv" "vader_tuned_np$np" >> "$out/mpi_interleaved.txt"
	done
	# Under load: two CPU-bound processes (load_on) beside both sides, the
	# same in every launch of a round. In process: the inproc backend's
	# 4 KiB all-reduce (goroutines), against Open MPI's processes as
	# before; across processes: the 4 KiB rows of the rounds above.
	step "4 KiB all-reduce with two CPU-bound processes beside, $rounds interleaved rounds" "inproc.test -test.bench 'AllReduce/float32/2ranks/4KiB\$'; ${mr[*]} mpi.test ... -mpi.bytes=4096; mpirun ... -x BENCH_MAX_BYTES=4096 mpi_allreduce (vader, vader_tuned); each with load_on"
	if [ ! -x "$work/inproc.test" ]; then go test -c -o "$work/inproc.test" ./inproc/; fi
	for round in $(seq "$rounds"); do
		load_on
		"$work/inproc.test" -test.run '^$' -test.bench 'AllReduce/float32/2ranks/4KiB$' -test.benchtime 300ms -test.count 3 >> "$out/go_inproc_loaded.txt"
		"${mr[@]}" "$work/mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=4096 \
			-mpi.label="_loaded_r$round" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		"${mr[@]}" "${tuned[@]}" "$work/mpi.test" -test.run TestSweep -mpi.sweep=shared -mpi.budget=1s -mpi.bytes=4096 \
			-mpi.label="_tuned_loaded_r$round" -mpi.csv="$out/mpi_sweep.csv" >> "$out/mpi_sweep.txt"
		"${cmr[@]}" -x BENCH_MAX_BYTES=4096 "$work/mpi_allreduce" "$out/mpi_interleaved.csv" "vader_loaded_r$round" >> "$out/mpi_interleaved.txt"
		"${cmr[@]}" -x BENCH_MAX_BYTES=4096 "${tuned[@]}" "$work/mpi_allreduce" "$out/mpi_interleaved.csv" "vader_tuned_loaded_r$round" >> "$out/mpi_interleaved.txt"
		load_off
	done
	if [ "$parts" = all ]; then
		step "ddpbench collective over MPI, small and large" "${mr[*]} ddpbench collective --backend mpi -b 4K -e 1M -f 16 -n 2000 -w 100 -a 3 --format csv; -b 64M -e 64M -n 30 -w 5"
		"${mr[@]}" "$work/ddpbench-mpi" collective --backend mpi -b 4K -e 1M -f 16 -n 2000 -w 100 -a 3 --format csv > "$out/mpi_collective.csv"
		"${mr[@]}" "$work/ddpbench-mpi" collective --backend mpi -b 64M -e 64M -n 30 -w 5 -a 3 --format csv | tail -n +2 >> "$out/mpi_collective.csv"
	fi
else
	echo "compare: Open MPI not found (pkg-config ompi-c, mpirun): no process-against-process rows" >&2
fi

go run ./scripts/summarize "$out"
