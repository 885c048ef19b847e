// Package checked wraps any comm.Communicator so that ranks which disagree
// on a collective get an error that names them, instead of a hang or a
// corrupted result: PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL
// (ProcessGroupWrapper) for ddpgo's backends, MPI and NCCL included.
//
// Before each collective, every rank publishes a fingerprint of its call
// (its collective number and sequence number, the kind, reduction op,
// dtype, count and root, and whether the call is valid) and the ranks
// exchange them through the wrapped backend itself, with an AllGather of
// 64 bytes per rank; a Send and its Recv exchange theirs between the pair.
// Every rank then judges the same fingerprints, so every rank reaches the
// same verdict: a disagreement fails the collective on every rank with an
// error wrapping comm.ErrMismatch whose message is inproc's (the
// collective's number, the ranks that differ from the call most ranks
// made, and every rank's call, built by comm.MismatchError), a call that
// is invalid on some rank fails on every rank with comm.ErrInvalid naming
// that rank and why, and in neither case does the wrapped backend see the
// real call. Calls that agree are launched on the backend, whose Work then
// gives the result (its errors are reported with the wrapper's sequence
// numbers, which count the rank's calls, not the exchanges). A Barrier
// needs nothing after its exchange, which is itself a barrier.
//
// Each rank's checks run on a worker goroutine of its own, in issue
// order, so issuing stays asynchronous as the contract requires; Close
// stops it. The fingerprints live in allocator memory that the backend can
// carry (a private host pool by default, or Options.Pool), never on the Go
// heap. Each exchange is watched by a comm.Watchdog: a rank whose peers do
// not come reports the stall, naming them when the backend is a
// comm.Progress, and after the timeout aborts the backend. Ranks whose
// collectives and messages interleave differently, so that an exchange
// meets a different exchange on another rank, are still caught by that
// timeout (or by the backend), not named.
//
// The result reports the backend's Caps with MismatchDetection set and is
// a comm.Grouper and a comm.KernelSource where the backend is: a group's
// calls are checked together, their exchanges in one backend group and
// the calls that agree in another, so grouped messages that rely on the
// group to be matched still are. It is a comm.Progress too.
//
// Nothing is checked unless Wrap is called; a launcher calls it when
// Requested reports that DDPGO_DISTRIBUTED_DEBUG=DETAIL is set.
//
// # Cost
//
// Every collective costs one more collective of 64 bytes per rank and two
// hand-offs between goroutines (to the rank's worker and back), so a small
// collective's latency is that of a few goroutine switches, while a large
// one's does not change (docs/lab/checked.md has the measurements).
//
// A warm checked collective allocates nothing, as inproc's does.
package checked
