#!/usr/bin/env bash
# run_mpi.sh: Open MPI's MPI_Allreduce between 2 processes of this machine,
# three ways, rows appended to one CSV (mpi_allreduce.c says what is timed).
#
#   scripts/peers/run_mpi.sh [CSV]          (default mpi_allreduce.csv)
#
#   vader        Open MPI's shared-memory transport, which mpirun picks by
#                itself for ranks on one machine; pinned here (btl
#                self,vader) so that nothing else is tried
#   vader_tuned  the same with glibc's mmap and trim thresholds raised: Open
#                MPI allocates a temporary buffer for each large all-reduce,
#                and above glibc's threshold every call maps and faults in
#                fresh pages, which on some VMs costs more than the
#                reduction. compare.sh quotes the better of vader and
#                vader_tuned as Open MPI's figure: what a tuned user gets.
#   tcp_lo       TCP over the loopback interface (btl self,tcp): the same
#                kind of wire as gloo's
#
# Every out-of-band and TCP endpoint stays on the loopback interface. As
# root, mpirun needs --allow-run-as-root, which the script adds.
# BENCH_BUDGET_S (default 0.6) is the timed seconds per size.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
csv=${1:-mpi_allreduce.csv}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/mpi_allreduce" "$here/mpi_allreduce.c"
rm -f "$csv"
export BENCH_BUDGET_S=${BENCH_BUDGET_S:-0.6}
mr=(mpirun --oversubscribe -np 2 -x BENCH_BUDGET_S --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo)
if [ "$(id -u)" = 0 ]; then mr+=(--allow-run-as-root); fi
big=4294967296 # 4 GiB: no all-reduce buffer reaches it
timeout 600 "${mr[@]}" --mca btl self,vader "$work/mpi_allreduce" "$csv" vader
timeout 600 "${mr[@]}" --mca btl self,vader -x MALLOC_MMAP_THRESHOLD_=$big -x MALLOC_TRIM_THRESHOLD_=$big \
	"$work/mpi_allreduce" "$csv" vader_tuned
timeout 600 "${mr[@]}" --mca btl self,tcp "$work/mpi_allreduce" "$csv" tcp_lo
echo "# rows in $csv"
