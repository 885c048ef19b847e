//go:build mpi

// The C half of package mpi: MPI start-up, the collectives in blocking and
// non-blocking form, the requests the owner goroutine progresses, and the
// user-defined reductions for 16-bit floats. Every function here runs on
// the owner goroutine's thread, except ddp_library_version and
// ddp_abort_job's last resort.

#ifndef DDPGO_MPI_H
#define DDPGO_MPI_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

// Element types, reduction ops and collective kinds: the values of the Go
// constants comm.DType, comm.Op and comm.Kind.
enum { DDP_F32 = 1, DDP_F16, DDP_BF16, DDP_F64, DDP_I32, DDP_I64, DDP_U8 };
enum { DDP_SUM = 1, DDP_AVG, DDP_MAX, DDP_MIN };
// DDP_AVG2 is Avg over exactly two ranks, done inside MPI's reduction by
// an operation that averages its two operands (see ddp_op); not a comm.Op.
enum { DDP_AVG2 = 100 };
enum {
	DDP_ALLREDUCE = 1, DDP_BROADCAST, DDP_REDUCE, DDP_ALLGATHER,
	DDP_REDUCESCATTER, DDP_SEND, DDP_RECV, DDP_BARRIER
};

// DDP_SEGMENT is the segment size of the segmented ring all-reduce the
// backend runs between hosts (see the package documentation).
#define DDP_SEGMENT (256 << 10)

// DDP_MAXREQ bounds the non-blocking requests in flight at once.
#define DDP_MAXREQ 1024

// ddp_init initialises MPI (or adopts an MPI the host program initialised)
// and creates the 16-bit reductions. *provided receives the thread level,
// *ours whether this call initialised MPI, *tuned whether it changed
// glibc's malloc settings first, *tcp whether it took "put" out of Open
// MPI's TCP transport flags or raised its eager limit (see the package
// documentation), *tcp_flags and *tcp_eager those settings as MPI holds
// them (-1 where MPI does not say).
int ddp_init(int *provided, int *ours, int *tuned, int *tcp, int *tcp_flags, long long *tcp_eager, int *world_rank, int *world_size);
int ddp_finalize(int ours);

// ddp_boot_id is a hash of the machine's boot id (0 where it cannot be
// read): it tells machines apart. Not thread-safe on its first call.
uint64_t ddp_boot_id(void);

int ddp_dup(MPI_Comm *out, int *rank, int *size);
int ddp_free(MPI_Comm *c);
// ddp_split is MPI_Comm_split(c, color, key) into *out, with errors
// returned, and its rank and size; collective over c.
int ddp_split(MPI_Comm c, int color, int key, MPI_Comm *out, int *rank, int *size);

// ddp_hosts counts the hosts c's ranks run on (a host: a name, a boot id
// and a network namespace, or DDPGO_MPI_HOST), says whether every rank
// can choose Open MPI's all-reduce and reduce-scatter algorithms (*can:
// the user chose neither) and, unless host_of is
// NULL, on which host each rank runs (host_of[r]; hosts are numbered in
// the order their first rank appears); collective over c.
int ddp_hosts(MPI_Comm c, int size, int *hosts, int *can, int *host_of);

// ddp_dup_algorithm duplicates c into *out with Open MPI's
// all-reduce algorithm alg and segment size segsize
// (coll_tuned_allreduce_algorithm and _segmentsize) and its
// reduce_scatter_block algorithm rsb, or leaves *out MPI_COMM_NULL and
// *made 0 when some rank could not set them; collective over c.
int ddp_dup_algorithm(MPI_Comm c, int alg, int segsize, int rsb, MPI_Comm *out, int *made);

// ddp_forced_allreduce reads coll_tuned_allreduce_algorithm, its segment
// size and coll_tuned_reduce_scatter_block_algorithm as they stand (-1
// where MPI does not have them): for tests.
void ddp_forced_allreduce(int *alg, int *segsize, int *rsb);
int ddp_allreduce_int(MPI_Comm c, int *inout, int n, int max);

// ddp_start runs (blocking != 0) or posts (into request slot) one
// operation. send and recv are addresses; inplace selects MPI_IN_PLACE
// (AllReduce, Reduce on the root, AllGather).
int ddp_start(MPI_Comm c, int blocking, int slot, int kind, int op, int dt,
              int count, uintptr_t send, uintptr_t recv, int root, int inplace);

// ddp_testsome tests the requests in slots [0, n) and returns how many
// completed. It writes their slots to ddp_done, their errors to ddp_errs
// and, for receives, the element count received to ddp_got (-1
// otherwise); ddp_test_rc is MPI_Testsome's own error, if any (the
// count is then 0). Nothing is returned through a pointer, so that the
// Go caller's variables stay off the heap.
int ddp_testsome(int n);
extern int ddp_test_rc;
extern int ddp_done[DDP_MAXREQ];
extern int ddp_errs[DDP_MAXREQ];
extern int ddp_got[DDP_MAXREQ];

// ddp_type and ddp_op are the MPI datatype and operation of a ddpgo
// dtype and op (DDP_AVG2 included); Avg is reduced as a Sum.
MPI_Datatype ddp_type(int dt);
MPI_Op ddp_op(int op, int dt);

// ddp_reduce_local computes MPI_Reduce_local(in, inout, n, ddp_type(dt),
// ddp_op(op, dt)) without calling MPI, so on any thread.
void ddp_reduce_local(int dt, int op, const void *in, void *inout, int n);
// ddp_scale divides count elements of dt at buf by n (Avg after Sum).
void ddp_scale(int dt, uintptr_t buf, int count, int n);

// ddp_error_string writes MPI's text for code, and its class, to buf.
void ddp_error_string(int code, char *buf, int len, int *class);

void ddp_library_version(char *buf, int len);
void ddp_abort_job(int code);
int ddp_has_f16c(void);

// ddp_test_reduce applies the 16-bit reduction of dt and op to in and
// inout, with F16C if f16c and the CPU has it: for tests of the kernels.
void ddp_test_reduce(int dt, int op, uintptr_t in, uintptr_t inout, int count, int f16c);

#endif
