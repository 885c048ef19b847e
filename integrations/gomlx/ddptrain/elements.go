package ddptrain

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
)

// A sharded optimizer by elements (Options.Reducer.Shard =
// ddp.ShardElements): the Reducer gives each rank a range of each
// bucket's elements, so a rank may own part of a variable. GoMLX's
// optimizers step whole variables and size their state by the variable's
// shape, so the optimizer graph runs in a context of the trainer's own
// (octx) on shadows: for each variable of which this rank owns elements
// [lo, hi), a flat variable of hi-lo elements with the variable's scope
// and name, holding those elements. The optimizer creates its state for
// the shadows, so it is named as in an unsharded run and holds this
// rank's elements of it; its scalars (the step counters, the learning
// rate) are the same on every rank and are mirrored into the caller's
// context after every step, where an unsharded run keeps them. An
// elementwise optimizer (SGD, Adam, AdamW) then gives each owned element
// the bits an unsharded run gives it, from the same averaged gradient's
// bits. The gather reads the shadows into the buckets, and every rank
// writes the gathered values into all its variables.
//
// The shadows follow the variables' order, which is the order
// UpdateGraphWithGradients pairs gradients with (Trainable &&
// InUseByGraph). A rank that owns no element of any variable steps a
// one-element placeholder with a zero gradient, so that its scalars still
// advance; so does a rank that owns no variable under ShardParams.

// elementShard is what a trainer keeps for ShardElements, besides
// t.octx.
type elementShard struct {
	// kinds[p] is the per-element state the optimizer keeps for variable
	// p, as an unsharded run names and shapes it (the whole variable's
	// shape), in the order it creates it.
	kinds [][]stateSpec
	// state[p][j] is this rank's elements of kinds[p][j] in octx; nil
	// where the rank owns none of variable p.
	state [][]*mlctx.Variable
}

// placeholderScope and placeholderName name the variable a rank without
// elements steps.
const placeholderScope, placeholderName = "/ddptrain", "placeholder"

// buildElements learns the optimizer's state of each variable, makes the
// shadows of this rank's elements in a context of the trainer's own and
// builds the optimizer graph on them (creating their state), and takes
// this rank's elements of a checkpoint's state.
func (t *Trainer) buildElements() error {
	el := t.el
	var scalars []string
	el.kinds = make([][]stateSpec, len(t.trainable))
	for p, v := range t.trainable {
		kinds, sc, err := t.probeState(v)
		if err != nil {
			return err
		}
		if p == 0 {
			scalars = sc
		} else if !slices.Equal(sc, scalars) {
			return fmt.Errorf("%w: the optimizer keeps scalars %v for %s and %v for %s: ShardElements needs state that is the same for every variable, or one value per element",
				ErrUnsupported, sc, v.ScopeAndName(), scalars, t.trainable[0].ScopeAndName())
		}
		el.kinds[p] = kinds
	}
	err := t.buildOwnOptimizer(func(octx *mlctx.Context) error {
		for p, v := range t.trainable {
			sp := t.span[p]
			if sp.Hi == sp.Lo {
				continue
			}
			if v.ScopeAndName() == mlctx.JoinScope(placeholderScope, placeholderName) {
				return fmt.Errorf("%w: variable %s has the name of the trainer's own", ErrUnsupported, v.ScopeAndName())
			}
			shadow := octx.InAbsPath(v.Scope()).VariableWithValue(v.Name(), tensors.FromShape(shapes.Make(dtypes.Float32, sp.Hi-sp.Lo)))
			t.stepVars = append(t.stepVars, shadow)
			t.stepParam = append(t.stepParam, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	el.state = make([][]*mlctx.Variable, len(t.trainable))
	for p := range t.trainable {
		sp := t.span[p]
		if sp.Hi == sp.Lo {
			continue
		}
		for _, s := range el.kinds[p] {
			v := t.octx.GetVariableByScopeAndName(s.scope, s.name)
			if v == nil || v.Shape().Size() != sp.Hi-sp.Lo {
				return fmt.Errorf("%w: the optimizer did not create %s/%s for this rank's %d elements of %s as it did for a probe",
					ErrUnsupported, s.scope, s.name, sp.Hi-sp.Lo, t.trainable[p].ScopeAndName())
			}
			el.state[p] = append(el.state[p], v)
		}
	}
	return t.loadElements()
}

// buildOwnOptimizer builds the optimizer graph in a context of the
// trainer's own, t.octx, on the variables add makes there (t.stepVars),
// or on a placeholder if it makes none, and mirrors the scalars the
// optimizer creates into the caller's context.
func (t *Trainer) buildOwnOptimizer(add func(octx *mlctx.Context) error) error {
	t.octx = t.newOptContext()
	if err := add(t.octx); err != nil {
		return err
	}
	if len(t.stepVars) == 0 {
		t.stepVars = append(t.stepVars, t.octx.InAbsPath(placeholderScope).VariableWithValue(placeholderName, tensors.FromShape(shapes.Make(dtypes.Float32, 1))))
		t.stepParam = append(t.stepParam, -1)
	}
	if err := t.buildOptimizer(t.octx); err != nil {
		return err
	}
	for _, v := range t.optState {
		if !v.Shape().IsScalar() {
			continue
		}
		value, err := v.Value()
		if err != nil {
			return err
		}
		c, err := value.LocalClone()
		if err != nil {
			return err
		}
		// A checkpoint's value (the step counters) wins over the new one.
		mine := t.ctx.Checked(false).InAbsPath(v.Scope()).VariableWithValue(v.Name(), c).SetTrainable(false)
		t.mirrors = append(t.mirrors, [2]*mlctx.Variable{mine, v})
	}
	return nil
}

// probeState builds the optimizer graph, in a context of its own, for a
// two-element variable named as v, and returns the per-element state the
// optimizer created (named as for v, shaped as v) and the names of the
// scalars it created. State of any other shape is refused: the optimizer
// is not elementwise.
func (t *Trainer) probeState(v *mlctx.Variable) (kinds []stateSpec, scalars []string, err error) {
	const n = 2 // not 1, which a per-variable vector of one could be
	sc := t.newOptContext()
	defer sc.Finalize()
	shadow := sc.InAbsPath(v.Scope()).VariableWithValue(v.Name(), tensors.FromShape(shapes.Make(dtypes.Float32, n)))
	err = t.probe("ddptrain optimizer state probe", []shapes.Shape{shadow.Shape()}, func(nodes []*graph.Node) {
		t.optimizerGraphOf(sc, []*mlctx.Variable{shadow}, nodes)
	})
	if err != nil {
		return nil, nil, err
	}
	for s := range sc.IterVariables() {
		switch {
		case s == shadow:
		case s.Shape().IsScalar():
			scalars = append(scalars, s.ScopeAndName())
		case s.Shape().Rank() == 1 && s.Shape().Size() == n && s.DType() == dtypes.Float32:
			kinds = append(kinds, stateSpec{scope: s.Scope(), name: s.Name(), Shape: shapes.Make(s.DType(), v.Shape().Dimensions...)})
		default:
			return nil, nil, fmt.Errorf("%w: the optimizer's state %s for %s is %s, not one float32 per element nor a scalar: ShardElements needs an elementwise optimizer (ShardParams does not)",
				ErrUnsupported, s.ScopeAndName(), v.ScopeAndName(), s.Shape())
		}
	}
	return kinds, scalars, nil
}

// newOptContext returns an empty context with the caller's
// hyperparameters, for the optimizer.
func (t *Trainer) newOptContext() *mlctx.Context {
	c := mlctx.New()
	t.ctx.EnumerateParams(func(scope, key string, value any) { c.InAbsPath(scope).SetParam(key, value) })
	return c.Checked(false)
}

// loadElements takes this rank's elements of the per-element state that
// the caller's context holds or its loader has (a checkpoint, which holds
// the whole variables' state), and drops the rest: the caller's context
// keeps no per-element state.
func (t *Trainer) loadElements() error {
	el := t.el
	for p := range t.trainable {
		sp := t.span[p]
		for j, s := range el.kinds[p] {
			if el.state[p] != nil {
				if full := t.ctx.GetVariableByScopeAndName(s.scope, s.name); full != nil {
					if !full.Shape().Equal(s.Shape) {
						return fmt.Errorf("%w: %s/%s is %s, want %s", ErrMismatch, s.scope, s.name, full.Shape(), s.Shape)
					}
					if err := copyElements(el.state[p][j], full, sp.Lo, sp.Hi); err != nil {
						return err
					}
				}
			}
			if err := t.ctx.DeleteVariable(s.scope, s.name); err != nil {
				return err
			}
		}
	}
	return nil
}

// fillShadows gives the shadows their variables' elements, and the
// optimizer's scalars in the trainer's context the caller's context's
// values.
func (t *Trainer) fillShadows() error {
	if t.octx == nil {
		return nil
	}
	for j, v := range t.stepVars {
		if p := t.stepParam[j]; p >= 0 && t.el != nil {
			if err := copyElements(v, t.trainable[p], t.span[p].Lo, t.span[p].Hi); err != nil {
				return err
			}
		}
	}
	return t.mirror(true)
}

// mirror copies the optimizer's scalars from the caller's context into
// the trainer's (in), or back.
func (t *Trainer) mirror(in bool) error {
	for _, m := range t.mirrors {
		dst, src := m[0], m[1]
		if in {
			dst, src = src, dst
		}
		if err := copyElements(dst, src, 0, 1); err != nil {
			return err
		}
	}
	return nil
}

// copyElements copies elements [lo, hi) of src's value, flat, into dst's,
// which holds hi-lo elements of src's dtype.
func copyElements(dst, src *mlctx.Variable, lo, hi int) error {
	from, err := src.Value()
	if err != nil {
		return fmt.Errorf("%s: %w", src.ScopeAndName(), err)
	}
	to, err := dst.Value()
	if err != nil {
		return fmt.Errorf("%s: %w", dst.ScopeAndName(), err)
	}
	size := from.DType().Size()
	if to.DType() != from.DType() || to.Shape().Size() != hi-lo || hi > from.Shape().Size() {
		return fmt.Errorf("%s (%s): elements [%d, %d) of %s (%s)", dst.ScopeAndName(), to.Shape(), lo, hi, src.ScopeAndName(), from.Shape())
	}
	var merr error
	cerr := from.ConstBytes(func(b []byte) {
		merr = to.MutableBytes(func(d []byte) { copy(d, b[lo*size:hi*size]) })
	})
	return errors.Join(cerr, merr)
}

// saveElements consolidates the per-element state on rank 0, as an
// unsharded run holds it, and saves it there: rank 0 makes the whole
// variables' state (in an unsharded run's order), and each kind of state
// travels through the Reducer's Consolidate, which fills them. They are
// dropped after the save.
func (t *Trainer) saveElements(ctx context.Context, h *checkpoints.Handler) error {
	rank := t.c.Rank()
	el := t.el
	made := make([][]*mlctx.Variable, len(t.trainable))
	var errs []error
	kinds := 0
	for p := range t.trainable {
		kinds = max(kinds, len(el.kinds[p]))
		if rank != 0 {
			continue
		}
		for _, s := range el.kinds[p] {
			v, err := t.makeVariable(s)
			if err != nil {
				errs = append(errs, err)
			}
			made[p] = append(made[p], v)
		}
	}
	// One kind of state at a time, each shaped like the parameters:
	// Consolidate reads this rank's elements and fills rank 0's.
	values := make([][]float32, len(t.trainable)+1)
	for p, v := range t.trainable {
		values[p] = make([]float32, v.Shape().Size())
	}
	values[t.status] = make([]float32, t.c.Size())
	for j := range kinds {
		for p, state := range el.state {
			if j < len(state) {
				sp := t.span[p]
				errs = append(errs, readVariable(state[j], values[p][sp.Lo:sp.Hi]))
			}
		}
		if err := t.r.Consolidate(ctx, 0, values); err != nil {
			return t.fail(errors.Join(append(errs, fmt.Errorf("ddptrain: rank %d: Save: %w", rank, err))...))
		}
		for p, vars := range made {
			if j < len(vars) && vars[j] != nil {
				errs = append(errs, writeVariable(vars[j], values[p]))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		errs = []error{fmt.Errorf("ddptrain: rank %d: Save: %w", rank, err)}
	} else if rank == 0 {
		errs = append(errs, h.Save())
	}
	for _, vars := range made {
		for _, v := range vars {
			if v != nil {
				errs = append(errs, t.ctx.DeleteVariable(v.Scope(), v.Name()))
			}
		}
	}
	return errors.Join(errs...)
}
