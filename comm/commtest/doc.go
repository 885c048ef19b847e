// Package commtest is the conformance suite that every comm.Communicator
// backend runs from its own tests, and the benchmark of one collective.
//
// # Two ways to run it
//
// Run drives every rank of a group from the calling goroutine, for a
// backend whose ranks can live in one process:
//
//	func TestConformance(t *testing.T) {
//		commtest.Run(t, func(t *testing.T, n int) []comm.Communicator {
//			// build and return a group of n ranks
//		})
//	}
//
// RunSPMD runs one rank's side of the same suite, for a backend with one
// rank per process (MPI) or per device (NCCL). Every rank calls it with the
// same options, and newComm, which it calls on every rank at the same
// points, returns this rank's communicator of a new group over the same
// ranks:
//
//	func TestSPMD(t *testing.T) {
//		commtest.RunSPMD(t, func(t *testing.T) comm.Communicator {
//			c, err := newWorldComm() // collective, e.g. MPI_Comm_dup(MPI_COMM_WORLD)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return c
//		}, commtest.AbortEndsProcess())
//	}
//
// built and started with one process per rank:
//
//	go test -c -o pkg.test ./pkg
//	mpirun -np 4 ./pkg.test -test.run TestSPMD
//
// Every process runs every test that -test.run selects, so the pattern
// should select only the tests written for mpirun. RunGoroutines runs
// RunSPMD with one goroutine per rank over groups from Run's newGroup;
// inproc uses it to test the SPMD driver itself.
//
// Both ways run the same checks, written once as what each rank does;
// Run issues every rank's call of a round before it waits for any (as the
// contract allows: collectives are asynchronous), RunSPMD issues its own
// rank's.
//
// # What it checks
//
// Every collective (AllReduce, in and out of place; Broadcast from each
// root; Reduce to each root, in and out of place; AllGather and
// ReduceScatter, in and out of place; Send and Recv in a ring; Barrier) for
// every dtype, every reduction op and the sizes 0, 1, 7 and 4 KiB+3
// elements. Run tests groups of 1, 2, 3 and 4 ranks (see Ranks), RunSPMD
// the group its callers form. The 8 MiB messages run on groups of 2 and 3
// ranks under Run and on any group under RunSPMD (see Large), for every
// dtype and op of every collective (Reduce to the last root, and for Sum to
// the first root too); under the race detector only for float32, and not
// at all with go test -short. Every element of every result is checked,
// and a failure names the rank, the operation, the dtype, the count,
// whether it ran in place, and the first wrong element with its value and
// the expected one; out-of-place send buffers must be left unchanged.
//
// It also checks that a rank's operations run in issue order; that
// communicators of different groups can be used concurrently; that Wait
// honours its context's deadline (every rank in turn being the one the
// others wait for); that a Work may be waited for twice; that Abort fails
// the aborting rank's pending and later operations with an error wrapping
// comm.ErrAborted and the cause (and its peers' too, with
// AbortReachesPeers); that ranks which disagree on a collective (its kind,
// reduction op, count, dtype or root) all get comm.ErrMismatch in a
// *comm.OpError carrying the rank, the sequence number and the operation,
// with a message that names the rank that differs and both sides of the
// disagreement (for a backend whose Caps claim MismatchDetection, unless
// NoMismatchDetection); that bad arguments give comm.ErrInvalid; and that
// Close is idempotent and fails a pending operation and later ones with
// comm.ErrClosed. A backend whose Abort ends the
// process (AbortEndsProcess) skips the abort check and is not closed with
// an operation pending.
//
// Inputs are small integers (or, for the half-precision rounding check,
// exactly representable fractions) derived from the rank and the group
// size only, so the expected value of every element is computed exactly in
// float64 and rounded once to the dtype: integer results and sums are
// compared exactly, averages within one unit in the last place. The data
// repeats with a prime period, which keeps the expected values cheap to
// compute for 8 MiB buffers while catching misplaced blocks.
//
// # Staying in step
//
// Under RunSPMD a rank that stopped early, or issued other collectives
// than its peers, would leave them waiting. So no check stops at its first
// wrong value: it records it and issues the rest of its collectives, and
// every check ends with the ranks agreeing on its outcome, with an
// AllReduce Max on a control communicator (RunSPMD's second newComm call)
// to which each rank contributes its own result. A check that failed on
// any rank fails on every rank, each naming the ranks that failed, and the
// next check starts in step. A rank whose operation failed or did not
// complete issues nothing more in that check (its peers then stop at their
// next wait), and before the next check every rank replaces its main
// communicator with a fresh one. The checks that break a communicator
// (abort, close, mismatch) or need several (invalid arguments, concurrent
// groups) take fresh groups; the suite closes every communicator it gets.
// The few checks that need one rank to hold back until the others have
// done something (Barrier, WaitDeadline, Abort) meet on the control
// communicator while an operation of the main one is pending.
//
// Every wait is bounded by WaitTimeout, even a Wait that ignores its
// context: the suite waits on a goroutine of its own and abandons a Wait
// that has not returned half a timeout after its deadline.
//
// # Memory
//
// Every buffer the suite and Bench hand to a collective comes from an
// allocator.Pool, off the Go heap, as the contract requires, so that a cgo
// backend may hold it past the call. A buffer that an operation which did
// not complete may still write is never reused or returned to the pool.
// The race detector does not see accesses to this memory.
//
// Bench measures one collective on a group in the way nccl-tests does and
// reports bus bandwidth and time per operation.
//
// # Fakes for code above comm
//
// Tests of a Reducer or a hook need communicators that misbehave on
// purpose, not backends. Solo is a one-rank communicator whose collectives
// complete at once, for embedding in a fake that overrides what it needs;
// FakeGroup is an in-process group without goroutines or clocks (so it
// runs in a testing/synctest bubble) that fails or hangs a chosen
// collective; Stuck wraps a communicator so that its all-reduces hang until
// Abort; DeviceComm presents host memory as a device's. None of them is a
// backend: backends pass the suite.
package commtest
