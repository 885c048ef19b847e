package ddptrain

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/ddpgo/ddpgo/ddp"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
)

// A sharded optimizer (Options.Reducer.Shard): the Reducer gives each
// rank a part of each bucket, whole trainable variables (ShardParams) or
// a range of elements (ShardElements, elements.go), and reduce-scatters
// each bucket, so a rank receives the averages of its own part only. Its
// optimizer graph takes those averages, and creates state for its part
// alone and updates it alone. Then every rank copies its part's new
// values into the bucket memory, where the averages were spent (the
// gather's values are the gradients' bucket views: no copy of the model
// of the trainer's own), Gather publishes every bucket, and after
// WaitGather the buckets hold every rank's values, which each rank
// copies into the variables it did not step itself. The trainer's status
// travels the same way: the ranks that own its elements leave the
// averaged status in place, and every rank reads it after the gather, so
// that a peer's failure is known only once the ranks have stepped and
// gathered their variables (failure.go).

// setupShard is the first step's work, after the Reducer, when the
// optimizer is sharded: it finds the elements this rank owns, builds the
// optimizer graph for them (creating their state) and agrees with every
// rank that it did.
func (t *Trainer) setupShard(ctx context.Context) error {
	rank := t.c.Rank()
	t.nbuckets = len(t.r.Buckets())
	t.stepped = make([]bool, len(t.trainable))
	t.span = make([]ddp.Part, len(t.trainable))
	for i := range t.span {
		t.span[i] = ddp.Part{Param: i}
	}
	var built error
	for k := range t.nbuckets {
		for _, pt := range t.r.Owned(k) {
			size := 0
			if pt.Param != t.status {
				size = t.trainable[pt.Param].Shape().Size()
			}
			switch {
			case pt.Param == t.status, pt.Hi == pt.Lo:
			case t.span[pt.Param].Hi > t.span[pt.Param].Lo:
				built = fmt.Errorf("%w: rank %d: the Reducer gave this rank two parts of %s, [%d, %d) and [%d, %d)",
					ErrUnsupported, rank, t.trainable[pt.Param].ScopeAndName(), t.span[pt.Param].Lo, t.span[pt.Param].Hi, pt.Lo, pt.Hi)
			case t.el == nil && (pt.Lo != 0 || pt.Hi != size):
				built = fmt.Errorf("%w: rank %d: the Reducer gave this rank elements [%d, %d) of %s, not all %d: the trainer needs whole variables (ShardParams)",
					ErrUnsupported, rank, pt.Lo, pt.Hi, t.trainable[pt.Param].ScopeAndName(), size)
			default:
				t.span[pt.Param] = pt
				t.stepped[pt.Param] = t.el == nil
			}
		}
	}
	t.values = make([][]float32, len(t.trainable)+1)
	if built == nil {
		build := func() error {
			if t.stepWhole(); len(t.stepVars) == 0 {
				// No variable of this rank's: its step counters
				// advance with a placeholder's step.
				return t.buildOwnOptimizer(func(*mlctx.Context) error { return nil })
			}
			return t.buildOptimizer(t.ctx)
		}
		if t.el != nil {
			build = t.buildElements
		}
		if built = catch(build); built != nil {
			built = fmt.Errorf("%w: rank %d: building the optimizer graph for its elements: %w", ErrGraph, rank, built)
		}
	}
	return t.agree(ctx, built, 0)
}

// gather ends a synced step of a sharded optimizer: it publishes the
// values of the elements this rank stepped (and the averaged status, if
// it owns some of it: it is in place), waits for every rank's and copies
// them into the variables it did not step itself (with ShardElements,
// all of them), and reads the status into t.failed. A failure to read or
// write a variable is this rank's alone (t.outErr); the step's collectives
// complete regardless. The error is the Reducer's.
func (t *Trainer) gather(ctx context.Context) error {
	t.failed = t.failed[:0]
	for p := range t.values {
		// The bucket views: the averages there were spent (copied into
		// the optimizer's inputs), and after WaitGather they hold
		// every rank's values.
		g, err := t.r.Grad(p)
		if err != nil {
			return fmt.Errorf("ddptrain: rank %d: step %d: %w", t.c.Rank(), t.steps, err)
		}
		t.values[p] = g
	}
	t.readOwned(t.values)
	if err := t.gatherAll(t.values); err != nil {
		return err
	}
	if err := t.r.WaitGather(ctx); err != nil {
		return fmt.Errorf("ddptrain: rank %d: step %d: %w", t.c.Rank(), t.steps, err)
	}
	for i, v := range t.trainable {
		if !t.stepped[i] {
			t.note(writeVariable(v, t.values[i]))
		}
	}
	t.readFailed(t.values[t.status])
	clear(t.values) // the views are gradients again at the next Begin
	return nil
}

// readOwned copies the values of the elements this rank stepped into
// values (the stepped variables', or the shadows').
func (t *Trainer) readOwned(values [][]float32) {
	for j, v := range t.stepVars {
		if p := t.stepParam[j]; p >= 0 {
			t.note(readVariable(v, values[p][t.span[p].Lo:t.span[p].Hi]))
		}
	}
}

// gatherAll has every bucket gathered from values.
func (t *Trainer) gatherAll(values [][]float32) error {
	for k := range t.nbuckets {
		if err := t.r.Gather(k, values); err != nil {
			return fmt.Errorf("ddptrain: rank %d: step %d: %w", t.c.Rank(), t.steps, err)
		}
	}
	return nil
}

// readFailed reads the gathered status of the ranks into t.failed.
func (t *Trainer) readFailed(status []float32) {
	t.failed = t.failed[:0]
	for r, x := range status {
		if x != 0 {
			t.failed = append(t.failed, r)
		}
	}
}

// joinFault, set by the package's tests only, fails a joined rank's
// shadowed step (after its optimizer graph) when it returns an error.
var joinFault func(rank int, step uint64) error

// joinSharded is Join with a sharded optimizer. A joined rank still owns
// its part of every bucket, and its peers' steps wait for its gathers:
// in every step they still take, it copies its part's averages (its own
// gradients were zeros) into the optimizer graph's inputs, steps its
// variables or shadows, and gathers them, as in a step of its own, so
// its part keeps training with its peers' (PyTorch's join hook for
// ZeroRedundancyOptimizer steps the optimizer likewise). The gathers go
// into the Reducer's Values memory, which the averages of the next step
// do not overwrite: once every rank has joined, it holds the model of the
// last step, which the rank copies into the variables it did not step
// itself. The variables no one steps (the buffers) are then broadcast
// from the rank that joined last, as Join does unsharded.
func (t *Trainer) joinSharded(ctx context.Context) (int, error) {
	rank := t.c.Rank()
	values := make([][]float32, len(t.values))
	for p := range values {
		v, err := t.r.Values(p)
		if err != nil {
			return -1, t.fail(fmt.Errorf("ddptrain: rank %d: join: %w", rank, err))
		}
		values[p] = v
	}
	var stepErr, optErr error
	shadowed := 0
	t.outErr, t.failed = nil, t.failed[:0]
	each := func(red ddp.Reduced) {
		if red.Bucket == 0 && shadowed > 0 && len(t.failed) == 0 {
			t.readFailed(values[t.status]) // the step before's
		}
		t.copyAverages(red)
		for _, pt := range red.Owned {
			if pt.Param == t.status {
				// The averaged status travels on, as in a step.
				g, err := t.r.Grad(pt.Param)
				if err != nil {
					stepErr = cmp.Or(stepErr, err)
					return
				}
				copy(values[pt.Param][pt.Lo:pt.Hi], g[pt.Lo:pt.Hi])
			}
		}
		if red.Bucket != t.nbuckets-1 {
			return
		}
		t.steps++
		shadowed++
		if t.outErr == nil && optErr == nil {
			err := t.applyOptimizer()
			if joinFault != nil {
				err = cmp.Or(err, joinFault(rank, t.steps))
			}
			if err != nil {
				optErr = fmt.Errorf("%w: rank %d: step %d (joined): optimizer graph: %w", ErrGraph, rank, t.steps, err)
			}
		}
		if t.outErr == nil && optErr == nil {
			t.readOwned(values)
		}
		if t.outErr != nil || optErr != nil {
			// No step of this rank's follows in which to tell the
			// peers, so it aborts the group with the cause and does
			// not gather (which fails its Reducer too): the peers fail
			// at once rather than train on this rank's stale part.
			cause := optErr
			if cause == nil {
				cause = fmt.Errorf("ddptrain: rank %d: step %d (joined): copying the averages or the variables: %w", rank, t.steps, t.outErr)
			}
			t.c.Abort(cause)
			return
		}
		stepErr = cmp.Or(stepErr, t.gatherAll(values))
	}
	root, err := t.r.JoinEach(ctx, each)
	switch {
	case optErr != nil:
		return -1, t.fail(optErr)
	case t.outErr != nil:
		return -1, t.fail(fmt.Errorf("ddptrain: rank %d: joined: step %d: copying the averages or the variables: %w", rank, t.steps, t.outErr))
	}
	if err = cmp.Or(err, stepErr); err != nil {
		return -1, t.fail(fmt.Errorf("ddptrain: rank %d: join: %w", rank, err))
	}
	if shadowed > 0 {
		if len(t.failed) == 0 {
			t.readFailed(values[t.status])
		}
		for i, v := range t.trainable {
			if !t.stepped[i] {
				t.note(writeVariable(v, values[i]))
			}
		}
	}
	switch {
	case len(t.failed) > 0:
		return -1, t.fail(fmt.Errorf("%w: rank %d: joined, %s failed in a step it shadowed (its own error says why)", ErrPeer, rank, rankList(t.failed)))
	case t.outErr != nil:
		return -1, t.fail(fmt.Errorf("ddptrain: rank %d: joined: writing the gathered values into the variables: %w", rank, t.outErr))
	}
	if err := t.syncVariables(ctx, root, false); err != nil {
		return -1, t.fail(err)
	}
	t.fresh = true
	return root, nil
}

// note records err as the step's first local failure.
func (t *Trainer) note(err error) {
	if err != nil && t.outErr == nil {
		t.outErr = err
	}
}

// readVariable copies float32 variable v's value into dst.
func readVariable(v *mlctx.Variable, dst []float32) error {
	value, err := v.Value()
	if err == nil {
		err = fromTensor(value, dst, true)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", v.ScopeAndName(), err)
	}
	return nil
}

// writeVariable copies src into float32 variable v's value.
func writeVariable(v *mlctx.Variable, src []float32) error {
	value, err := v.Value()
	if err == nil {
		err = toTensor(value, src)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", v.ScopeAndName(), err)
	}
	return nil
}

// finishSharded is the rest of a synced step of a sharded optimizer,
// once the averages are in: the optimizer graph on this rank's variables,
// then the gather.
func (t *Trainer) finishSharded(ctx context.Context, loss float64) (float64, error) {
	var optErr error
	if t.outErr == nil {
		optErr = t.applyOptimizer()
	}
	stepped := time.Now()
	if err := t.gather(ctx); err != nil {
		return 0, t.fail(err)
	}
	t.times.Gather = time.Now().Sub(stepped)
	switch {
	case len(t.failed) > 0:
		return 0, t.fail(fmt.Errorf("%w: rank %d: step %d: %s failed (its own error says why)", ErrPeer, t.c.Rank(), t.steps, rankList(t.failed)))
	case t.outErr != nil:
		// The peers applied the step; tell them in their next one.
		err := fmt.Errorf("ddptrain: rank %d: step %d: copying the averages or the variables: %w", t.c.Rank(), t.steps, t.outErr)
		return 0, t.fail(t.tellPeers(ctx, ddp.NoSync, err))
	case optErr != nil:
		err := fmt.Errorf("%w: rank %d: step %d: optimizer graph: %w", ErrGraph, t.c.Rank(), t.steps, optErr)
		return 0, t.fail(t.tellPeers(ctx, ddp.NoSync, err))
	}
	return loss, nil
}

// Owned returns the trainable variables whose optimizer state this rank
// keeps and whose update it computes: all of them, or, with
// Options.Reducer.Shard, those of which the Reducer gave this rank some
// elements (with ShardElements, the Reducer's Owned says which). nil
// before the first step.
func (t *Trainer) Owned() []*mlctx.Variable {
	if t.stepped == nil {
		return nil
	}
	var out []*mlctx.Variable
	for i, v := range t.trainable {
		if t.span[i].Hi > t.span[i].Lo {
			out = append(out, v)
		}
	}
	return out
}

// OptimizerState returns the variables the optimizer graph created on
// this rank (Adam's moments, its step counters, the learning rate): with
// Options.Reducer.Shard, the state of the Owned variables only. With
// ShardElements they are variables of the trainer's own context, named
// as in the caller's, whose state variables hold this rank's elements of
// each Owned variable, flat: the caller's context holds the scalars only
// (see the package documentation, "Sharded optimizer state"). nil before
// the first step.
func (t *Trainer) OptimizerState() []*mlctx.Variable { return t.optState }
