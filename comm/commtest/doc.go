// Package commtest is the conformance suite that every comm.Communicator
// backend runs from its own tests:
//
//	func TestConformance(t *testing.T) {
//		commtest.Run(t, func(t *testing.T, n int) []comm.Communicator {
//			// build and return a group of n ranks
//		})
//	}
//
// Run checks every collective (AllReduce; Broadcast from each root; Reduce
// to each root, in and out of place; AllGather and ReduceScatter, in and
// out of place; Send and Recv in a ring; Barrier) for every dtype, every
// reduction op and the sizes 0, 1, 7 and 4 KiB+3 elements, on groups of 1,
// 2, 3 and 4 ranks. The 8 MiB messages run on groups of 2 and 3 ranks (see
// Large), for every dtype and op of every collective (Reduce to the last
// root, and for Sum to the first root too); under the race detector only
// for float32, and not at all with go test -short. It also checks that a rank's operations run in
// issue order, that communicators of different groups can be used
// concurrently, that Wait honours its context's deadline, that Abort on one
// rank fails every rank, that ranks which disagree on a collective (its
// kind, reduction op, count, dtype or root) all get comm.ErrMismatch in a
// *comm.OpError carrying the rank, the sequence number and the operation,
// with a message that names the rank that differs and both sides of the
// disagreement, that bad arguments give comm.ErrInvalid and that Close is
// idempotent and fails later operations with comm.ErrClosed.
//
// Inputs are small integers (or, for the half-precision rounding check,
// exactly representable fractions), so the expected value of every element
// is computed exactly in float64 and rounded once to the dtype: integer
// results and sums are compared exactly, averages within one unit in the
// last place. The data repeats with a prime period, which keeps the
// expected values cheap to compute for 8 MiB buffers while catching
// misplaced blocks.
//
// The suite issues every rank's calls from one goroutine before waiting for
// any of them, as the contract allows (collectives are asynchronous), and
// from one goroutine per rank in the concurrency checks.
//
// Bench measures one collective on a group in the way nccl-tests does and
// reports bus bandwidth and time per operation.
package commtest
