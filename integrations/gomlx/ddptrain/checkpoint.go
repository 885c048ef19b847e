package ddptrain

import (
	"fmt"

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
// With Options.Reducer.Shard, Save fails with ErrUnsupported on every
// rank: rank 0 holds the optimizer state of its own variables only.
func (t *Trainer) Save(h *checkpoints.Handler) error {
	if t.shard {
		return fmt.Errorf("%w: rank %d: Save with Options.Reducer.Shard: rank 0 holds the optimizer state of its own variables only, and the trainer does not consolidate the others'", ErrUnsupported, t.c.Rank())
	}
	if t.c.Rank() != 0 {
		return nil
	}
	return h.Save()
}
