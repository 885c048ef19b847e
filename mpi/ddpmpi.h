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

// ddp_hosts counts the hosts c's ranks run on (a host: a name, a boot id
// and a network namespace, or DDPGO_MPI_HOST) and whether every rank can choose Open MPI's
// all-reduce algorithm (*can); collective over c.
int ddp_hosts(MPI_Comm c, int size, int *hosts, int *can);

// ddp_dup_algorithm duplicates MPI_COMM_WORLD into *out with Open MPI's
// all-reduce algorithm alg and segment size segsize
// (coll_tuned_allreduce_algorithm and _segmentsize), or leaves *out
// MPI_COMM_NULL and *made 0 when some rank could not set them; collective
// over c.
int ddp_dup_algorithm(MPI_Comm c, int alg, int segsize, MPI_Comm *out, int *made);

// ddp_forced_allreduce reads coll_tuned_allreduce_algorithm and its
// segment size as they stand (-1 where MPI does not have them): for tests.
void ddp_forced_allreduce(int *alg, int *segsize);
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
// ddp_sum2_f32 writes b + a (or, avg, b*0.5 + a*0.5) into d, the same bits
// as ddp_reduce_local(in b, inout a) of MPI_SUM (or the pair average), but
// for which of two NaNs a sum returns.
void ddp_sum2_f32(float *restrict d, const float *restrict a, const float *restrict b, long n, int avg);
// ddp_test_pair_kernel runs the float32 pair kernel of one vector width
// (0 the baseline, 1 AVX2, 2 AVX-512F) into d: ddp_sum2_f32's, or with
// acc the in-place one's (d = a + d, d a copy of b first); 0 if the CPU
// lacks the width. For tests.
int ddp_test_pair_kernel(int width, int acc, float *d, const float *a, const float *b, long n, int avg);

// The control segment (ddpctl.c): one per communicator whose ranks share
// a machine, mapped by every rank at Open.
#define DDP_CTL_INLINE 40 // the bytes of input a header carries itself
// One header: a cache line, so that a staged all-reduce of up to
// DDP_CTL_INLINE bytes moves one line from each rank to the others.
struct hdr {
	uint32_t word; // k*4 + phase: what the rank has published
	int32_t count;
	uint8_t dt, op, esize, direct; // direct: the peers' buffers are read in place
	int32_t ok; // phase 2 of a direct all-reduce: this rank mapped every peer's buffers
	int32_t pad[2];
	unsigned char data[DDP_CTL_INLINE];
};
_Static_assert(sizeof(struct hdr) == 64, "a header is one cache line");

typedef struct ddp_ctl {
	unsigned char *seg;
	size_t len, stride, stage;
	int rank, size;
	uint32_t k;    // the all-reduces this rank has published
	uint32_t step; // the words it has published (one per phase)
	long long spin_ns, yield_ns, liveness_ns;
	// What the last wait or judgement found, for its caller: the rank
	// waited for (lag) and its state (DDP_PEER_*), or the first rank
	// whose call differs, with its count, dtype and op (peer).
	int lag, lag_state;
	int peer[4];
	uint32_t target;  // the word being waited for (0: none); atomic
	uint64_t sleeps;  // waits that slept, for tests
	struct {
		int32_t pid;
		uint64_t start;
	} peers[];
} ddp_ctl;

// Results of waits (beside MPI_SUCCESS and DDP_ERR_MISMATCH) and states of
// a peer (ddp_ctl.lag_state).
#define DDP_PENDING (-1001)
#define DDP_WAIT_TIMEOUT (-1002)
enum { DDP_PEER_RUNNING = 1, DDP_PEER_STOPPED, DDP_PEER_GONE = -1003, DDP_PEER_ABORTED = -1004, DDP_PEER_CLOSED = -1005 };

// ddp_ctl_open maps a new control segment with staging buffers of stage
// bytes for every rank of c (all on this machine) into *out, or leaves it
// NULL on every rank when one rank could not map it; collective over c.
// spin_ns is how long a wait polls before it sleeps, yield_ns how long it
// then polls between calls to sched_yield.
int ddp_ctl_open(MPI_Comm c, int rank, int size, int stage, long long spin_ns, long long yield_ns, ddp_ctl **out);
void ddp_ctl_free(ddp_ctl *x);

// ddp_ctl_post publishes this rank's next staged all-reduce: its call and
// a copy of its input; then it polls, as ddp_ctl_poll, and returns what
// that returns. ddp_ctl_poll finishes it if every rank has published it
// (DDP_PENDING otherwise): judges the calls (MPI_SUCCESS or
// DDP_ERR_MISMATCH, ddp_ctl.peer naming the first rank that differs) and
// writes this rank's result into recv. ddp_ctl_complete waits for the
// peers first, up to timeout_ns (-1: no limit), polling first if spin:
// DDP_WAIT_TIMEOUT, DDP_PEER_GONE, DDP_PEER_CLOSED or DDP_PEER_ABORTED,
// with ddp_ctl.lag the rank it waited for, end a wait that fails. Post, poll and complete
// of one communicator are never called at once.
int ddp_ctl_post(ddp_ctl *x, int op, int dt, int esize, int count, uintptr_t send, uintptr_t recv);
int ddp_ctl_poll(ddp_ctl *x, uintptr_t recv);
int ddp_ctl_complete(ddp_ctl *x, uintptr_t recv, long long timeout_ns, int spin);

// For the direct all-reduce (ddpshm.c): a rank's header and descriptor
// area of parity p, publishing phase word t, waiting until every rank has
// published t, and the judgement of the calls.
struct hdr *ddp_ctl_hdr(const ddp_ctl *x, int r, int p);
void *ddp_ctl_desc(const ddp_ctl *x, int r, int p);
void ddp_ctl_publish(ddp_ctl *x, int p, uint32_t t);
int ddp_ctl_wait(ddp_ctl *x, int p, uint32_t t, long long timeout_ns, int spin);
int ddp_ctl_judge(ddp_ctl *x, int p);

// ddp_ctl_abort marks the job aborted by this rank, with cause, and wakes
// every rank that sleeps in a wait; any thread. ddp_ctl_abort_cause is
// the cause the aborting rank gave.
void ddp_ctl_abort(ddp_ctl *x, const char *cause);
const char *ddp_ctl_abort_cause(const ddp_ctl *x);
// ddp_ctl_test_abort_delay makes every later ddp_ctl_abort pause ns
// between claiming the abort and writing its cause, for tests.
void ddp_ctl_test_abort_delay(long long ns);

// ddp_ctl_close marks this rank's communicator closed, before it frees
// the segment: a peer's wait for this rank then ends (DDP_PEER_CLOSED).
void ddp_ctl_close(ddp_ctl *x);

// ddp_ctl_missing lists the ranks that have not published what this rank
// waits for now, and their states (DDP_PEER_*); -1 if it waits for
// nothing. ddp_ctl_state is rank r's state: DDP_PEER_CLOSED once it has
// closed its communicator, else its process's. Any thread. ddp_ctl_pid is
// rank r's process id.
int ddp_ctl_missing(ddp_ctl *x, int *ranks, int max, int *states);
int ddp_ctl_state(const ddp_ctl *x, int r);
int ddp_ctl_pid(const ddp_ctl *x, int r);

// Shared memory (ddpshm.c). ddp_shm_alloc maps size bytes of a new memfd
// shared (on failure NULL, errno in *err); ddp_shm_free unmaps one and
// closes its file (-1 and errno in *err on failure). Both may run on any
// thread.
void *ddp_shm_alloc(size_t size, int *err);
int ddp_shm_free(void *p, size_t size, int *err);

// ddp_shm_prepare readies the all-reduce below for communicators of up to
// size ranks (-1: no memory); on the owner thread.
int ddp_shm_prepare(int size);

// ddp_shm_allreduce all-reduces count elements (esize bytes each) of send
// into recv over x's ranks by reading and writing the ranks' buffers
// directly, where every rank's buffers lie in slabs of ddp_shm_alloc and
// every rank could map its peers'. The ranks agree and wait through x's
// control segment, with no MPI call. ddp_shm_taken says whether it did;
// if not, the ranks all leave the call to MPI, and ddp_shm_broken says
// that a rank could not map a peer's memory, so that they all leave every
// later call to MPI too. It returns DDP_ERR_MISMATCH on every rank where
// the ranks' calls differ (x->peer says how), and DDP_PEER_GONE or
// DDP_PEER_ABORTED when a peer exited or aborted the job while this rank
// waited for it (x->lag names it). On the owner thread.
int ddp_shm_allreduce(ddp_ctl *x, int op, int dt, int esize, int count, uintptr_t send, uintptr_t recv);
extern int ddp_shm_taken, ddp_shm_broken;
#define DDP_ERR_MISMATCH (-1000)
// ddp_shm_failure is why the first call that could not map a peer's
// memory fell back to MPI ("" if none did); ddp_shm_mapped counts the
// peers' slabs mapped here, and ddp_shm_detach_all unmaps them.
const char *ddp_shm_failure(void);
int ddp_shm_mapped(void);
void ddp_shm_detach_all(void);
// ddp_shm_test_fail makes every later mapping of a peer's slab fail (on
// != 0), for tests.
void ddp_shm_test_fail(int on);
// ddp_shm_test_exit makes the process exit (code 3) in the middle of its
// next direct all-reduce, once every rank has passed phase ph (2: the
// buffers mapped, none yet reduced; 0: never), for tests.
void ddp_shm_test_exit(int ph);
// ddp_shm_set_nt_min sets the slice size from which the two-rank
// out-of-place all-reduce streams its outputs, and returns the previous.
long ddp_shm_set_nt_min(long n);

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
