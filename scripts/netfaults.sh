#!/usr/bin/env bash
# netfaults: faults over the network lab (scripts/netlab.sh), one scenario per target. Each runs
# `ddpbench run --backend mpi` as one rank per test host (2 hosts, 1 Gbit/s links), injects its
# fault a few steps in, and checks what the ranks and the job do:
#
#   restore  h1's link is cut for 4 s, then restored, before the deadline: the waiting ranks report
#            the stall every --stall-interval; training then continues and every step's average is
#            checked (ddpbench fails a run whose result is wrong); the job exits 0.
#   cut      h1's link is cut and stays cut: stall reports, then the ranks fail at --timeout; the
#            first to do so aborts the job (MPI_Abort, with the timeout as its message), which ends
#            (non-zero) instead of hanging.
#   stop     h1's rank is stopped (SIGSTOP): rank 0 reports the stall, fails at the deadline, and
#            the job ends.
#   kill     h1's rank is killed (SIGKILL): Open MPI's runtime ends the job promptly and says which
#            rank died.
#
# and, for the lab as Open MPI sees a cluster, one scenario without a fault:
#
#   nodes    2 hosts x 2 ranks, each host an Open MPI node (netlab.sh mpirun -N 2): every rank sees
#            itself as one of 2 ranks on its host, under the host's name, and a 3-step run of
#            ddpbench over 6 MiB (shared memory inside a host, TCP between) completes with every
#            step checked.
#
# and four on the hierarchical path (package comm/hier: each host reduces in shared memory, its
# shards cross the hosts over MPI), whose ranks are the mpi package's own test binary, each checking
# that its communicator is hierarchical:
#
#   hier       TestHierarchy on 2 hosts x 2 ranks, then on 3 + 1 (netlab.sh mpirun -N 3,1): every
#              collective, dtype, op and size, exact where the contract is, on buffers of the
#              communicator's memory, each rank on the lab host the layout names (hosts told apart
#              by Open, not named by the test).
#   hier-stop  TestHierarchyFault, 2 x 2: rank 3 stops itself (SIGSTOP) at the entry of the host's
#   hier-kill  phase of an all-reduce (its first collective in shared memory), then in a second job
#   hier-exit  at the entry of the network phase (its first over MPI between hosts); or is killed
#              (SIGKILL); or exits (status 0, MPI not ended). The level raises the fault itself (a
#              hook of the test binary), so it falls in the same phase on every run. stop: stall
#              reports, one naming the stopped rank (the job's number) and process, every other
#              rank's wait ends at its 3 s deadline, then rank 0 aborts the job. kill, exit: the job ends non-zero without
#              reaching the ranks' deadline, its output naming the process that ended. In every
#              job no other rank's all-reduce may complete.
#
#   netfaults.sh [SCENARIO...]      default: nodes, hier, hier-stop, hier-kill, hier-exit, restore,
#                                   cut, stop, kill
#
# MPI cannot say which rank a collective waits for, so the stall reports name the step and bucket,
# not the missing rank (inproc names it; see the README's reliability section). Needs what
# netlab.sh needs (root, ip netns, veth, tbf) and Open MPI's development files; `netlab.sh check`
# says whether this machine can run it. Exit status: 0 when every scenario behaved, 1 otherwise,
# 2 when the lab cannot run here (a message says why).
set -euo pipefail
cd "$(dirname "$0")/.."
lab=scripts/netlab.sh
STALL=1s
TIMEOUT=15

if ! "$lab" check >/dev/null 2>&1; then
	echo "netfaults: skipped: $("$lab" check 2>&1 | tail -n 1)" >&2
	exit 2
fi
if ! pkg-config --exists ompi-c 2>/dev/null || ! command -v mpirun >/dev/null; then
	echo "netfaults: skipped: Open MPI not found (pkg-config ompi-c, mpirun); make mpi-deps installs it" >&2
	exit 2
fi

if "$lab" status >/dev/null 2>&1; then
	echo "netfaults: skipped: a lab is up already, which this script would have to take down (netlab.sh down first)" >&2
	exit 2
fi
work=$(mktemp -d)
cleanup() {
	"$lab" down >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
go build -tags mpi -o "$work/ddpbench" ./cmd/ddpbench
# 8 M float32 gradients (32 MiB) in 4 buckets: about 0.3 s a step at 1 Gbit/s.
cat >"$work/model.json" <<'EOF'
{"model": "netfaults", "params": [
 {"name": "l0.weight", "shape": [2048, 1024]}, {"name": "l1.weight", "shape": [2048, 1024]},
 {"name": "l2.weight", "shape": [2048, 1024]}, {"name": "l3.weight", "shape": [2048, 1024]}]}
EOF
"$lab" up -n 2 -r 1gbit >/dev/null

# A job without a fault first: if the lab cannot carry an MPI job on this machine at all, that is
# a missing capability (skipped, exit 2), not a fault the scenarios could judge.
if ! timeout 120 "$lab" mpirun -x MALLOC_ARENA_MAX=1 -- "$work/ddpbench" run --backend mpi --model "$work/model.json" \
	--compute none --warmup 1 --steps 2 >"$work/sanity.log" 2>&1; then
	echo "netfaults: skipped: an MPI job without faults does not run over the lab here:" >&2
	tail -n 20 "$work/sanity.log" >&2
	exit 2
fi

failed=0
pass() { echo "netfaults: $1: ok: $2"; }
fail() {
	echo "netfaults: $1: FAILED: $2" >&2
	echo "---- job output ----" >&2
	cat "$work/$1.log" >&2
	echo "--------------------" >&2
	failed=1
}

# start SCENARIO STEPS: the job in the background, its output in $work/SCENARIO.log.
start() {
	"$lab" mpirun -x MALLOC_ARENA_MAX=1 -- "$work/ddpbench" run --backend mpi --model "$work/model.json" \
		--compute none --warmup 2 --steps "$2" --bucket-cap-mb 8 --timeout "${TIMEOUT}s" \
		--stall-interval "$STALL" >"$work/$1.log" 2>&1 &
	job=$!
	t0=$SECONDS
}

# finish: waits for the job, at most LIMIT seconds (then kills it: a hang), and sets rc.
finish() {
	local limit=$1
	while kill -0 "$job" 2>/dev/null && ((SECONDS - t0 < limit)); do sleep 0.2; done
	if kill -0 "$job" 2>/dev/null; then
		pkill -KILL -f "$work/" || true
		wait "$job" 2>/dev/null || true
		rc=hung
		return
	fi
	rc=0
	wait "$job" || rc=$?
}

# rank_pid HOST: the pid of the ddpbench rank running on HOST.
rank_pid() {
	local p
	for p in $(ip netns pids "${NETLAB_PREFIX:-ddplab}-$1"); do
		if [[ $(cat "/proc/$p/comm" 2>/dev/null) == ddpbench ]]; then
			echo "$p"
			return
		fi
	done
	return 1
}

# signal_h1 SCENARIO SIGNAL sends SIGNAL to the rank on h1 and sets pid; without such a process the
# scenario fails and signal_h1 returns 1.
signal_h1() {
	pid=$(rank_pid h1) || {
		fail "$1" "no ddpbench process on h1"
		finish 1
		return 1
	}
	kill "-$2" "$pid"
}

stalls() { grep -c "ddpbench: stall: " "$work/$1.log" || true; }

# deadline SCENARIO: the first line that reports a rank's deadline, shortened.
# Either the reducer's deadline (ddp's Wait, then Abort) or the backend's own (--timeout is also
# the mpi backend's deadline for every operation, such as the statistics exchange between steps).
deadline() { grep -m1 -Eo "mpi: rank [0-9].*timed out after [0-9.]*s|mpi: comm: collective timed out after [0-9.]*s: rank [0-9]+" "$work/$1.log" || true; }

scenario_restore() {
	start restore 30
	sleep 4
	"$lab" link h1 down >/dev/null
	sleep 4
	"$lab" link h1 up >/dev/null
	finish 90
	local n
	n=$(stalls restore)
	if [[ $rc != 0 ]]; then
		fail restore "exit status $rc, want 0 (the link came back before the ${TIMEOUT}s deadline)"
	elif ((n < 2)); then
		fail restore "$n stall reports during a 4 s cut at a $STALL interval, want at least 2"
	elif ! grep -q "step time" "$work/restore.log"; then
		fail restore "no results printed"
	else
		pass restore "$n stall reports during the cut; all 30 steps completed and checked; exit 0 after $((SECONDS - t0)) s"
	fi
}

# expect_deadline SCENARIO WHAT SINCE WHO: the job must have ended non-zero, not hung, after at least
# 2 stall reports and a line from WHO (a regular expression: the rank) saying that its collective
# timed out at the deadline. WHAT names the fault, SINCE is when it was injected.
expect_deadline() {
	local s=$1 what=$2 since=$3 who=$4 n took=$((SECONDS - $3))
	n=$(stalls "$s")
	if [[ $rc == hung ]]; then
		fail "$s" "the job was still running $((TIMEOUT + 60)) s after the $what: it hung"
	elif [[ $rc == 0 ]]; then
		fail "$s" "exit status 0 after the $what"
	elif ((n < 2)); then
		fail "$s" "$n stall reports, want at least 2 before the ${TIMEOUT}s deadline"
	elif ! grep -Eq "$who.*timed out after ${TIMEOUT}|timed out after ${TIMEOUT}[0-9.]*s: $who" "$work/$s.log"; then
		fail "$s" "no line from $who saying that its collective timed out after ${TIMEOUT}s"
	else
		pass "$s" "$n stall reports, then '$(deadline "$s")'; the job ended (status $rc) $took s after the $what"
	fi
}

scenario_cut() {
	start cut 1000
	sleep 4
	local cut=$SECONDS
	"$lab" link h1 down >/dev/null
	finish $((TIMEOUT + 60))
	"$lab" link h1 up >/dev/null
	expect_deadline cut cut "$cut" "rank [0-9]"
}

scenario_stop() {
	start stop 1000
	sleep 4
	local stopped=$SECONDS
	signal_h1 stop STOP || return
	finish $((TIMEOUT + 60))
	kill -CONT "$pid" 2>/dev/null || true
	expect_deadline stop stop "$stopped" "rank 0"
}

scenario_kill() {
	start kill 1000
	sleep 4
	local killed=$SECONDS
	signal_h1 kill KILL || return
	finish 60
	local took=$((SECONDS - killed))
	if [[ $rc == hung ]]; then
		fail kill "the job was still running 60 s after the kill: it hung"
	elif [[ $rc == 0 ]]; then
		fail kill "exit status 0 with a rank killed"
	elif ! grep -Eq "signal 9|Killed" "$work/kill.log"; then
		fail kill "the job's output does not say that a rank was killed"
	else
		pass kill "the job ended (status $rc) $took s after the kill: $(grep -Em1 "signal 9|Killed" "$work/kill.log" | sed 's/^ *//')"
	fi
}

scenario_nodes() {
	local p=${NETLAB_PREFIX:-ddplab} t0=$SECONDS want got
	rc=0
	# shellcheck disable=SC2016 # expanded by each rank's shell
	timeout 60 "$lab" mpirun -N 2 -- sh -c 'echo "$(hostname) $OMPI_COMM_WORLD_LOCAL_RANK/$OMPI_COMM_WORLD_LOCAL_SIZE"' \
		>"$work/nodes.log" 2>&1 || rc=$?
	want=$(printf '%s\n' "$p-h0 0/2" "$p-h0 1/2" "$p-h1 0/2" "$p-h1 1/2")
	got=$(grep -E "^$p-h[0-9]+ " "$work/nodes.log" | sort || true)
	if [[ $rc != 0 ]]; then
		fail nodes "a job of 2 hosts x 2 ranks ended with status $rc"
		return
	elif [[ $got != "$want" ]]; then
		fail nodes "the ranks' hosts and local ranks are '$(paste -sd, <<<"$got")', want '$(paste -sd, <<<"$want")'"
		return
	fi
	# 6 MiB of gradients: all-reduces above and below the backend's 1 MiB threshold between hosts,
	# a few seconds even on two busy cores.
	cat >"$work/nodes.json" <<'EOF'
{"model": "nodes", "params": [
 {"name": "l0.weight", "shape": [512, 1024]}, {"name": "l0.bias", "shape": [1024]},
 {"name": "l1.weight", "shape": [1024, 1024]}]}
EOF
	timeout 60 "$lab" mpirun -N 2 -x MALLOC_ARENA_MAX=1 -- "$work/ddpbench" run --backend mpi --model "$work/nodes.json" \
		--compute none --warmup 1 --steps 2 --timeout "${TIMEOUT}s" >>"$work/nodes.log" 2>&1 || rc=$?
	# ddpbench's table of ranks: "RANK PID HOST", two ranks on each host.
	got=$(awk -v p="$p" '$1 ~ /^[0-3]$/ && $3 ~ "^" p "-h" {print $3}' "$work/nodes.log" | sort | uniq -c | awk '{print $2 ":" $1}' | paste -sd' ')
	if [[ $rc != 0 ]]; then
		fail nodes "ddpbench over 2 hosts x 2 ranks ended with status $rc"
	elif ! grep -q "4 ranks" "$work/nodes.log" || [[ $got != "$p-h0:2 $p-h1:2" ]]; then
		fail nodes "ddpbench's ranks by host are '$got', want '$p-h0:2 $p-h1:2'"
	else
		pass nodes "2 ranks on each of 2 nodes; ddpbench's steps checked, $(grep -m1 -Eo 'step time \(ms\) *[0-9.]+' "$work/nodes.log" | awk '{print $NF}') ms a step; $((SECONDS - t0)) s"
	fi
}

# The hierarchical path's scenarios run the mpi package's own tests as ranks: built once, when the
# first of them runs.
hier_build() {
	[[ -x $work/mpi.test ]] || go test -c -tags mpi -o "$work/mpi.test" ./mpi/
}

scenario_hier() {
	hier_build
	local layout n t0
	# Buffers from the communicator's memory only (subtest shared): where the buffers come from
	# matters inside a host, which TestHierarchyUnderMpirun covers on one machine, and takes a third
	# of the time.
	for layout in 2+2 3+1; do
		t0=$SECONDS
		rc=0
		timeout 120 "$lab" mpirun -N "${layout//+/,}" -x DDPGO_MPI_TEST_LAYOUT="$layout" -x DDPGO_MPI_TEST_LAB=1 \
			-x MALLOC_ARENA_MAX=1 -- "$work/mpi.test" -test.run '^TestHierarchy$/^(shared|SendRecv|Barrier)$' -test.count=1 -test.v >"$work/hier.log" 2>&1 || rc=$?
		n=$(grep -c '^--- PASS: TestHierarchy ' "$work/hier.log" || true)
		if [[ $rc != 0 ]]; then
			fail hier "hosts $layout: the job ended with status $rc"
		elif [[ $n != 4 ]]; then
			fail hier "hosts $layout: TestHierarchy passed on $n ranks, want 4"
		else
			pass hier "hosts $layout: every collective, dtype, op and size as exact as the contract says on 4 ranks, each hierarchical on the lab host the layout names; $((SECONDS - t0)) s"
		fi
	done
}

# hier_fault FAULT PHASE runs TestHierarchyFault as 2 hosts x 2 ranks, rank 3 failing as FAULT says at
# the entry of PHASE (host or net) of an all-reduce, its output in $work/hier-FAULT.log, and judges
# the job: prints its verdict and, on a failure, the job's output.
hier_fault() {
	local f=$1 ph=$2 s=hier-$1 notes victim n r why=
	hier_build
	notes=$(mktemp -d "$work/notes.XXXXXX")
	"$lab" mpirun -N 2 -x "DDPGO_MPI_TEST_HIER_FAULT=$f:$ph:$notes" -x MALLOC_ARENA_MAX=1 -- \
		"$work/mpi.test" -test.run '^TestHierarchyFault$' -test.count=1 >"$work/$s.log" 2>&1 &
	job=$!
	t0=$SECONDS
	# The ranks' backstop (Options.Timeout) ends a job whose deadline path fails within 21 s.
	finish 45
	victim=$(grep -m1 -Eo "^CHILD: rank 3 \(process [0-9]+\): $f at the entry of the $ph phase" "$work/$s.log" | grep -Eo '[0-9]+\)' | tr -d ')' || true)
	n=$(grep -c "^CHILD: rank [0-2]: stall: " "$work/$s.log" || true)
	if [[ $rc == hung ]]; then
		why="the job was still running 45 s after it started: it hung"
	elif [[ $rc == 0 ]]; then
		why="exit status 0 with a rank failed"
	elif [[ -z $victim ]]; then
		why="rank 3 did not say that it failed ($f) at the entry of the $ph phase"
	elif grep -Eq "^CHILD: rank [0-2]: the all-reduce completed" "$work/$s.log"; then
		why="$(grep -Em1 "^CHILD: rank [0-2]: the all-reduce completed" "$work/$s.log")"
	elif [[ $f == stop ]]; then
		for r in 0 1 2; do
			grep -Eq "^CHILD: rank $r: waited [0-9.]+m?s: .*context deadline exceeded" "$work/$s.log" ||
				why="${why:+$why; }rank $r did not say that its wait ended at its deadline"
		done
		if [[ -n $why ]]; then
			:
		elif ((n < 2)); then
			why="$n stall reports before the deadline, want at least 2"
		elif ! grep -q "rank 3 (process $victim, stopped)" "$work/$s.log"; then
			why="no stall report names the stopped rank 3 (process $victim), in the job's numbering"
		elif ! grep -q "aborts the job: .*every surviving rank's wait ended" "$work/$s.log"; then
			why="rank 0 did not end the job once every rank's wait had ended"
		fi
	elif grep -Eq "^CHILD: rank [0-2]: waited .*deadline exceeded|every surviving rank's wait ended" "$work/$s.log"; then
		why="the job ran into the ranks' deadline instead of ending at the $f"
	elif ! grep -Eq "\(process $victim\) has exited|with PID $victim " "$work/$s.log"; then
		why="nothing names the ended process $victim"
	fi
	if [[ -n $why ]]; then
		fail "$s" "$ph phase: $why"
		return
	fi
	local how
	if [[ $f == stop ]]; then
		how="$n stall reports, every other rank's wait ended at its deadline, naming process $victim stopped"
	else
		how="$(grep -Eo -m1 "\(process $victim\) has exited|with PID $victim .*" "$work/$s.log")"
	fi
	pass "$s" "$ph phase: $how; the job ended (status $rc) $((SECONDS - t0)) s after it started"
}

scenario_hier-stop() {
	hier_fault stop host
	hier_fault stop net
}
scenario_hier-kill() {
	hier_fault kill host
	hier_fault kill net
}
scenario_hier-exit() {
	hier_fault exit host
	hier_fault exit net
}

scenarios=("$@")
((${#scenarios[@]})) || scenarios=(nodes hier hier-stop hier-kill hier-exit restore cut stop kill)
for s in "${scenarios[@]}"; do
	case $s in
	nodes | hier | hier-stop | hier-kill | hier-exit | restore | cut | stop | kill) "scenario_$s" ;;
	*)
		echo "netfaults: unknown scenario $s (want nodes, hier, hier-stop, hier-kill, hier-exit, restore, cut, stop or kill)" >&2
		exit 2
		;;
	esac
done
exit $failed
