#!/usr/bin/env bash
# gpu-check.sh: the NCCL backend's checks on a machine with NVIDIA GPUs.
#
#   make gpu-check-bin                 # here, with Go: builds bin/gpu-check/
#   scripts/gpu-check.sh               # there, from the repository root
#   scripts/gpu-check.sh --standin     # anywhere with gcc: the same checks
#                                      # over ddpgo's stand-in (no GPU)
#
# The GPU machine needs no Go: it runs the binaries built here (the nccl
# package's test binary and ddpbench), the CUDA driver's libcuda.so.1 and
# NCCL's libnccl.so.2 (DDPGO_NCCL_LIBRARY, else pip's nvidia-nccl package
# found through python3, else the loader's path). It prints one line per
# check (PASS, FAIL or SKIP and what was checked) and a count of failures,
# and exits 1 if any check failed. BIN (default bin/gpu-check) holds the
# binaries; OUT, when set, receives the logs. Under five minutes on one
# H100.
#
# The checks:
#   loaded      nothing loaded is the stand-in (with --standin: everything
#               is, and the output says so)
#   ptxas       kernels.ptx assembles for the device's architecture with
#               warnings as errors, where ptxas is installed
#   nccl/...    the nccl package's tests in device mode (DDPGO_NCCL_DEVICE):
#               the PTX kernels bit for bit against package fp16, every
#               collective, dtype and op on device and host memory with
#               every element checked, the conformance suite, issue order
#               on the stream after a collective, Abort and Close, the
#               Reducer on device memory; groups larger than the device
#               count skip, as do tests that need the stand-in's controls
#   collective  ddpbench collective --backend nccl for every operation,
#               every element checked
#   run         ddpbench run --backend nccl without compression, with fp16
#               and with bf16: the averaged gradients checked at the first
#               measured step
#   2 processes ddpbench run (fp16) and collective as two processes launched
#               torchrun's way; on one GPU they pass for two hosts
#               (NCCL_HOSTID) and meet over NCCL's socket transport, so the
#               averages are two ranks' and nearly every enqueue answers
#               ncclInProgress, as on a cluster; the collective once with
#               NCCL_RUNTIME_CONNECT=0 and once with 1, and every size it
#               asked for present in its output
#   2 processes, nccl.test   the nccl package's scenarios as two processes
#               (TestTwoProcesses): a peer killed before its first
#               collective and another mid-run (the survivor fails within
#               Timeout + AbortDrain, a short Wait returns at its deadline,
#               Close returns), issue order and groups on device memory, two
#               communicators per process driven from goroutines that move
#               between OS threads; the average settle of ncclInProgress
#   abort under kernels  Abort while twenty thousand kernels hold the stream,
#               then the device pool closed (nccl/TestAbortWhileKernelsRun)
#   telemetry   gpu_telemetry (NVML) present and non-zero in ddpbench's run
#               and collective JSON
#   NCCL WARN   NCCL's WARN lines in every rank's output; one naming misuse
#               of the API fails the check
set -uo pipefail
cd "$(dirname "$0")/.."

standin=0
[ "${1:-}" = --standin ] && standin=1
BIN=${BIN:-bin/gpu-check}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
fails=0
checks=0

# smi ARGS: nvidia-smi's output, or nothing where it is missing or fails
# (installed without a loaded driver it prints its error on stdout).
smi() {
	local out
	command -v nvidia-smi >/dev/null && out=$(nvidia-smi "$@" 2>/dev/null) && printf '%s\n' "$out"
}

result() { # result PASS|FAIL|SKIP name detail
	checks=$((checks + 1))
	[ "$1" = FAIL ] && fails=$((fails + 1))
	printf '%-4s  %-44s %s\n' "$1" "$2" "$3"
}

# Where Go is, (re)build the binaries from this tree; elsewhere they must
# have come with it.
if command -v go >/dev/null; then
	make --no-print-directory gpu-check-bin BIN="$BIN" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
elif [ ! -x "$BIN/nccl.test" ] || [ ! -x "$BIN/ddpbench" ]; then
	echo "gpu-check: $BIN/nccl.test and $BIN/ddpbench are missing and there is no Go here: run make gpu-check-bin where Go is, and bring $BIN" >&2
	exit 2
fi
BIN=$(cd "$BIN" && pwd)

if [ "$standin" = 1 ]; then
	si=$(mktemp -d)
	trap 'rm -rf "$si"' EXIT
	"${CC:-gcc}" -O1 -fvisibility=hidden -shared -fPIC -o "$si/libstandin.so" nccl/testdata/standin/standin.c -lpthread || exit 1
	ln -s libstandin.so "$si/libnccl.so.2"
	ln -s libstandin.so "$si/libcuda.so.1"
	export DDPGO_NCCL_LIBRARY=$si/libnccl.so.2 DDPGO_CUDA_LIBRARY=$si/libcuda.so.1 DDPGO_NCCL_DEVICE=standin
else
	if [ -z "${DDPGO_NCCL_LIBRARY:-}" ]; then
		d=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
		[ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && export DDPGO_NCCL_LIBRARY=$d/libnccl.so.2
	fi
	export DDPGO_NCCL_DEVICE=1
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
[ -d /usr/local/cuda/bin ] && PATH=$PATH:/usr/local/cuda/bin

echo "# ddpgo GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
[ "$standin" = 1 ] && echo "# STAND-IN: ddpgo's test stand-in for libnccl.so.2 and libcuda.so.1 (--standin); nothing here runs on a GPU"
smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | sed 's/^/# GPU /'
"$BIN/ddpbench" info >"$OUT/info.txt" 2>&1
sed -n '/^  nccl/,/^GPUs/p' "$OUT/info.txt" | sed 's/^/# /'

# loaded: ddpbench's view of the library (the test binary checks its own).
if [ "$standin" = 1 ]; then
	grep -q 'STAND-IN' "$OUT/info.txt" && result PASS loaded "the stand-in, as --standin asks" || result FAIL loaded "--standin, but ddpbench info does not name the stand-in"
elif grep -q 'STAND-IN' "$OUT/info.txt"; then
	result FAIL loaded "ddpbench info reports the stand-in ($DDPGO_NCCL_LIBRARY)"
elif grep -q 'nccl     built' "$OUT/info.txt" && grep -A1 '^  nccl' "$OUT/info.txt" | grep -q 'usable'; then
	result PASS loaded "$(grep -A1 '^  nccl' "$OUT/info.txt" | tail -1 | sed 's/^ *usable: *//' | cut -c1-90)"
else
	result FAIL loaded "ddpbench info: $(grep -A1 '^  nccl' "$OUT/info.txt" | tail -1 | cut -c1-120)"
fi

# ptxas: the architecture of device 0, else sm_90.
arch=$(smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
case $arch in '' | *[!0-9]*) arch=90 ;; esac
arch=sm_$arch
if command -v ptxas >/dev/null; then
	if ptxas --warning-as-error -arch="$arch" -o "$OUT/kernels.cubin" nccl/kernels.ptx >"$OUT/ptxas.log" 2>&1; then
		result PASS "ptxas $arch" "$(ptxas --version | tail -1)"
	else
		result FAIL "ptxas $arch" "$(head -3 "$OUT/ptxas.log" | tr '\n' ' ')"
	fi
else
	result SKIP "ptxas $arch" "ptxas not installed"
fi

# The nccl package's tests in device mode, from the package directory
# (they read testdata/ there).
(cd nccl && timeout 240 "$BIN/nccl.test" -test.v -test.count=1 -test.timeout 230s) >"$OUT/nccl-test.log" 2>&1
rc=$?
# One line per test and per first-level subtest (a failure deeper down
# fails its parents too).
while read -r verdict name secs; do
	case $verdict in PASS:) v=PASS ;; FAIL:) v=FAIL ;; SKIP:) v=SKIP ;; *) continue ;; esac
	case $name in */*/*) continue ;; esac
	why=$secs
	# A skip's reason is the first log line after the test's "=== RUN".
	[ "$v" = SKIP ] && why=$(awk -v n="$name" '$1 == "===" && $2 == "RUN" { on = ($3 == n); next } on && /^ +[a-z_]+\.go:[0-9]+: / { sub(/^ +[a-z_]+\.go:[0-9]+: /, ""); print; exit }' "$OUT/nccl-test.log" | cut -c1-90)
	result "$v" "nccl/$name" "$why"
done < <(grep -E -- '^ *--- (PASS|FAIL|SKIP): ' "$OUT/nccl-test.log" | sed 's/^ *--- //')
if [ "$rc" != 0 ] && ! grep -qE -- '--- FAIL' "$OUT/nccl-test.log"; then
	result FAIL nccl.test "exit status $rc without a failed test: $(grep -E 'panic|timed out|SIGSEGV' "$OUT/nccl-test.log" | head -2 | tr '\n' ' ')"
fi

ranks=$(smi -L | grep -c '^GPU ')
maxbytes=256M
steps=20
[ "$standin" = 1 ] && ranks=2 maxbytes=1M steps=3
[ "${ranks:-0}" -ge 1 ] || ranks=1

# ddpbench collective: every operation, every element checked.
for spec in allreduce:float allreduce:half allreduce:bfloat16 allgather:float reducescatter:bfloat16 broadcast:float reduce:float; do
	op=${spec%%:*} dt=${spec#*:}
	{
		name="collective $op $dt"
		if timeout 120 "$BIN/ddpbench" collective --backend nccl --ranks "$ranks" --collective "$op" -d "$dt" -b 8 -e "$maxbytes" -f 8 -n 5 -w 2 --check 1 \
			--format json >"$OUT/coll-$op-$dt.json" 2>"$OUT/coll-$op-$dt.err"; then
			wrong=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["wrong"], round(max(r["out_of_place"]["algbw_gbs"] for r in j["rows"]), 1))' "$OUT/coll-$op-$dt.json" 2>/dev/null)
			set -- $wrong
			if [ "${1:-x}" = 0 ]; then
				result PASS "$name" "$ranks rank(s), 8 B-$maxbytes, 0 wrong; peak algbw ${2:-?} GB/s"
			else
				result FAIL "$name" "wrong elements: ${1:-unreadable output}"
			fi
		else
			result FAIL "$name" "exit $?: $(tail -2 "$OUT/coll-$op-$dt.err" | tr '\n' ' ' | cut -c1-120)"
		fi
	}
done

# ddpbench run: ResNet-50's gradients, averages checked.
for comp in none fp16 bf16; do
	name="run resnet50 --compression $comp"
	if timeout 120 "$BIN/ddpbench" run --backend nccl --ranks "$ranks" --compression "$comp" --steps "$steps" --warmup 5 \
		--format json >"$OUT/run-$comp.json" 2>"$OUT/run-$comp.err"; then
		step=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); l=j.get("nccl_launches") or {}; print(round(j["step_ms"]["median"],2), round(j["comm_ms"]["median"],3), l.get("launches","?"), l.get("in_progress","?"))' "$OUT/run-$comp.json" 2>/dev/null)
		set -- $step
		result PASS "$name" "$ranks rank(s): averages right; step ${1:-?} ms, communication ${2:-?} ms (medians of $steps); ${4:-?} of ${3:-?} launches answered ncclInProgress"
	else
		result FAIL "$name" "exit $?: $(tail -2 "$OUT/run-$comp.err" | tr '\n' ' ' | cut -c1-120)"
	fi
done

# Two processes on one GPU: NCCL refuses two ranks of one communicator on
# one device, unless they seem to be on two hosts (NCCL_HOSTID differs);
# then they talk over NCCL's socket transport on loopback, and every
# enqueue goes through NCCL's group job (ncclInProgress), as on a cluster.
# The averages are then of two ranks' gradients. Where the machine has
# two GPUs or more, each process gets its own.
twoproc() { # twoproc NAME PROGRAM ARGS...: runs PROGRAM ARGS as ranks 0 and 1; rc0, rc1: their exit statuses
	local name=$1
	shift
	local port=$((29500 + RANDOM % 500)) pids=() r
	for r in 0 1; do
		local dev=0
		[ "$ranks" -ge 2 ] && dev=$r
		RANK=$r WORLD_SIZE=2 LOCAL_RANK=$dev LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
			NCCL_HOSTID=ddpgo-gpu-check-$r NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
			timeout 90 "$@" >"$OUT/$name-$r.out" 2>"$OUT/$name-$r.err" &
		pids+=($!)
	done
	wait "${pids[0]}"
	rc0=$?
	wait "${pids[1]}"
	rc1=$?
	[ "$rc0" = 0 ] && [ "$rc1" = 0 ]
}
why2() { # why2 NAME: the last lines of both ranks' stderr
	tail -2 "$OUT/$1-0.err" "$OUT/$1-1.err" 2>/dev/null | tr '\n' ' ' | cut -c1-200
}
if [ "$standin" = 1 ]; then
	for name in "run resnet50 --compression fp16" "collective allreduce float, NCCL_RUNTIME_CONNECT=0" "collective allreduce float, NCCL_RUNTIME_CONNECT=1" \
		"nccl.test dead-at-setup" "nccl.test dead-mid-run" "nccl.test order" "nccl.test threads"; do
		result SKIP "2 processes: $name" "the stand-in's ranks meet only inside one process"
	done
else
	if twoproc run2 "$BIN/ddpbench" run --backend nccl --compression fp16 --steps 10 --warmup 3 --format json; then
		step=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); l=j.get("nccl_launches") or {}; print(j["ranks"], round(j["step_ms"]["median"],1), round(j["comm_ms"]["median"],1), l.get("launches","?"), l.get("in_progress","?"))' "$OUT/run2-0.out" 2>/dev/null)
		set -- $step
		result PASS "2 processes: run resnet50 --compression fp16" "${1:-?} ranks: averages of 2 ranks right; step ${2:-?} ms, communication ${3:-?} ms; rank 0: ${5:-?} of ${4:-?} launches answered ncclInProgress"
	else
		result FAIL "2 processes: run resnet50 --compression fp16" "exit $rc0/$rc1: $(why2 run2)"
	fi
	# Connections made at the first collective (NCCL_RUNTIME_CONNECT=1,
	# NCCL's default from 2.22) and all at initialisation (0).
	for rc in 0 1; do
		name="2 processes: collective allreduce float, NCCL_RUNTIME_CONNECT=$rc"
		if NCCL_RUNTIME_CONNECT=$rc twoproc "coll2-rc$rc" "$BIN/ddpbench" collective --backend nccl --collective allreduce -b 8 -e 64M -f 8 -n 5 -w 2 --check 1 --format json; then
			got=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); r=j["rows"]; print(j["wrong"], j["ranks"], max(x["size_bytes"] for x in r), round(max(x["out_of_place"]["busbw_gbs"] for x in r), 2), round(min(x["out_of_place"]["time_us"] for x in r)))' "$OUT/coll2-rc$rc-0.out" 2>/dev/null)
			set -- $got
			if [ "${1:-x}" != 0 ]; then
				result FAIL "$name" "wrong elements: ${1:-unreadable output}"
			elif [ "${3:-0}" -lt $((64 << 20)) ]; then
				result FAIL "$name" "asked for 8 B-64 MiB, the rows stop at ${3:-?} bytes"
			else
				result PASS "$name" "${2:-?} ranks, 8 B-64 MiB, 0 wrong; peak busbw ${4:-?} GB/s, smallest ${5:-?} us (socket transport on loopback)"
			fi
		else
			result FAIL "$name" "exit $rc0/$rc1: $(why2 "coll2-rc$rc")"
		fi
	done
	# The nccl package's scenarios as two processes (nccl/procs_test.go).
	# In the dead-peer ones rank 1 kills itself with SIGKILL; rank 0 must
	# pass.
	for sc in dead-at-setup dead-mid-run order threads; do
		name="2 processes: nccl.test $sc"
		(cd nccl && DDPGO_NCCL_PROCS=$sc twoproc "procs-$sc" "$BIN/nccl.test" -test.run '^TestTwoProcesses$' -test.v -test.count=1 -test.timeout 85s)
		ok=$?
		settle=$(grep -ho 'answered ncclInProgress, settled in [^ ]* on average' "$OUT/procs-$sc-0.out" 2>/dev/null | head -1 | sed 's/answered ncclInProgress, //')
		case $sc in
		dead-*) grep -q -- '--- PASS: TestTwoProcesses' "$OUT/procs-$sc-0.out" && ok=0 ;;
		esac
		if [ "$ok" = 0 ]; then
			result PASS "$name" "${settle:-no launch answered ncclInProgress}"
		else
			result FAIL "$name" "$(grep -h -A2 -- '--- FAIL' "$OUT/procs-$sc-0.out" "$OUT/procs-$sc-1.out" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
		fi
	done
fi

# gpu_telemetry: NVML's figures in ddpbench's JSON, present and non-zero.
if [ "$standin" = 1 ]; then
	result SKIP telemetry "no NVML over the stand-in"
else
	tel=$(python3 - "$OUT"/run-*.json "$OUT"/coll-*.json <<'PY' 2>&1
import json, sys
bad, n = [], 0
for f in sys.argv[1:]:
    try:
        t = json.load(open(f)).get("gpu_telemetry") or {}
    except Exception as e:
        bad.append(f"{f}: {e}")
        continue
    n += 1
    peaks = [v.get("peak", 0) for v in (t.get("figures") or {}).values()]
    if not t.get("samples") or not any(peaks):
        bad.append(f.rsplit("/", 1)[-1])
print(n, len(bad), " ".join(bad)[:150])
PY
)
	set -- $tel
	if [ "${1:-0}" -gt 0 ] && [ "${2:-1}" = 0 ]; then
		result PASS telemetry "gpu_telemetry with samples and non-zero figures in $1 JSON outputs"
	else
		result FAIL telemetry "gpu_telemetry missing or zero: $tel"
	fi
fi

# NCCL's WARN lines, every rank's: one that names misuse of the API fails.
warns=$(cat "$OUT"/*.err "$OUT"/*.out "$OUT/nccl-test.log" 2>/dev/null | grep -a 'NCCL WARN' || true)
misuse=$(printf '%s\n' "$warns" | grep -aiE 'Attempt to use communicator|invalid usage|invalid argument|ncclInvalid|before the previous operation' | head -2 | tr '\n' ' ' | cut -c1-200)
nwarn=$(printf '%s' "$warns" | grep -ac 'NCCL WARN')
if [ -n "$misuse" ]; then
	result FAIL "NCCL WARN" "$nwarn WARN line(s), misuse among them: $misuse"
else
	result PASS "NCCL WARN" "$nwarn WARN line(s), none naming misuse"
fi

echo "# $checks checks, $fails failed (logs in $OUT)"
[ "$fails" = 0 ]
