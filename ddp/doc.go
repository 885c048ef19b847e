// Package ddp is the Reducer: the Go counterpart of PyTorch
// DistributedDataParallel's reducer. It averages gradients across the ranks
// of a comm.Communicator while backward is still running.
//
// # Model
//
// Parameters are grouped into buckets (package bucket; PyTorch's rules).
// Each bucket is one 512-byte-aligned block of CommPool memory, and by
// default a parameter's gradient IS its slot in that block: Grad(i)
// returns a []float32 view into the bucket, the training loop writes (or
// adds) the gradient there and calls Ready(i). Ready is O(1) and never
// waits for the network: an atomic decrement of the bucket's pending count;
// the call that brings it to zero pokes the rank's launcher goroutine (a
// non-blocking send on a one-slot channel). The launcher launches buckets
// strictly in index order, each as soon as it is complete and every
// earlier bucket has launched, through the Hook's first phase (compress,
// issue the collective); buckets complete at the same moment launch as one
// group (comm.Grouper). A second goroutine, the finisher, waits for the
// collectives in the same order and runs the Hook's second phase
// (decompress). Up to Options.MaxInFlight buckets (default: all) are on
// the wire at once, so bucket k+1 is reduced while bucket k still is, and
// every rank issues the same collectives in the same order, whatever order
// its gradients arrive in. Wait returns once the last bucket is finished:
// every gradient then holds the average over ranks, in place, for the
// optimizer to read.
//
// The bookkeeping (which parameters are marked, which buckets are complete,
// which may launch next) is a small deterministic state machine without
// goroutines or clocks (schedule.go); goroutines wrap around it.
//
// # A step
//
//	r.Begin(ddp.Sync)      // starts a step; gradients read as zero (lazily) unless the last step was NoSync
//	g, err := r.Grad(i)    // write or += the gradient of parameter i ...
//	r.Ready(i)             // ... then mark it, from any goroutine, in any order
//	r.Wait(ctx)            // synced step: all buckets reduced; Grad(i) holds the average
//
// SetGrad(i, g) copies g in and marks it; AddGrad adds. With
// Options.CopyGrads, Grad(i) is a Go slice of the Reducer's own, copied into
// the bucket at Ready and back after the reduction. Index finds a
// parameter by name.
//
// Begin(Sync) starts a synced step; Wait must follow before the next
// Begin. Begin(NoSync) starts a no-sync step (PyTorch's no_sync): Ready
// only records, nothing is communicated, and Wait is optional. Gradients
// are zeroed at Begin when the previous step was synced (or there was
// none), like zero_grad; after a no-sync step they are not, so no-sync
// steps accumulate and the next synced step reduces the accumulated sum.
// The caller writes (=) or adds (+=) into Grad(i); both work after a
// zeroing Begin.
//
// # Zeroing
//
// The zeroing is lazy, so that Begin does not pay a serial pass over all
// gradient memory (on ResNet-50 as long as the whole all-reduce) before
// backward can start: Begin only marks every gradient stale, in O(1). The
// first Grad(i) or GradBuffer(i) of the window zeroes parameter i's
// gradient and hands it out (its cache lines are then warm for the
// caller's write); SetGrad overwrites it and AddGrad on a stale gradient
// overwrites instead of adding, neither zeroing at all. A parameter marked
// ready with no Grad in the window, by the caller or as unused (below), is
// zeroed by the launcher just before its bucket is launched, so Ready
// stays O(1); StepStats.ZeroComm reports that time. Every gradient thus
// reads as zero the first time the caller looks at it, exactly as if
// Begin had zeroed them all. (zero.go has the mechanism.)
//
// Options.NoZeroGrad skips the zeroing in Grad: the gradients
// then hold the last average until overwritten, so the first step of each
// accumulation window that marks a parameter must write (=) its gradient,
// as PyTorch's zero_grad(set_to_none=True) requires of autograd (SetGrad
// overwrites, and AddGrad overwrites a gradient still holding the last
// average, so both are always right). A parameter that the caller leaves
// unmarked through a whole window and the Reducer marks unused (below) is
// zeroed before it is reduced, never reduced again with its stale average.
//
// Ready (and Grad, SetGrad, AddGrad) may be called from any goroutine,
// concurrently for different parameters, but every Ready of a step (and
// every write into a gradient) must have returned before Wait is called:
// Wait decides which parameters are missing. Once a parameter is marked
// in a synced step, its gradient belongs to the communication goroutines
// until Wait returns: do not call Grad for it in between. Close may be called from
// another goroutine to end a Wait that is blocked (Wait then returns
// ErrClosed); it must not run concurrently with Begin, Grad or Ready.
//
// Errors: Ready of a parameter already marked in the step (ErrMarkedTwice),
// of an index out of range (ErrIndex), or outside a step (ErrNoStep) name
// the parameter. If Wait finds parameters never marked ready it fails with
// ErrUnready, naming them and the fix, and leaves the step open; with
// Options.FindUnusedParameters it marks them itself instead (their current
// gradient, zero unless accumulated, is reduced) and lists them in
// StepStats.Unused. With Options.StaticGraph the first synced step finds
// them the same way and later steps mark them at Begin.
//
// # Views and the rebuild
//
// A slice returned by Grad is valid until the next Begin, and no longer.
// After the first synced step, Wait rebuilds the buckets from the order in
// which gradients became ready (limits [FirstBucketCap, BucketCap]), as
// PyTorch does: rank 0 computes the layout and broadcasts it (bucket.Encode)
// and every rank adopts it. The new layout takes effect at the next Begin
// (whose gradients start at zero, fresh memory, even with NoZeroGrad), so
// a slice taken during the first step still shows the reduced gradient
// after Wait; after that Begin it refers to memory returned to the pool
// (under the invariants build tag the pool poisons freed memory with NaNs,
// so stale use shows). Options.KeepLayout
// disables the rebuild. The initial layout assigns buckets over the
// parameters in reverse registration order with limits [FirstBucketCap,
// BucketCap], so bucket 0 holds the last layers, whose gradients backward
// produces first.
//
// # Failures
//
// New checks across ranks that every rank has the same parameters (count,
// shapes, dtypes) with one AllGather of a fingerprint; on a mismatch it
// gathers the descriptors and fails with ErrParamMismatch naming the first
// differing parameter and rank. The same AllGather compares the options
// that decide which collectives run (hook, bucket caps, KeepLayout), and
// carries a rank's own failure to build (an unsupported parameter, bad
// options, no memory), so that its peers fail with it instead of waiting.
// Every wait for a collective honours its context and Options.Timeout:
// Wait's, and those of New's check, the rebuild and BroadcastParameters;
// when one fails the Reducer aborts the group, since its peers may have
// got past that collective and would wait for this rank's next one.
// While Wait waits, after every Options.StallInterval it reports the
// bucket it waits for (Options.OnStall, or the log). A failed collective,
// a timeout or a cancelled context makes the error sticky: the Reducer
// aborts the group (so peers fail fast instead of hanging) and returns the
// error, naming the rank, step, bucket and the bucket's parameters, from
// every later call until Close. A step that has finished when the context
// ends stands. Close during a synced step aborts the group too.
//
// # Memory
//
// Bucket memory, the hook's scratch (one region per bucket that may be in
// flight) and the Reducer's own control traffic (New's cross-rank check,
// the rebuilt layout's broadcast, BroadcastParameters) all live in pool
// memory, so a backend only ever sees pool memory. A pool of device memory
// (Pool.Host false) works with device kernels (Options.Kernels, or the
// communicator's comm.KernelSource) and a communicator that carries device
// memory: the Reducer then reaches the gradients only through the kernels,
// GradBuffer gives them as comm.Buffers, SetGrad uploads, and Grad (a Go
// slice) returns nil.
//
// No block goes back to the pool while a collective may still write it.
// When the Reducer lets go of memory with collectives in flight (Close
// during a step, a failed step, a failed BroadcastParameters), it aborts
// the group, whose backend then completes every pending collective within
// its documented bound, and waits for them up to Options.DrainTimeout.
// Memory whose collectives are pending even then is kept out of the pool,
// on purpose and reported (ErrInFlight), and returned only once they
// complete; the Reducer's own pool is not unmapped before that.
//
// # Statistics
//
// Stats returns the last completed step's StepStats without allocating
// (its slices are reused: valid until the next Wait; StatsInto copies):
// per-bucket timelines (ready, launch, compress, collective, decompress,
// done) and per-parameter ready times relative to the step start; Compute
// (first to last Ready), Comm (union of the buckets' busy intervals),
// Overlap (the part of Comm before the last Ready) and OverlapRatio; bytes
// handed to collectives; fp16 overflows; unused parameters; the time the
// launcher spent zeroing stale gradients (ZeroComm, per bucket
// BucketStats.Zero). A warm step allocates nothing on the Go heap.
//
// # Hooks
//
// Options.Hook decides how a bucket is reduced (package hooks): the
// default hooks.Avg lets the backend average inside its reduction pass
// (no separate pass over the bucket: on ResNet-50 shapes that pass costs
// as much as the all-reduce itself); hooks.AllReduce is PyTorch's
// allreduce_hook, dividing by N before a Sum; hooks.FP16 and hooks.BF16
// halve the bytes on the wire. A hook works in two phases (launch, then
// finish once the collective completes), which is what lets several
// buckets be in flight. Each rank needs its own Hook value; the Reducer
// closes it.
package ddp
