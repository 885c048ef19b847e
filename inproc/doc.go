// Package inproc is the embedded ddpgo backend: a group of N ranks that are
// goroutines of one process, with collectives done in shared memory.
//
// NewGroup(n) returns one *Comm per rank; each implements
// comm.Communicator. Each Comm owns a worker goroutine that executes its
// rank's operations in issue order when they need one, so issuing returns
// at once and a Work is a (Comm, sequence number) pair whose completion
// lives in a per-rank ring of preallocated slots (package comm/backend's
// Ring, which keeps the failure log and the waiters too): issuing and
// waiting allocate nothing.
//
// Collectives run on package comm/shm, the shared-memory engine, over a
// segment on the Go heap: every rank publishes its call, the ranks judge
// the calls alike (any difference fails the collective on every rank with
// comm.ErrMismatch, naming the collective's number, each rank's call and
// the ranks that disagree), and the data moves as shm's doc describes. A
// collective under 32 KiB per rank is staged: each rank copies its input
// with its call and computes its own output from the staged inputs, so
// nobody waits for another to finish. When the rank has nothing else
// pending, the issuing goroutine publishes the call itself (no hand-off to
// the worker), and the rank's part is done by the first to claim it
// (shm.Claim): the issuing goroutine if every other rank has published
// already, a Wait or Test of the Work that finds them all published, or
// the worker, which takes a collective over when a later operation of the
// rank waits behind it, a Wait on it parks, the group fails or a quarter of
// the stall interval passes. A larger collective is direct and runs on the
// workers: every rank reduces 1/N of the elements, reading all N inputs
// and writing the result into every output buffer (an in-place AllReduce
// needs no second copy pass), then waits until every rank has. Waits spin
// briefly, yielding the processor, and then park on a channel, so small
// collectives cost about two cache-line hand-offs between cores while idle
// ranks burn no CPU.
//
// Every wait for peers is watched by a comm.Watchdog: a rank that waits
// longer than Options.StallInterval reports a comm.Stall naming the ranks
// that have not joined (Options.OnStall, or the standard logger), and
// after Options.Timeout the operation fails with comm.ErrTimeout and the
// group is aborted. (A small collective that nobody waits for is watched
// once the worker takes it over, so its first report can come up to half
// an interval late.) Comm is a comm.Progress: Missing names the ranks a
// pending operation waits for, so a caller's own watchdog (the reducer's,
// waiting for a bucket) can name them too. Abort on any rank, or Close of
// any rank, fails every pending and future operation of the group; an
// operation that has already started moving data is allowed to finish
// first, so no buffer is written after its Work has completed, and a
// collective that every rank had published before the failure completes
// on every rank, so that no two ranks get different verdicts on it.
//
// A rank may have at most 256 operations issued and not yet completed;
// issuing one more waits until the oldest completes. A Work may be waited
// for again long after it completed: once its slot in the ring has been
// reused, a rank still knows which operations failed (every one once the
// group has failed; before that, the last 2048 or more failures, and an
// operation older than those is reported as no longer known), so a failure
// is never reported as a success.
//
// Mismatches are detected between collectives (every rank's call at the
// same collective number) and between the two ends of a message. Ranks
// whose collectives and messages interleave differently, or a rank that
// issues fewer collectives than the others, are not a mismatch the group
// can see: the ranks left waiting report the stall and fail at the
// timeout.
//
// Send and Recv are rendezvous operations: the sender's worker waits until
// the receiver has copied the message. Programs that exchange messages in
// a ring must therefore alternate the order (even ranks send first, odd
// ranks receive first), as they must with most other backends.
//
// Avg of floating-point dtypes is finite wherever the exact average is
// (3e38 and 3e38 average to 3e38, where summing first would give +Inf),
// in the reduction's one pass. Over a power-of-two number of ranks it is
// the pre-multiplied sum of NCCL's ncclAvg (each contribution times 1/N,
// exact in the normal range, so bit for bit the sum divided by N there);
// over other numbers of ranks it is the sum divided by N, rounded once, and
// an element whose sum overflows while its inputs are finite is computed as
// the pre-multiplied sum instead (multiplying every contribution by a
// rounded 1/N would turn an exactly cancelling sum into a residue). Either
// way the result is within (N+2)·u·mean|x| + N·η/2 of the exact average (u
// the unit roundoff, η the smallest subnormal), and correctly rounded on
// two ranks but for subnormal halves; package internal/reduce has the
// details. Float16 and BFloat16 sums round once from a float32
// accumulation, with the kernels of package fp16; a Float16 Avg scales
// that float32 sum by 1/N before the rounding (a float32 sum of binary16
// values cannot overflow), and a BFloat16 Avg, whose range is float32's,
// falls back to the pre-multiplied sum in float32 as above. Integer Avg is
// the sum divided by N, truncated toward zero.
package inproc
