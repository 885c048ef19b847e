// Package ddp is the Reducer: the Go counterpart of PyTorch
// DistributedDataParallel's reducer. It averages gradients across the ranks
// of a comm.Communicator while backward is still running.
//
// # Model
//
// Parameters are grouped into buckets (package bucket; PyTorch's rules),
// apart by dtype. Each bucket is one 512-byte-aligned block of CommPool
// memory, and by default a parameter's gradient IS its slot in that block:
// Grad(i) returns a []float32 view into the bucket, the training loop
// writes (or adds) the gradient there and calls Ready(i). Ready is O(1)
// and never waits for the network: an atomic decrement of the bucket's
// pending count; the call that brings it to zero pokes the rank's launcher
// goroutine (a non-blocking send on a one-slot channel). The launcher
// launches buckets strictly in index order, each as soon as it is complete
// and every earlier bucket has launched, through the Hook's first phase
// (compress, issue the collective); buckets complete at the same moment
// launch as one group (comm.Grouper). A second goroutine, the finisher,
// waits for the collectives in the same order and runs the Hook's second
// phase (decompress). Up to Options.MaxInFlight buckets (default: all) are
// on the wire at once, so bucket k+1 is reduced while bucket k still is,
// and every rank issues the same collectives in the same order, whatever
// order its gradients arrive in. Wait returns once the last bucket is
// finished: every gradient then holds the average over ranks, in place,
// for the optimizer to read.
//
// The bookkeeping (which parameters are marked, which buckets are complete,
// which may launch next) and the step's sequence (the join flag, the
// buffers' broadcasts and the buckets, in the order every rank issues
// them, and which goroutine reads the flag when) are small deterministic
// state machines without goroutines or clocks (schedule.go); goroutines
// wrap around them. The files
// follow the roles: options.go, reducer.go (New, Close, the layout's
// queries), step.go (Begin, Grad, Ready and the other calls of backward),
// pipeline.go (the launcher and the finisher), wait.go (Wait, WaitEach),
// shard.go (Options.Shard: Owned, Gather, WaitGather), failure.go (sticky errors, aborts, memory held back), zero.go, join.go,
// buffers.go, check.go and control.go (New's cross-rank check and the
// Reducer's own collectives), broadcast.go, stats.go and timeline.go.
//
// # A step
//
//	r.Begin(ddp.Sync)      // starts a step
//	g, err := r.Grad(i)    // write or += the gradient of parameter i ...
//	r.Ready(i)             // ... then mark it, from any goroutine, in any order
//	r.Wait(ctx)            // all buckets reduced: Grad(i) holds the average
//
// SetGrad(i, g) copies g in and marks it; AddGrad adds. With
// Options.CopyGrads, Grad(i) is a Go slice of the Reducer's own, copied into
// the bucket at Ready and back after the reduction. Index finds a
// parameter by name.
//
// Begin(Sync) starts a synced step; Wait (or WaitEach) must follow before
// the next Begin. Begin(NoSync) starts a no-sync step (PyTorch's
// no_sync): Ready only records, nothing is communicated, and Wait is
// optional. Gradients read as zero after a Begin that follows a synced
// step (or none), like zero_grad; after a no-sync step they are not
// zeroed, so no-sync steps accumulate and the next synced step reduces the
// accumulated sum. The caller writes (=) or adds (+=) into Grad(i); both
// work after a zeroing Begin.
//
// WaitEach(ctx, f) is Wait that calls f on the caller's goroutine for each
// bucket as soon as it is reduced, in order, with its parameters: the
// optimizer can update them while later buckets are still on the wire
// (see its Example).
//
// # Zeroing
//
// The zeroing is lazy where it can be, so that Begin does not pay a
// serial pass over all gradient memory (on ResNet-50 as long as the whole
// all-reduce) before backward can start: Begin marks every gradient
// stale, in O(1). The first Grad(i) or GradBuffer(i) of the accumulation
// window zeroes parameter i's gradient and hands it out (its cache lines
// are then warm for the caller's write); SetGrad overwrites it, and
// AddGrad on a stale gradient overwrites instead of adding, neither
// zeroing at all. A parameter marked ready with no Grad in the window, by
// the caller or as unused (below), is zeroed by the launcher just before
// its bucket is launched, so Ready stays O(1); BucketStats.Zero and
// StepStats.ZeroComm report that time. Every gradient thus reads as zero
// the first time the caller looks at it, exactly as if Begin had zeroed
// them all.
//
// A gradient that Grad or GradBuffer has handed out is the exception:
// the caller may keep the slice and write through it in a later window
// without fetching it again, as PyTorch code keeps param.grad, which
// gradient_as_bucket_view makes a view of the bucket. Zeroed lazily, such
// a write would be lost: zeroed by the launcher, or mixed with the last
// average. So the zeroing Begin zeroes every gradient it has handed out
// in the current layout, and a kept slice takes the window's gradient,
// whichever elements are written, with = or +=. That is the pass Grad
// would make during the window, moved to Begin: a model that fetches its
// gradients with Grad zeroes the same bytes as before, but ahead of
// backward rather than interleaved with it; one that writes them with
// SetGrad or AddGrad and never asks for a slice pays nothing; one that
// reads them with Grad after Wait pays the pass in each zeroing Begin.
// Detecting such writes instead of keeping them would cost no less: the
// memory would have to be compared with what it held at Begin, which only
// a pass at Begin can record (the caller may change the averages after
// Wait, clipping them in place). zero.go has the mechanism.
//
// Options.NoZeroGrad skips the zeroing, in Begin and in Grad: the
// gradients then hold the last average until overwritten, so the first
// step of each accumulation window that marks a parameter must write (=)
// its gradient, as PyTorch's zero_grad(set_to_none=True) requires of
// autograd (SetGrad overwrites, and AddGrad overwrites a gradient still
// holding the last average, so both are always right), and Ready takes
// the caller's word for it. A parameter that the caller leaves unmarked through a whole
// window and the Reducer marks unused (below) is zeroed before it is
// reduced, never reduced again with its stale average.
//
// # Calling rules
//
// Ready (and Grad, SetGrad, AddGrad) may be called from any goroutine,
// concurrently for different parameters, but every Ready of a step (and
// every write into a gradient) must have returned before Wait is called:
// Wait decides which parameters are missing. Once a parameter is marked
// in a synced step, its gradient belongs to the communication goroutines
// until its bucket is reduced: Grad fails with ErrBusy until then. One
// goroutine at a time may be in Wait, WaitEach, Join or Broadcast: a
// second call of any of them, or a Begin, made meanwhile from another
// goroutine fails at once with ErrConcurrent and leaves the first alone.
// Close may be called from another goroutine to end one of them that is
// blocked (it then returns ErrClosed), and returns once it has; Close
// must not run concurrently with Begin, Grad or Ready.
//
// Errors: Ready of a parameter already marked in the step
// (ErrMarkedTwice), of an index out of range (ErrIndex, from Grad and
// GradBuffer too), or outside a step (ErrNoStep) name the parameter. If
// Wait finds parameters never marked ready it fails with ErrUnready,
// naming them and the fix, and leaves the step open; with
// Options.FindUnusedParameters it marks them itself instead (their
// current gradient, zero unless accumulated, is reduced) and lists them in
// StepStats.Unused. With Options.StaticGraph the first synced step finds
// them the same way and later steps mark them at Begin.
//
// # Dtypes
//
// Param.DType may be Float32 (the default), Float64, Float16 or BFloat16.
// Each dtype has buckets of its own, which the hook reduces in that dtype
// (package hooks, "Dtypes": float64 through comm.Avg in float64; FP16 and
// BF16 compress float32 buckets, reduce half buckets as they are and
// refuse float64, which New reports as ErrUnsupported). Grad, SetGrad and
// AddGrad take float32 gradients; GradBuffer gives any gradient as a
// comm.Buffer whose AsFloat64, AsUint16 (the bits of float16 and bfloat16)
// and AsFloat32 views a host training loop writes through. Broadcast
// carries parameter values of every dtype; BroadcastParameters is its
// float32 form from rank 0.
//
// # Sharded optimizer state
//
// Options.Shard is ZeRO stage 1 (DeepSpeed; PyTorch's
// ZeroRedundancyOptimizer): instead of every rank stepping every
// parameter with the same averaged gradient, each rank owns a part of
// each bucket, keeps the optimizer state of that part alone, and steps
// it alone. Each bucket is reduce-scattered instead of all-reduced, so a
// rank receives the average of its part only; once it has stepped that
// part, an all-gather gives every rank every part. The two carry the
// bytes of one all-reduce, and every rank issues them in the same order:
// the buckets' reduce-scatters as they complete (overlapping backward as
// the all-reduces do), then the all-gathers in bucket order.
//
//	r.Begin(ddp.Sync)
//	// ... backward: Grad, Ready as above
//	r.WaitEach(ctx, func(b ddp.Reduced) {
//		for _, p := range b.Owned { // this rank's part of bucket b
//			g, _ := r.Grad(p.Param)
//			opt.Step(p, values[p.Param][p.Lo:p.Hi], g[p.Lo:p.Hi])
//		}
//		r.Gather(b.Bucket, values) // publish it; its all-gather follows the step's reductions
//	})
//	r.WaitGather(ctx) // values now hold every rank's updates
//
// Owned(k) lists a bucket's parts ahead of time, for the optimizer to
// size its state. The partition is of each bucket, not of the model, so
// that a rank can step bucket k as soon as it is reduced: ShardElements
// splits the bucket into N equal ranges of elements (padded at the end
// with fewer than N zeros, which no one writes; the bucket is reduced
// whatever its size), so a parameter may be split between ranks, which
// suits elementwise optimizers (SGD, momentum, Adam, AdamW) and holds
// each rank's share to 1/N of the bucket plus at most one element.
// ShardParams gives each parameter wholly to one rank, largest first to
// the least loaded in its bucket (PyTorch's greedy rule), and among those
// to the one that owns least of the buckets before, for optimizers that
// need a whole tensor; a rank's share of a bucket is then within 1/N of
// it plus its largest parameter, and the bucket's memory is N times the
// largest share.
// Both pad inside pool memory only; a Part is always a range of the
// caller's own parameter.
//
// The reduce-scatter does the all-reduce's arithmetic, element for
// element (hooks.Scatterer: Avg, AllReduce, FP16 and BF16 compress,
// reduce and decompress elementwise), so where the backend sums each
// element over the ranks in the same order in its reduce-scatter as in
// its all-reduce (inproc does), the average of an owned element has the
// same bits as without Shard, and an elementwise optimizer computes the
// same update: training gives the same parameters, bit for bit, as the
// unsharded step. Where the orders differ, each average is still within
// the hooks' bound of the exact one (package hooks, "Accuracy"), so the
// two within twice it. Outside the owned part, a bucket's gradients are
// undefined after the reduction.
//
// Gather copies the owned elements of the caller's values into the
// bucket (whose averaged gradients there are spent) and publishes it;
// it never waits. The launcher issues the published all-gathers in
// bucket order once the step's last bucket has launched, so a rank's
// optimizer may run at its own pace; WaitGather waits for them and
// copies the other ranks' parts into the values, on the caller's
// goroutine, so the Reducer writes the caller's memory only inside
// WaitGather. Those two copies move as many bytes as the all-gather
// itself; Values removes them: it hands out the parameters' values in
// memory of the Reducer's own, laid out as the buckets, and a Gather
// given those slices for every parameter of its bucket copies nothing:
// the all-gather runs in place there, and the slices are the model's
// parameters (copy them out before Close). Until WaitGather returns,
// the step is open: Begin, Join and Broadcast fail with
// ErrStepInProgress, and the gradients of a gathered bucket with ErrBusy
// (its memory carries the parameters, unless they are Values').
// Gathering every bucket is part of the step: WaitGather fails with
// ErrGather, naming the buckets not gathered, rather than leave ranks
// with different parameters.
//
// Shard keeps the initial layout (it implies KeepLayout), since a
// rebuilt layout would move parts, and their optimizer state, between
// ranks. It needs a hook that is a hooks.Scatterer (New refuses PowerSGD,
// whose factors are not elementwise, naming the option), a host pool and
// float32 parameters (Gather takes []float32 values). With Options.Join a
// joined rank still owns its parts, so it calls JoinEach instead of
// Join, whose each steps and gathers them in every step it shadows (as
// PyTorch's ZeRO join hook steps the optimizer): its model keeps
// training with its peers'. No-sync steps, CopyGrads (the owned elements are copied back), unused
// parameters, StaticGraph, buffers and the watchdog work as without it;
// New's check compares Shard across ranks. Without Shard nothing of this
// runs.
//
// Consolidate gathers optimizer state sharded like the parameters (one
// slice per parameter, each rank holding its Owned elements) onto one
// rank, as PyTorch's consolidate_state_dict does, for a checkpoint in the
// unsharded form: any number of ranks, sharded or not, can load it, each
// taking its Owned elements or all of them.
//
// # Views and the rebuild
//
// Grad's slices and GradBuffer's Buffers stay valid while Generation does
// not change. After the first synced step, Wait rebuilds the buckets from
// the order in which gradients became ready (limits [FirstBucketCap,
// BucketCap]), as PyTorch does: rank 0 computes the layout and broadcasts
// it (bucket.Encode) and every rank adopts it. The new layout takes
// effect at the next Begin, which increments Generation (whose gradients
// start at zero, fresh memory, even with NoZeroGrad), so a slice taken
// during the first step still shows the reduced gradient after Wait; after
// that Begin it refers to memory that no longer holds a gradient. In the
// step that Begin starts, a write through such a slice, at any element,
// makes Ready (or Wait, for a parameter it would mark unused) fail with
// ErrStaleGrad naming the parameter, instead of being lost (host memory;
// canary.go). That needs the old layout kept out of the pool during that
// step: where the pool cannot hold both layouts and a host gradient of
// the old one was handed out, that Begin fails instead, wrapping
// allocator.ErrExhausted, and aborts the group, so that every rank fails
// rather than a write landing in another parameter's gradient (give the
// pool room for two layouts, as the Reducer's own pool has, or set
// KeepLayout). After that step the memory is back in the pool (under the
// invariants build tag the pool poisons freed memory with NaNs, so stale
// use shows). A model that keeps gradient slices fetches them again when
// Generation changes, that is, with the default options, once, at the
// Begin of the second synced step. Options.KeepLayout disables the
// rebuild. The initial layout assigns buckets over the parameters in
// reverse registration order with limits [FirstBucketCap, BucketCap], so
// bucket 0 holds the last layers, whose gradients backward produces first.
//
// # Buffers
//
// Options.Buffers lists model state that is not a gradient but must be
// the same on every rank (BatchNorm's running statistics: PyTorch's
// broadcast_buffers). The Reducer keeps them in pool memory that never
// moves (Buffer(i)); forward updates them, and every synced step
// broadcasts them from rank 0, issued by the launcher just before bucket
// 0's collective, so it overlaps the rest of backward: when Wait returns,
// every rank holds rank 0's values.
//
// # Uneven inputs
//
// With Options.Join, ranks may run out of batches at different steps: a
// rank out of data calls Join, which shadows its peers' synced steps with
// zero gradients until every rank has joined, and returns the rank that
// joined last, whose parameters Broadcast then gives every rank (see the
// Example). The average divides by the group size (JoinWorld, PyTorch's
// default) or by the ranks still active (JoinActive); JoinThrow ends every
// rank with ErrJoined instead. Every rank must know, at each synced step,
// which ranks are active: one small all-reduce per synced step, issued at
// Begin and read before the first bucket launches, tells them (join.go).
// Without Options.Join a step pays nothing for it.
//
// # Failures
//
// New checks across ranks that every rank has the same parameters (count,
// shapes, dtypes) with one AllGather of a fingerprint; on a mismatch it
// gathers the descriptors and fails with ErrParamMismatch naming the first
// differing parameter and rank. The same AllGather compares the options
// that decide which collectives run (hook, bucket caps, KeepLayout, the
// buffers, Join), and carries a rank's own failure to build (an
// unsupported parameter, bad options, no memory), so that its peers fail
// with it instead of waiting. Every wait for a collective honours its
// context and Options.Timeout: Wait's, and those of New's check, the
// rebuild, Broadcast and Join; when one fails the Reducer aborts the
// group, since its peers may have got past that collective and would wait
// for this rank's next one. Wait is watched by a comm.Watchdog (Timeout,
// StallInterval, OnStall), as the backends' own waits are: after every
// StallInterval it reports a comm.Stall naming the step, the bucket it
// waits for and, once the bucket's collective is on the wire, the ranks
// that have not joined it (where the backend can tell: inproc can, MPI
// and NCCL cannot), and before that, this rank's own parameters not yet
// marked ready; at Timeout it fails with that stall's comm.ErrTimeout. A failed collective, a timeout or a
// cancelled context makes the error sticky: the Reducer aborts the group
// (so peers fail fast instead of hanging) and returns the error, naming
// the rank, step, bucket and the bucket's parameters, from every later
// call until Close. A step that has finished when the context ends
// stands. Close during a synced step aborts the group too.
//
// # Memory
//
// Bucket memory, the hook's scratch (one region per bucket that may be in
// flight), the buffers, the join flag and the Reducer's own control
// traffic (New's cross-rank check, the rebuilt layout's broadcast,
// Broadcast) all live in pool memory, so a backend only ever sees pool
// memory. A pool of device memory (Pool.Host false) works with device
// kernels (Options.Kernels, or the communicator's comm.KernelSource) and a
// communicator that carries device memory: the Reducer then reaches the
// gradients only through the kernels, GradBuffer gives them as
// comm.Buffers (on the rank's device, comm.DeviceOf), SetGrad uploads,
// and Grad fails with ErrOptions. Kernels that do some operations for
// some dtypes only (comm.KernelSupporter: NCCL's device kernels add and
// scale float32 alone) are asked when New builds the Reducer, for every
// operation the hook (hooks.KernelUser) and JoinActive would apply to
// each parameter's dtype; a parameter that needs one they lack fails New
// with ErrUnsupported, naming it, the rank and the dtype, rather than
// panicking on the launcher goroutine in the first step.
//
// No block goes back to the pool while a collective may still write it.
// When the Reducer lets go of memory with collectives in flight (Close
// during a step, a failed step, a failed Broadcast), it aborts the group,
// whose backend then completes every pending collective within its
// documented bound, and waits for them up to Options.DrainTimeout. Memory
// whose collectives are pending even then is kept out of the pool, on
// purpose and reported (ErrInFlight), and returned only once they
// complete; the Reducer's own pool is not unmapped before that.
//
// # Statistics
//
// StatsInto copies the last completed step's StepStats into the caller's,
// reusing its slices (no allocation once warm); Stats returns a copy with
// slices of its own. Neither hands out memory a later step writes. They
// hold per-bucket timelines (ready, launch, compress, collective,
// decompress, done) and per-parameter ready times relative to the step
// start; Compute (first to last Ready), Comm (union of the buckets' busy
// intervals), Overlap (the part of Comm before the last Ready) and
// OverlapRatio; bytes handed to collectives, per bucket with its dtype and
// wire dtype; fp16 overflows; unused parameters; the time the launcher
// spent zeroing stale gradients; with Join, the ranks active. A warm step
// allocates nothing on the Go heap. Package ddp/metrics exports them to
// Prometheus (ddp itself links no Prometheus, protobuf or net/http), and
// WriteTimeline draws them as a trace.
//
// # Hooks
//
// Options.Hook decides how a bucket is reduced (package hooks): the
// default hooks.Avg lets the backend average inside its reduction pass
// (no separate pass over the bucket: on ResNet-50 shapes that pass costs
// as much as the all-reduce itself); hooks.AllReduce is PyTorch's
// allreduce_hook, dividing by N before a Sum; hooks.FP16 and hooks.BF16
// halve the bytes on the wire; hooks.PowerSGD sends low-rank factors of
// each gradient matrix, for which the Reducer gives a hook each bucket's
// tensors (hooks.Bucket.Tensors, scratch sized by hooks.ScratchFor) and its
// pool (hooks.PoolUser), and issues nothing of its own while a bucket is in
// flight. A hook works in two phases (launch, then
// finish once the collective completes), which is what lets several
// buckets be in flight. Each rank needs its own Hook value; the Reducer
// closes it. One value given to several ranks of a process fails New on
// every rank with hooks.ErrShared.
package ddp
