// Package ddptrain trains GoMLX models data-parallel over ddpgo: in one
// process with inproc ranks, or one rank per process from launch.Open
// (mpirun, srun, torchrun), on any comm.Communicator.
//
// A Trainer takes what GoMLX's train.NewTrainer takes (a backend, a
// context holding the variables, a ModelFn, a LossFn and an optimizer) and
// a communicator, and its TrainStep takes what a train.Dataset yields
// (docs/lab/gomlx.md has the measurements):
//
//	tr, err := ddptrain.New(c, backend, ctx, model, losses.SparseCategoricalCrossEntropyLogits,
//		optimizers.Adam().Done(), ddptrain.Options{})
//	defer tr.Close()
//	for {
//		spec, inputs, labels, err := ds.Yield() // this rank's shard (ddptrain.Dataset)
//		...
//		loss, err := tr.TrainStep(ctx, spec, inputs, labels)
//	}
//
// # Model
//
// Each step runs two GoMLX graphs with ddpgo's Reducer between them:
//
//  1. The gradient graph computes the model, the loss (with the terms the
//     model added by train.AddLoss) and the gradient of every trainable
//     variable the graph uses, as train.Trainer's graph does before its
//     optimizer. GoMLX runs it as one execution and returns every output
//     when it ends: no gradient is available while backward runs, so no
//     communication can overlap the graph's own backward pass.
//  2. The hand-off copies each gradient into its slot of the Reducer's
//     bucket memory, last variable first (the order backward produced them
//     in, and the order of the initial buckets), and marks it ready: a
//     bucket's all-reduce starts as soon as its last gradient is in, while
//     the next gradients are still being copied. This is the one copy
//     between the graph and the wire: on a backend that shares memory with
//     Go (simplego does), the source is the backend's output buffer itself.
//     GoMLX has no way to make a graph write its outputs into given memory,
//     or to make a tensor of memory it did not allocate, so the copy
//     cannot be avoided; Times.HandOff reports what it costs.
//  3. As each bucket is reduced (ddp.Reducer.WaitEach), the averages are
//     copied, once, into the optimizer graph's inputs (buffers the backend
//     shares with Go where it can), while later buckets are still on the
//     wire.
//  4. The optimizer graph applies the user's optimizer to the averages
//     through train.OptimizeWithGradients.UpdateGraphWithGradients, the
//     interface GoMLX's own gradient accumulation uses (SGD and Adam
//     implement it); it updates the variables in the context.
//
// What overlaps: the all-reduce of bucket k with the copying of later
// gradients into their buckets (step 2), and with the copying of earlier
// averages out of theirs (step 3). What cannot: any communication with the
// gradient graph, and the optimizer graph with anything (it needs every
// average). Options.ReadyBatch trades the first for fewer Ready calls.
//
// Every rank starts from rank 0's variables: the first step builds both
// graphs once in probe graphs (which creates and initializes the
// variables, optimizer state included), the ranks agree that all of them
// did, the Reducer is built over the trainable variables, and every
// variable but the context's random-number state is broadcast from rank 0.
//
// # Ranks, batches and optimizers
//
//   - Ranks in one process (inproc) may share one backend, as the example
//     and the tests do (one simplego backend, a goroutine per rank), or
//     have one each. Each rank needs its own communicator, context
//     (mlctx.New: the variables), Trainer and Hook value: a Trainer reads
//     and writes only its own context's variables and the tensors it made,
//     and its values reach other ranks only through the communicator. It
//     runs its graphs on the backend's device 0, so ranks that share a
//     backend share that device.
//   - Batches are per rank: NewDataset's batch is the examples one rank
//     takes in a step, and the step's global batch is ranks times that.
//     Averaging the ranks' gradients of their mean losses gives the
//     gradient of the mean loss over the global batch, the step one
//     process would take on it (TestEquivalence checks this).
//   - The optimizer graph hands UpdateGraphWithGradients the averages in
//     the order of Variables(): the context's order (ctx.IterVariables) of
//     the variables with v.Trainable && v.InUseByGraph(g) in the gradient
//     graph. It uses every one of them first, and no other trainable
//     variable, so an optimizer of its own must pair gradients[i] with the
//     i-th variable with v.Trainable && v.InUseByGraph(g) in the graph it
//     is given, as GoMLX's SGD and Adam do, and read no other trainable
//     variable in that graph before it has paired them.
//
// # The rest of ddpgo
//
//   - No-sync accumulation: AccumulateStep adds this rank's gradients in
//     bucket memory and communicates nothing; the next TrainStep reduces
//     the sum (PyTorch's no_sync; GoMLX's own accumulation averages).
//   - Hooks, bucket caps, the window of buckets in flight, timeouts and
//     stall reports: Options.Reducer, passed to ddp.New.
//   - Buffers: non-trainable variables that the gradient graph updates
//     (batch normalisation's running statistics) are the Reducer's
//     buffers, broadcast from rank 0 in every synced step and overlapped
//     with the all-reduces (Options.Buffers chooses them).
//   - Uneven inputs: with Options.Reducer.Join, a rank out of batches calls
//     Join, which broadcasts every variable from the rank that joined last
//     (with Shard, it steps its part in the steps it shadows instead).
//   - Statistics and the timeline: Reducer gives the ddp.Reducer
//     (StatsInto, ddp.WriteTimeline); Times splits the step into graph,
//     hand-off, reduction and optimizer.
//   - Data: Dataset yields a rank's shard of an in-memory data set in the
//     order of package sampler (PyTorch DistributedSampler's rule), as a
//     train.Dataset.
//   - Checkpoints: Save writes GoMLX's checkpoint on rank 0 only. Only rank
//     0 need load one (checkpoints.Build on its context, then New with
//     ctx.Reuse(), as with train.Trainer): the first step broadcasts rank
//     0's variables, optimizer state included. Every rank may load it too;
//     a load on other ranks without rank 0 is refused (ErrMismatch, naming
//     them), since rank 0's fresh variables would replace it. A sharded
//     optimizer gathers its state on rank 0 to save it, and loads it on
//     every rank (see "Sharded optimizer state").
//
// # Sharded optimizer state
//
// With Options.Reducer.Shard (ZeRO stage 1; package ddp, "Sharded
// optimizer state") the Reducer reduce-scatters the buckets, so each rank
// receives the averages of its own part of each only, steps that part
// alone and keeps its optimizer state alone; the Reducer then
// all-gathers the updated values, and each rank copies the others' into
// its variables.
//
//   - ddp.ShardElements (DeepSpeed's partition) gives each rank a range of
//     each bucket's elements, 1/N of it, so a variable may be split between
//     ranks. GoMLX's optimizers step whole variables and size their state
//     by the variable's shape, so the optimizer graph runs in a context of
//     the trainer's own on shadows: for each variable of which this rank
//     owns elements, a flat variable of those elements with the variable's
//     scope and name. The optimizer creates its state for the shadows, so
//     Adam's moments are named as in an unsharded run and hold this rank's
//     elements only: the state per rank is 1/N of the unsharded state plus
//     at most an element per bucket. The optimizer's scalars (the step
//     counters, the learning rate) are the same on every rank and are
//     copied into the caller's context after every step, where an
//     unsharded run keeps them. The optimizer must be elementwise (SGD,
//     Adam, AdamW: each element's update reads its own gradient and state
//     and scalars shared by all): the first step refuses state that is
//     neither one float32 per element nor the same scalars for every
//     variable, and New refuses the clip_nan hyperparameter, which zeroes a
//     variable's whole gradient.
//   - ddp.ShardParams (PyTorch's partition) gives each trainable variable
//     wholly to one rank (greedily, within each bucket), for optimizers
//     that need a whole tensor: the optimizer graph steps this rank's
//     variables themselves. A rank's state in each bucket is within 1/N of
//     the bucket's plus its largest variable's, so a model that one
//     variable dominates keeps nearly all of its state, and its optimizer's
//     work, on one rank.
//
// A rank with nothing to step (no element, or no variable under
// ShardParams) steps a one-element placeholder in a context of the
// trainer's own, so that its scalars advance with its peers'.
//
// Training gives the unsharded run's variables, step counters included,
// bit for bit where the backend's reduce-scatter sums as its all-reduce
// does (inproc; 2 processes of package mpi), since an element's update
// reads the same averaged gradient's bits and the same state (an
// optimizer that reads several variables' gradients at once, such as a
// clip by the global norm, would see only this rank's). Owned and
// OptimizerState name what this rank keeps, and Times.Gather is the
// gather's share of the step: copying the stepped values into the bucket
// memory, whose averages are spent by then, the all-gathers, and copying
// the others' values (with ShardElements, every variable's) from the
// buckets into the variables. The optimizer graph cannot overlap the reductions (it needs
// all of this rank's averages) and the gather starts after it. The status
// of the ranks (see Failures) travels in the gather, so under Shard a
// peer's failure is reported after every rank has stepped and gathered:
// the variables then hold that step's update but for the failing rank's
// own part, which it gathers unchanged. Join works with Shard: a joined
// rank keeps stepping and gathering its part in the steps it shadows.
//
// Save is collective with Shard: the other ranks' state travels to rank
// 0 for the save (PyTorch's consolidate_state_dict; with ShardElements
// through ddp.Reducer.Consolidate, into whole variables' moments made for
// the save) and is dropped after it, so the checkpoint holds the bits an
// unsharded run's holds. Any rank count loads it, unsharded on rank 0 or
// sharded on every rank (the first step refuses one loaded on some ranks
// only, ErrMismatch), each rank taking from it the state of its own
// variables or elements.
//
// # Failures
//
// A rank whose graph fails or panics must still take part in the step's
// collectives, or its peers would wait for it until their timeout. The
// Reducer's last parameter is therefore the trainer's own: one float32 per
// rank, written by every rank in every synced step (zero, or 1 at its own
// index if it failed) and marked ready first, so it travels in the first
// bucket. A failing rank marks every parameter ready and waits; after the
// step every rank reads the average, and a rank that sees a non-zero
// element fails with ErrPeer naming that rank, while the failing rank
// returns ErrGraph with its cause. No rank applies that step (with a
// sharded optimizer, see "Sharded optimizer state"). A failure in
// an AccumulateStep, which communicates nothing, is sent in a synced step
// that meets the peers' next TrainStep. The first step's failures (before
// the Reducer exists) are exchanged by one all-gather, which also checks
// that the ranks hold the same variables and that no rank loaded a
// checkpoint that rank 0's would replace (ErrMismatch). Errors are sticky:
// every later call returns the first.
//
// # Backends
//
// The pure-Go backend, simplego, builds with CGO_ENABLED=0, as does ddpgo
// without package mpi. simplego v0.26.0 cannot differentiate
// layers.Convolution (its input gradient needs the Reverse operation) or
// MaxPool (SelectAndScatter): the example builds its convolution from a
// gather and a dot, and pools with a reshape and a reduction, which it
// can. Its parallel execution of a graph's operations trips the race
// detector (the tests run it with "ops_sequential").
package ddptrain
