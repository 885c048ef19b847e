#!/usr/bin/env bash
# netlab: test hosts on one machine, joined by a rate-limited network.
#
# Each host is a network namespace (ddplab-h0, ddplab-h1, ...) with one
# interface, eth0, addressed 198.18.0.<i+1>/24 from the benchmarking range
# (RFC 2544), joined by a veth pair to a bridge in a switch namespace
# (ddplab-sw, 198.18.0.254). Both directions of every host link are shaped
# with tc's token bucket filter (tbf) to the same rate, so traffic between
# two hosts crosses two shaped links in series, as through a switch. No
# address is configured outside the namespaces this script makes, and
# nothing is routed anywhere else: the hosts reach only each other.
#
#   netlab.sh up [-n HOSTS] [-r RATE]   make HOSTS hosts (default 2) at RATE (default 1gbit)
#   netlab.sh rate RATE                 reshape every link (e.g. 10gbit)
#   netlab.sh down                      remove everything this script made
#   netlab.sh status                    hosts, addresses, shaping, counters
#   netlab.sh counters                  "host rx_bytes tx_bytes" of every host's eth0
#   netlab.sh link HOST up|down         cut or restore one host's link (HOST: h0, h1, ...)
#   netlab.sh mpirun [MPIRUN-ARGS] -- PROGRAM [ARGS]
#                                       run PROGRAM as one MPI rank per host, under one Open MPI
#                                       node: its TCP transport only (no shared memory), over eth0
#   netlab.sh mpirun -N RANKS [MPIRUN-ARGS] -- PROGRAM [ARGS]
#                                       run PROGRAM as RANKS MPI ranks per host, each host an Open
#                                       MPI node of its own, as on a cluster: shared memory (vader)
#                                       between the ranks of a host, TCP over eth0 between hosts;
#                                       RANKS may also give each host its count (-N 3,1), ranks
#                                       numbered host by host
#   netlab.sh agent ADDRESS COMMAND...  run COMMAND through sh on the host at ADDRESS (198.18.0.x)
#                                       under the host's name: mpirun -N's remote shell
#   netlab.sh exec HOST COMMAND...      run a command on one host
#   netlab.sh check                     exit 0 if this machine can run the lab (root, ip netns, veth, tbf)
#
# NETLAB_PREFIX (default ddplab) names the namespaces and the state file: two labs can be up on one
# machine at once (two jobs of a CI runner, say) under different prefixes.
#
# delay and loss need the netem qdisc, which is missing from some kernels: `netlab.sh up` says whether
# it loaded (NETEM=yes|no in status), and callers skip those scenarios when it did not.
#
# Needs root, iproute2 (ip, tc) and, for mpirun, Open MPI. `up` removes what it made if any step fails.
set -euo pipefail

PREFIX=${NETLAB_PREFIX:-ddplab}
SW=$PREFIX-sw
NET=198.18.0
STATE=/run/$PREFIX.hosts

die() { echo "netlab: $*" >&2; exit 1; }

# hosts lists the lab's hosts. Inside $(...) its die ends only the subshell, so callers that loop
# over $(hosts) call need_lab first.
need_lab() { [[ -f $STATE ]] || die "no lab is up (run: netlab.sh up)"; }
hosts() {
	need_lab
	cat "$STATE"
}

# burst of a token bucket for rate R (e.g. 1gbit): 2 ms worth of bytes, at least 64 KiB so that one
# segment of a TCP offload (up to 64 KiB) always fits.
burst() {
	local r=$1 bits
	case $r in
	*gbit) bits=$((${r%gbit} * 1000000000)) ;;
	*mbit) bits=$((${r%mbit} * 1000000)) ;;
	*kbit) bits=$((${r%kbit} * 1000)) ;;
	*) die "rate $r: want a number with gbit, mbit or kbit" ;;
	esac
	local b=$((bits / 8 / 500))
	((b < 65536)) && b=65536
	echo "$b"
}

shape() { # shape NAMESPACE DEVICE RATE
	local ns=$1 dev=$2 rate=$3
	tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$(burst "$rate")" latency 50ms
}

cmd_check() {
	[[ $(id -u) == 0 ]] || die "needs root"
	command -v ip >/dev/null && command -v tc >/dev/null || die "needs iproute2 (ip, tc)"
	local ns=$PREFIX-check
	ip netns add "$ns" 2>/dev/null || die "ip netns add failed: no network namespaces here"
	trap 'ip netns del '"$ns"' 2>/dev/null || true' RETURN
	ip -n "$ns" link add c0 type veth peer name c1 2>/dev/null || die "veth pairs are not available"
	tc -n "$ns" qdisc add dev c0 root tbf rate 1gbit burst 65536 latency 50ms 2>/dev/null || die "the tbf qdisc is not available"
	echo "netlab: this machine can run the lab"
}

cmd_up() {
	local n=2 rate=1gbit
	while getopts "n:r:" o; do
		case $o in
		n) n=$OPTARG ;;
		r) rate=$OPTARG ;;
		*) die "usage: netlab.sh up [-n HOSTS] [-r RATE]" ;;
		esac
	done
	[[ $n =~ ^[0-9]+$ ]] && ((n >= 2 && n <= 64)) || die "-n $n: want 2 to 64 hosts"
	burst "$rate" >/dev/null
	[[ -f $STATE ]] && die "a lab is up already (netlab.sh down first)"
	trap 'echo "netlab: up failed; removing what was made" >&2; cmd_down >/dev/null 2>&1' ERR
	ip netns add "$SW"
	ip -n "$SW" link set lo up
	ip -n "$SW" link add br0 type bridge
	ip -n "$SW" addr add "$NET.254/24" dev br0
	ip -n "$SW" link set br0 up
	: >"$STATE"
	for ((i = 0; i < n; i++)); do
		local h=$PREFIX-h$i
		ip netns add "$h"
		echo "h$i" >>"$STATE"
		ip -n "$h" link set lo up
		ip -n "$SW" link add "h$i" type veth peer name eth0 netns "$h"
		ip -n "$SW" link set "h$i" master br0 up
		ip -n "$h" addr add "$NET.$((i + 1))/24" dev eth0
		ip -n "$h" link set eth0 up
		shape "$h" eth0 "$rate"
		shape "$SW" "h$i" "$rate"
	done
	echo "$rate" >"$STATE.rate"
	local netem=no
	if tc -n "$SW" qdisc add dev br0 root netem delay 0ms 2>/dev/null; then
		netem=yes
		tc -n "$SW" qdisc del dev br0 root
	fi
	echo "$netem" >"$STATE.netem"
	trap - ERR
	echo "netlab: $n hosts up at $rate (netem: $netem)"
	for ((i = 0; i < n; i++)); do echo "  h$i  $NET.$((i + 1))"; done
}

cmd_rate() {
	local rate=${1:?usage: netlab.sh rate RATE}
	burst "$rate" >/dev/null
	need_lab
	for h in $(hosts); do
		shape "$PREFIX-$h" eth0 "$rate"
		shape "$SW" "$h" "$rate"
	done
	echo "$rate" >"$STATE.rate"
	echo "netlab: links shaped at $rate"
}

cmd_down() {
	local ns
	for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
		ip netns del "$ns"
	done
	rm -f "$STATE" "$STATE.rate" "$STATE.netem"
	echo "netlab: down"
}

counter() { # counter HOST FIELD
	ip netns exec "$PREFIX-$1" cat "/sys/class/net/eth0/statistics/$2"
}

cmd_counters() {
	need_lab
	for h in $(hosts); do
		echo "$h $(counter "$h" rx_bytes) $(counter "$h" tx_bytes)"
	done
}

cmd_status() {
	need_lab
	echo "rate $(cat "$STATE.rate" 2>/dev/null || echo '?') NETEM=$(cat "$STATE.netem" 2>/dev/null || echo '?')"
	need_lab
	for h in $(hosts); do
		local addr state
		addr=$(ip -n "$PREFIX-$h" -4 -o addr show dev eth0 | awk '{print $4}')
		state=$(ip -n "$PREFIX-$h" -o link show dev eth0 | grep -o 'state [A-Z]*')
		echo "$h $addr $state rx $(counter "$h" rx_bytes) tx $(counter "$h" tx_bytes)"
		tc -n "$PREFIX-$h" qdisc show dev eth0 | sed 's/^/    /'
	done
}

cmd_link() {
	local h=${1:?usage: netlab.sh link HOST up|down} how=${2:?usage: netlab.sh link HOST up|down}
	hosts | grep -qx "$h" || die "no host $h"
	[[ $how == up || $how == down ]] || die "link $h $how: want up or down"
	ip -n "$SW" link set "$h" "$how"
	echo "netlab: $h's link $how"
}

cmd_exec() {
	local h=${1:?usage: netlab.sh exec HOST COMMAND...}
	shift
	hosts | grep -qx "$h" || die "no host $h"
	exec ip netns exec "$PREFIX-$h" "$@"
}

# mpirun runs inside the switch namespace, so that its daemon and the ranks reach each other over
# the lab network only.
#
# Without -N, mpirun's own daemon starts every rank, each in its host's namespace: to Open MPI they
# are the ranks of one node. btl self,tcp: no shared memory between ranks, every byte crosses the
# shaped links. The PMIx server inside mpirun listens on the loopback by default, which a rank in
# another namespace cannot reach: it listens on the lab network.
#
# With -N, each host is a node as Open MPI sees a cluster's: mpirun starts a daemon on each host's
# address through its remote shell (plm_rsh_agent), here `netlab.sh agent`, which runs the daemon in
# that host's network namespace and in a UTS namespace of its own carrying the host's name. The
# name matters: Open MPI names its session directory and vader's segment files after the host, and
# two nodes of one name on one machine would share them (the ranks crash). Every daemon is started
# by mpirun itself (no tree spawn), so that the agent always runs from the switch, outside the
# hosts' namespaces; and --bind-to none: each node would otherwise bind its first rank to the same
# core as every other node's first rank, all of them on one machine.
cmd_mpirun() {
	local per=0 counts=()
	if [[ ${1:-} == -N ]]; then
		IFS=, read -ra counts <<<"${2:-}"
		local k
		for k in "${counts[@]}"; do
			[[ $k =~ ^[0-9]+$ ]] && ((k >= 1 && k <= 64)) || die "mpirun -N ${2:-}: want 1 to 64 ranks per host, or such a count for each host (3,1)"
		done
		((${#counts[@]} > 0)) || die "mpirun -N: want 1 to 64 ranks per host"
		per=${counts[0]}
		local given=$2
		shift 2
	fi
	local args=()
	while (($# > 0)) && [[ $1 != -- ]]; do
		[[ $1 != -N ]] || die "mpirun: -N RANKS goes first, before mpirun's own arguments"
		args+=("$1")
		shift
	done
	[[ ${1:-} == -- ]] || die "usage: netlab.sh mpirun [-N RANKS] [MPIRUN-ARGS] -- PROGRAM [ARGS]"
	shift
	(($# > 0)) || die "usage: netlab.sh mpirun [-N RANKS] [MPIRUN-ARGS] -- PROGRAM [ARGS]"
	need_lab
	local root=()
	[[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
	if ((per > 0)); then
		local self nodes=() np=0 i=0 all
		command -v unshare >/dev/null && command -v hostname >/dev/null || die "mpirun -N needs unshare and hostname"
		self=$(readlink -f "$0")
		[[ $self != *[[:space:]]* ]] || die "mpirun -N: the script's path ($self) has a space, which Open MPI's plm_rsh_agent cannot carry"
		all=$(hosts)
		((${#counts[@]} == 1 || ${#counts[@]} == $(wc -w <<<"$all"))) ||
			die "mpirun -N $given: ${#counts[@]} counts for $(wc -w <<<"$all") hosts"
		for h in $all; do
			((${#counts[@]} == 1)) || per=${counts[i]}
			nodes+=("$NET.$((${h#h} + 1)):$per")
			np=$((np + per))
			i=$((i + 1))
		done
		local IFS=,
		exec ip netns exec "$SW" mpirun "${root[@]}" -H "${nodes[*]}" -np "$np" --bind-to none \
			--mca plm_rsh_agent "$self agent" --mca plm_rsh_no_tree_spawn 1 \
			--mca btl self,vader,tcp --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
			"${args[@]}" "$@"
	fi
	local spec=() first=1
	for h in $(hosts); do
		((first)) || spec+=(:)
		first=0
		spec+=(-np 1 ip netns exec "$PREFIX-$h" "$@")
	done
	export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=$NET.0/24
	exec ip netns exec "$SW" mpirun "${root[@]}" --oversubscribe \
		--mca btl self,tcp --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
		"${args[@]}" "${spec[@]}"
}

# agent is mpirun -N's remote shell: mpirun calls it as it would call ssh, with an address and the
# words of a shell command (its daemon's), which it runs on that host under the host's name.
cmd_agent() {
	local addr=${1:?usage: netlab.sh agent ADDRESS COMMAND...}
	shift
	(($# > 0)) || die "usage: netlab.sh agent ADDRESS COMMAND..."
	local i=${addr#"$NET".}
	[[ $addr == "$NET".* && $i =~ ^[0-9]+$ ]] && ((i >= 1)) || die "agent: $addr is not a lab host's address ($NET.1, $NET.2, ...)"
	local h=h$((i - 1))
	hosts | grep -qx "$h" || die "agent: no host at $addr"
	exec ip netns exec "$PREFIX-$h" unshare --uts sh -c 'hostname "$0" && eval "$*"' "$PREFIX-$h" "$@"
}

case ${1:-} in
up | rate | down | status | counters | link | exec | mpirun | agent | check)
	c=$1
	shift
	"cmd_$c" "$@"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
