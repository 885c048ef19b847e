package ddptrain

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
)

// Save saves a checkpoint of the context's variables through h on rank 0,
// and does nothing on the other ranks, whose variables are rank 0's (h may
// be nil there). Call it between steps. Loading needs no help: a
// checkpoint loaded into rank 0's context before the first step
// (checkpoints.Build or Load, then New with ctx.Reuse(), as with
// train.Trainer) is broadcast with the rest of rank 0's variables,
// whatever the number of ranks that saved it. Load it on rank 0 only, or
// on every rank: a checkpoint loaded on other ranks but not on rank 0
// would be replaced by rank 0's fresh variables, so the first step fails
// on every rank with ErrMismatch naming the ranks that loaded it. Load it
// lazily, as checkpoints.Build does by default: Config.Immediate creates
// the variables in an order of its own, which then differs from the
// other ranks' (ErrMismatch too).
//
// With Options.Reducer.Shard each rank holds the optimizer state of its
// own variables or elements only, so Save is collective: every rank calls
// it, and the other ranks' state (every optimizer-state variable but the
// scalars, which rank 0 holds alike; with ShardElements, each moment's
// elements, through ddp.Reducer.Consolidate) travels to rank 0, which
// saves it with its own, whole, and then drops it again, as PyTorch's
// consolidate_state_dict gathers it for the rank that saves. The
// checkpoint is then what an unsharded run saves, and any number of
// ranks, sharded either way or not, loads it (sharded: on every rank,
// each taking its own variables' or elements' state).
func (t *Trainer) Save(h *checkpoints.Handler) error {
	if !t.shard {
		if t.c.Rank() != 0 {
			return nil
		}
		return h.Save()
	}
	if err := t.usable(); err != nil {
		return err
	}
	if t.r == nil {
		return fmt.Errorf("%w: rank %d: Save with Options.Reducer.Shard before the first step (call Setup)", ErrUnsupported, t.c.Rank())
	}
	if t.el != nil {
		return t.saveElements(context.Background(), h)
	}
	return t.saveSharded(context.Background(), h)
}

// saveSharded consolidates the optimizer's state on rank 0 and saves it
// there. The ranks tell each other what state they hold (one all-gather
// of the descriptors' lengths, one of the descriptors), then each rank
// but 0 broadcasts its state's bytes, which rank 0 unpacks into variables
// it makes for the save and deletes after it.
func (t *Trainer) saveSharded(ctx context.Context, h *checkpoints.Handler) error {
	rank, size := t.c.Rank(), t.c.Size()
	var mine []*mlctx.Variable
	var desc bytes.Buffer
	for _, v := range t.optState {
		if v.Shape().IsScalar() || t.octx != nil {
			continue // the scalars are rank 0's too; in a context of the trainer's own the rest is the placeholder's
		}
		mine = append(mine, v)
		fmt.Fprintf(&desc, "%s\t%s\t%d", v.Scope(), v.Name(), int(v.DType()))
		for _, d := range v.Shape().Dimensions {
			fmt.Fprintf(&desc, "\t%d", d)
		}
		desc.WriteByte('\n')
	}
	lens, err := t.gatherBytes(ctx, binary.LittleEndian.AppendUint64(nil, uint64(desc.Len())), "exchanging the sizes of the optimizer's state")
	if err != nil {
		return err
	}
	longest := 0
	for r := range size {
		longest = max(longest, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	padded := make([]byte, max(longest, 1))
	copy(padded, desc.Bytes())
	all, err := t.gatherBytes(ctx, padded, "exchanging the names of the optimizer's state")
	if err != nil {
		return err
	}
	var made []*mlctx.Variable
	var errs []error
	for r := 1; r < size; r++ {
		n := int(binary.LittleEndian.Uint64(lens[8*r:]))
		specs, perr := parseState(all[r*len(padded) : r*len(padded)+n])
		if perr != nil {
			// Every rank parses the same bytes: all stop here.
			errs = append(errs, fmt.Errorf("ddptrain: rank %d: rank %d's description of its optimizer state: %w", rank, r, perr))
			break
		}
		total := 0
		for _, s := range specs {
			total += int(s.Memory())
		}
		var vars []*mlctx.Variable
		switch rank {
		case r:
			vars = mine
		case 0:
			for _, s := range specs {
				v, cerr := t.makeVariable(s)
				if cerr != nil {
					errs = append(errs, cerr)
					continue
				}
				made = append(made, v)
				vars = append(vars, v)
			}
		}
		if err := t.broadcastVars(ctx, r, vars, total, fmt.Sprintf("gathering rank %d's optimizer state on rank 0", r)); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	if rank == 0 && len(errs) == 0 {
		errs = append(errs, h.Save())
	}
	for _, v := range made {
		errs = append(errs, t.ctx.DeleteVariable(v.Scope(), v.Name()))
	}
	return errors.Join(errs...)
}

// stateSpec describes one variable of a rank's optimizer state.
type stateSpec struct {
	scope, name string
	shapes.Shape
}

// parseState reads the descriptors saveSharded writes.
func parseState(b []byte) ([]stateSpec, error) {
	var specs []stateSpec
	for line := range strings.SplitSeq(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) < 3 {
			return nil, fmt.Errorf("%q: want a scope, a name and a dtype", line)
		}
		dims := make([]int, len(f)-3)
		for i, x := range append([]string{f[2]}, f[3:]...) {
			n, err := strconv.Atoi(x)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%q: field %q", line, x)
			}
			if i > 0 {
				dims[i-1] = n
			} else if dtypes.DType(n).Size() <= 0 {
				return nil, fmt.Errorf("%q: dtype %d", line, n)
			}
		}
		n, _ := strconv.Atoi(f[2])
		specs = append(specs, stateSpec{scope: f[0], name: f[1], Shape: shapes.Make(dtypes.DType(n), dims...)})
	}
	return specs, nil
}

// makeVariable makes, on rank 0, a variable for another rank's state
// described by s, to be saved.
func (t *Trainer) makeVariable(s stateSpec) (v *mlctx.Variable, err error) {
	if t.ctx.GetVariableByScopeAndName(s.scope, s.name) != nil {
		return nil, fmt.Errorf("%w: rank 0: the optimizer state %s/%s of another rank is rank 0's too", ErrMismatch, s.scope, s.name)
	}
	err = catch(func() error {
		v = t.ctx.Checked(false).InAbsPath(s.scope).VariableWithValue(s.name, tensors.FromShape(s.Shape))
		return nil
	})
	return v, err
}

// gatherBytes all-gathers mine, of the same length on every rank, through
// the trainer's pool, and returns every rank's, in rank order.
func (t *Trainer) gatherBytes(ctx context.Context, mine []byte, what string) ([]byte, error) {
	size := t.c.Size()
	send, err := t.pool.Get(len(mine))
	if err != nil {
		return nil, fmt.Errorf("ddptrain: rank %d: %w", t.c.Rank(), err)
	}
	recv, err := t.pool.Get(len(mine) * size)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("ddptrain: rank %d: %w", t.c.Rank(), err), t.pool.Put(send))
	}
	copy(send.Bytes(), mine)
	w := t.c.AllGather(comm.HostBuffer(send.Addr(), len(mine), comm.Uint8), comm.HostBuffer(recv.Addr(), len(mine)*size, comm.Uint8))
	if err := t.collective(ctx, what, w); err != nil {
		return nil, err
	}
	out := bytes.Clone(recv.Bytes()[:len(mine)*size])
	return out, errors.Join(t.pool.Put(send), t.pool.Put(recv))
}
