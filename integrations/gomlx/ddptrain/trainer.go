package ddptrain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// Errors. Every error a Trainer returns names the rank it happened on.
var (
	// ErrPeer: another rank failed in this step (its own error, on that
	// rank, says why); the error names it.
	ErrPeer = errors.New("ddptrain: a peer rank failed")
	// ErrGraph: this rank's gradient or optimizer graph failed or
	// panicked (building, compiling or running it).
	ErrGraph = errors.New("ddptrain: graph failed")
	// ErrMismatch: the ranks hold different variables (names, shapes or
	// dtypes), so they cannot train one model, or some ranks loaded
	// variables before the first step (a checkpoint) that rank 0 did not,
	// whose values its broadcast would replace.
	ErrMismatch = errors.New("ddptrain: ranks hold different variables")
	// ErrUnsupported: a trainable variable of a dtype the hand-off does not
	// carry (float32 and float64 only), an optimizer without
	// UpdateGraphWithGradients, or Options the trainer cannot honour.
	ErrUnsupported = errors.New("ddptrain: unsupported")
	// ErrClosed: the Trainer was closed.
	ErrClosed = errors.New("ddptrain: trainer closed")
)

// Options configures a Trainer. The zero value uses the Reducer's defaults
// (PyTorch DDP's 25 MiB buckets, averaging with hooks.Avg) and hands each
// gradient over as soon as it is in its bucket.
type Options struct {
	// Reducer configures the ddp.Reducer that averages the gradients:
	// bucket caps, the hook (fp16 or bf16 compression; each rank needs a
	// Hook value of its own), the window of buckets in flight, Join for
	// uneven inputs, timeouts, the pool. NoZeroGrad is always set: the
	// hand-off overwrites every gradient in the first step of an
	// accumulation window and adds to it in the others, so zeroing would
	// be a wasted pass. CopyGrads is refused: it would add two copies.
	Reducer ddp.Options

	// Buffers chooses, among the non-trainable variables that the
	// gradient graph updates (batch normalisation's running statistics),
	// those that every rank must hold equal: they travel as the Reducer's
	// buffers, broadcast from rank 0 in every synced step, overlapped with
	// the gradients' all-reduces (PyTorch's broadcast_buffers). Nil chooses
	// all but the context's random-number state, which each rank keeps
	// its own.
	Buffers func(v *mlctx.Variable) bool

	// ReadyBatch is how many gradients the hand-off copies into their
	// buckets before it marks them ready together: 0 or 1 marks each as
	// soon as it is copied, so the first bucket's all-reduce starts while
	// later gradients are still being copied; a batch as large as the
	// model marks them all at the end, after the last copy.
	ReadyBatch int

	// Timeout bounds the trainer's own collectives: the first step's
	// agreement that every rank built its graphs, and the broadcasts of
	// the variables (at the first step and after Join). 0 means
	// ddp.DefaultTimeout.
	Timeout time.Duration
}

// Times is where the time of one step went, measured on the rank's own
// goroutine: the phases do not overlap and add up to Step but for the
// step's bookkeeping.
type Times struct {
	// Graph is the gradient graph: forward, loss and backward, which
	// GoMLX runs as one execution.
	Graph time.Duration
	// HandOff is copying the gradients into bucket memory (marking each
	// ready) and the averages out into the optimizer graph's inputs.
	HandOff time.Duration
	// Reduction is the time spent waiting for the all-reduces once the
	// last gradient was handed over: what the hand-off did not hide.
	Reduction time.Duration
	// Optimizer is the optimizer graph, which applies the averages.
	Optimizer time.Duration
	// Gather, with Options.Reducer.Shard, is publishing this rank's
	// updated elements, waiting for the all-gathers and copying the
	// other ranks' elements into the variables; zero without it.
	Gather time.Duration
	// Step is the whole call.
	Step time.Duration
}

// Trainer trains one rank's replica of a GoMLX model data-parallel over a
// comm.Communicator. See the package documentation for the model. A
// Trainer belongs to one goroutine.
type Trainer struct {
	c       comm.Communicator
	backend backends.Backend
	ctx     *mlctx.Context
	model   train.ModelFn
	lossFn  train.LossFn
	opt     train.OptimizeWithGradients
	o       Options

	// Built at the first step (setup.go).
	graphs    map[any]*gradGraph
	built     *gradGraph // the graph whose variables the Reducer was built for
	trainable []*mlctx.Variable
	buffers   []*mlctx.Variable
	lossDType dtypes.DType
	optExec   *mlctx.Exec
	optIn     []*tensors.Tensor // the optimizer graph's inputs: the averaged gradients, by stepVars
	optArgs   []any
	r         *ddp.Reducer
	pool      *allocator.Pool // the trainer's own collectives (setup.go)
	leaked    bool            // a collective of the trainer's own failed in flight: the pool stays mapped
	status    int             // the index of the status parameter (failure.go)

	// The optimizer graph steps stepVars, the variables of its context,
	// which are the trainable variables (all of them, or, with
	// ShardParams, this rank's), or, with ShardElements, their shadows
	// (elements.go). stepParam[j] is the parameter stepVars[j] holds
	// (span: which elements of it), -1 for none; optIn[j] is its input.
	stepVars  []*mlctx.Variable
	stepParam []int
	span      []ddp.Part // by parameter: the elements the optimizer graph takes
	input     []int      // by parameter: its index in optIn, -1 for none

	// Options.Reducer.Shard (shard.go).
	shard    bool
	stepped  []bool            // by parameter: this rank's optimizer steps the variable itself
	values   [][]float32       // by parameter: the gather's values, its bucket view
	optState []*mlctx.Variable // the variables the optimizer graph created
	nbuckets int
	el       *elementShard // ShardElements (elements.go); nil otherwise
	// The optimizer's context when it is not the caller's (elements.go):
	// with ShardElements, or for a rank that owns no variable under
	// ShardParams. mirrors pairs each scalar the optimizer keeps there
	// (step counters, learning rate) with the caller's context's.
	octx    *mlctx.Context
	mirrors [][2]*mlctx.Variable

	args     []any  // the gradient graph's arguments, reused
	batch    []int  // gradients copied and not yet marked ready
	marked   []bool // parameters marked ready in this step
	fresh    bool   // the next step starts an accumulation window
	steps    uint64
	times    Times
	failed   []int // ranks found failed by the last synced step
	copyOut  func(ddp.Reduced)
	outErr   error         // the first error of copyOut
	copyTime time.Duration // spent in copyOut in this step
	err      error         // sticky
	closed   bool
}

// New returns a Trainer for rank c.Rank() of c's group. ctx holds the
// model's variables and hyperparameters, as for train.NewTrainer; model
// and loss are GoMLX's ModelFn and LossFn (loss may be nil if the model
// adds its loss terms with train.AddLoss); opt must implement
// train.OptimizeWithGradients, as GoMLX's SGD and Adam do. Its
// UpdateGraphWithGradients gets the averaged gradients in the order of
// Variables(), and must pair them with the variables as GoMLX's do: the
// i-th gradient is that of the i-th variable, in the context's order, with
// v.Trainable && v.InUseByGraph(g) (see the package documentation,
// "Ranks, batches and optimizers"). Ranks in one process may share one
// backend; each needs a ctx of its own.
//
// New communicates nothing: the variables do not exist until the first
// graph is built. The first TrainStep (or Setup) builds both graphs, agrees
// with every rank that they did, builds the ddp.Reducer over the trainable
// variables and broadcasts every variable from rank 0, so that every rank
// starts from rank 0's weights; every rank must take it.
func New(c comm.Communicator, backend backends.Backend, ctx *mlctx.Context, model train.ModelFn, loss train.LossFn,
	opt optimizers.Interface, o Options) (*Trainer, error) {
	owg, ok := opt.(train.OptimizeWithGradients)
	switch {
	case c == nil || backend == nil || ctx == nil || model == nil:
		return nil, fmt.Errorf("%w: New needs a communicator, a backend, a context and a model", ErrUnsupported)
	case !ok:
		return nil, fmt.Errorf("%w: optimizer %T has no UpdateGraphWithGradients (train.OptimizeWithGradients); GoMLX's SGD and Adam have", ErrUnsupported, opt)
	case o.Reducer.CopyGrads:
		return nil, fmt.Errorf("%w: Options.Reducer.CopyGrads would copy every gradient twice more; the trainer copies into bucket memory itself", ErrUnsupported)
	case len(o.Reducer.Buffers) > 0:
		return nil, fmt.Errorf("%w: Options.Reducer.Buffers: the trainer finds the buffers itself (Options.Buffers chooses them)", ErrUnsupported)
	case o.ReadyBatch < 0:
		return nil, fmt.Errorf("%w: Options.ReadyBatch %d < 0", ErrUnsupported, o.ReadyBatch)
	case o.Reducer.Shard == ddp.ShardElements && mlctx.GetParamOr(ctx, optimizers.ParamClipNaN, false):
		return nil, fmt.Errorf("%w: Options.Reducer.Shard ShardElements with the %q hyperparameter: it zeroes a variable's whole gradient if any element is not finite, and each rank would see only its elements; use ShardParams",
			ErrUnsupported, optimizers.ParamClipNaN)
	}
	if o.Timeout == 0 {
		o.Timeout = ddp.DefaultTimeout
	}
	if o.ReadyBatch == 0 {
		o.ReadyBatch = 1
	}
	o.Reducer.NoZeroGrad = true
	// As train.NewTrainer does: the learning rate is read again from the
	// optimizer's configuration or the context's hyperparameters, not
	// from a checkpoint.
	if err := ctx.DeleteVariable(ctx.In(optimizers.Scope).Scope(), optimizers.ParamLearningRate); err != nil {
		return nil, err
	}
	t := &Trainer{c: c, backend: backend, ctx: ctx, model: model, lossFn: loss, opt: owg, o: o,
		graphs: make(map[any]*gradGraph), fresh: true, shard: o.Reducer.Shard != ddp.ShardOff}
	if o.Reducer.Shard == ddp.ShardElements {
		t.el = &elementShard{}
	}
	t.copyOut = t.copyAverages
	return t, nil
}

// Rank returns the trainer's rank.
func (t *Trainer) Rank() int { return t.c.Rank() }

// Reducer returns the ddp.Reducer that averages the gradients, for its
// statistics (StatsInto, WriteTimeline) and layout; nil before the first
// step. Its parameters are the trainable variables in the context's order,
// named by their scope and name, then one of the trainer's own (see the
// package documentation, "Failures"). Steps go through the Trainer.
func (t *Trainer) Reducer() *ddp.Reducer { return t.r }

// Variables returns the trainable variables whose gradients are averaged,
// in the Reducer's parameter order; nil before the first step.
func (t *Trainer) Variables() []*mlctx.Variable { return t.trainable }

// Buffers returns the variables kept equal as the Reducer's buffers
// (Options.Buffers); nil before the first step.
func (t *Trainer) Buffers() []*mlctx.Variable { return t.buffers }

// Times returns where the time of the last step went.
func (t *Trainer) Times() Times { return t.times }

// TrainStep runs one synced step on this rank's batch: the gradient graph,
// the hand-off of the gradients into the Reducer's buckets (the all-reduces
// start as buckets fill), the wait for the averages, and the optimizer
// graph that applies them. spec, inputs and labels are what a
// train.Dataset yields, as for train.Trainer.TrainStep. It returns this
// rank's loss on its batch.
//
// If a rank's graph fails or panics, that rank's TrainStep returns an
// error wrapping ErrGraph and every other rank's returns one wrapping
// ErrPeer naming it, in the same step; the variables are then left as they
// were and every later call fails.
func (t *Trainer) TrainStep(ctx context.Context, spec any, inputs, labels []*tensors.Tensor) (float64, error) {
	return t.step(ctx, ddp.Sync, spec, inputs, labels)
}

// AccumulateStep runs the gradient graph on this rank's batch and adds
// the gradients to the Reducer's (PyTorch's no_sync): nothing is
// communicated and the optimizer does not run. The next TrainStep reduces
// the sum of the accumulated gradients and its own, so scale the loss by
// the number of micro-batches for their mean. It returns this rank's loss.
//
// A rank whose graph fails here tells its peers at once, in a synced step
// of its own that matches their next TrainStep (which then fails with
// ErrPeer): its peers must still reach one.
func (t *Trainer) AccumulateStep(ctx context.Context, spec any, inputs, labels []*tensors.Tensor) (float64, error) {
	return t.step(ctx, ddp.NoSync, spec, inputs, labels)
}

// Setup builds the graphs for batches like inputs and labels, agrees with
// every rank that they did, builds the Reducer and broadcasts rank 0's
// variables, without training. The first TrainStep or AccumulateStep does
// it if it was not done; call it before Join on a rank that may have no
// batch at all. It is collective.
func (t *Trainer) Setup(ctx context.Context, spec any, inputs, labels []*tensors.Tensor) error {
	if err := t.usable(); err != nil {
		return err
	}
	if t.r != nil {
		return nil
	}
	t.err = t.setup(ctx, spec, inputs, labels)
	return t.err
}

// Join is ddp.Reducer.Join for a rank that has run out of batches
// (Options.Reducer.Join set): it shadows the peers' remaining synced steps
// with zero gradients until every rank has joined, then broadcasts every
// variable (weights and optimizer state) from the rank that joined last,
// whose replica saw every step, and returns that rank. With
// Options.Reducer.Shard (ddp.Reducer.JoinEach) the rank also steps and
// gathers its own part in each step it shadows, since its peers wait for
// it, and only the variables no one steps are broadcast: every rank ends
// with the unsharded run's variables, and keeps its own optimizer state.
func (t *Trainer) Join(ctx context.Context) (int, error) {
	if err := t.usable(); err != nil {
		return -1, err
	}
	if t.r == nil {
		return -1, t.fail(fmt.Errorf("%w: rank %d: Join before the first step (call Setup)", ErrUnsupported, t.c.Rank()))
	}
	if t.shard {
		return t.joinSharded(ctx)
	}
	root, err := t.r.Join(ctx)
	if err != nil {
		return -1, t.fail(fmt.Errorf("ddptrain: rank %d: join: %w", t.c.Rank(), err))
	}
	if err := t.syncVariables(ctx, root, true); err != nil {
		return -1, t.fail(err)
	}
	t.fresh = true
	return root, nil
}

// Close releases the Reducer, the graphs and the trainer's memory. It does
// not close the communicator or the context. Close is idempotent.
func (t *Trainer) Close() error {
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	if t.r != nil {
		errs = append(errs, t.r.Close())
	}
	for _, gg := range t.graphs {
		gg.exec.Finalize()
	}
	if t.optExec != nil {
		t.optExec.Finalize()
	}
	if t.octx != nil {
		t.octx.Finalize()
	}
	for _, x := range t.optIn {
		if x != nil {
			x.FinalizeAll()
		}
	}
	if t.pool != nil && !t.leaked {
		errs = append(errs, t.pool.Close())
	}
	return errors.Join(errs...)
}

// usable returns the sticky error, or ErrClosed.
func (t *Trainer) usable() error {
	if t.closed {
		return fmt.Errorf("%w: rank %d", ErrClosed, t.c.Rank())
	}
	return t.err
}

// fail makes err sticky and returns it.
func (t *Trainer) fail(err error) error {
	if t.err == nil {
		t.err = err
	}
	return err
}

// step is TrainStep and AccumulateStep.
func (t *Trainer) step(ctx context.Context, mode ddp.SyncMode, spec any, inputs, labels []*tensors.Tensor) (float64, error) {
	if err := t.usable(); err != nil {
		return 0, err
	}
	if t.r == nil {
		if err := t.Setup(ctx, spec, inputs, labels); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	t.steps++
	t.times = Times{}
	if err := t.r.Begin(mode); err != nil {
		return 0, t.fail(fmt.Errorf("ddptrain: rank %d: step %d: %w", t.c.Rank(), t.steps, err))
	}
	clear(t.marked)
	outs, graphErr := t.runGradients(spec, inputs, labels)
	graphDone := time.Now()
	t.times.Graph = graphDone.Sub(start)
	if graphErr != nil {
		graphErr = fmt.Errorf("%w: rank %d: step %d: gradient graph: %w", ErrGraph, t.c.Rank(), t.steps, graphErr)
		return 0, t.fail(t.tellPeers(ctx, mode, graphErr))
	}
	defer finalizeAll(outs)
	loss := scalar(outs[0])
	if err := t.handIn(mode, outs[1:]); err != nil {
		err = fmt.Errorf("ddptrain: rank %d: step %d: hand-off: %w", t.c.Rank(), t.steps, err)
		return 0, t.fail(t.tellPeers(ctx, mode, err))
	}
	handedIn := time.Now()
	t.times.HandOff = handedIn.Sub(graphDone)
	if mode == ddp.NoSync {
		t.fresh = false
		t.times.Step = time.Since(start)
		return loss, nil
	}
	if err := t.wait(ctx); err != nil {
		return 0, t.fail(err)
	}
	reduced := time.Now()
	// The averages were copied out while later buckets were reduced: that
	// time is the hand-off's.
	t.times.Reduction = reduced.Sub(handedIn) - t.copyTime
	t.times.HandOff += t.copyTime
	t.fresh = true
	if t.shard {
		loss, err := t.finishSharded(ctx, loss)
		end := time.Now()
		t.times.Optimizer = end.Sub(reduced) - t.times.Gather
		t.times.Step = end.Sub(start)
		return loss, err
	}
	if err := t.applyOptimizer(); err != nil {
		// The peers applied the step; this rank's replica no longer
		// matches theirs. Tell them in their next synced step.
		err = fmt.Errorf("%w: rank %d: step %d: optimizer graph: %w", ErrGraph, t.c.Rank(), t.steps, err)
		return 0, t.fail(t.tellPeers(ctx, ddp.NoSync, err))
	}
	end := time.Now()
	t.times.Optimizer = end.Sub(reduced)
	t.times.Step = end.Sub(start)
	return loss, nil
}

// runGradients runs the gradient graph for spec, building it first if
// needed, with panics turned into errors.
func (t *Trainer) runGradients(spec any, inputs, labels []*tensors.Tensor) (outs []*tensors.Tensor, err error) {
	gg, err := t.gradGraphFor(spec, len(inputs), len(labels))
	if err != nil {
		return nil, err
	}
	t.args = t.args[:0]
	for _, x := range inputs {
		t.args = append(t.args, x)
	}
	for _, x := range labels {
		t.args = append(t.args, x)
	}
	err = catch(func() error {
		var err error
		outs, err = gg.exec.Exec(t.args...)
		return err
	})
	clear(t.args) // the tensors are the caller's
	if err != nil {
		return nil, err
	}
	if err := gg.check(t); err != nil {
		finalizeAll(outs)
		return nil, err
	}
	if len(outs) != 1+len(t.trainable) {
		finalizeAll(outs)
		return nil, fmt.Errorf("the gradient graph returned %d tensors, want the loss and %d gradients", len(outs), len(t.trainable))
	}
	return outs, nil
}

// applyOptimizer runs the optimizer graph on the averaged gradients.
func (t *Trainer) applyOptimizer() error {
	if t.optExec == nil {
		return nil // a sharded optimizer and no variable of this rank's
	}
	err := catch(func() error {
		outs, err := t.optExec.Exec(t.optArgs...)
		finalizeAll(outs)
		return err
	})
	if err == nil {
		err = t.mirror(false)
	}
	return err
}

// catch runs f and returns its error, or the panic it raised as one.
func catch(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if e, ok := p.(error); ok {
				err = fmt.Errorf("panic: %w", e)
			} else {
				err = fmt.Errorf("panic: %v", p)
			}
		}
	}()
	return f()
}

// finalizeAll hands the tensors' memory back to the backend at once,
// rather than to the garbage collector.
func finalizeAll(ts []*tensors.Tensor) {
	for _, x := range ts {
		if x != nil {
			x.FinalizeAll()
		}
	}
}

// scalar returns a scalar tensor's value as a float64 (0 if it is not a
// float scalar).
func scalar(x *tensors.Tensor) float64 {
	var v float64
	_ = x.ConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []float32:
			if len(f) > 0 {
				v = float64(f[0])
			}
		case []float64:
			if len(f) > 0 {
				v = f[0]
			}
		}
	})
	return v
}
