package ddp

import (
	"context"
	"fmt"
)

// Consolidate gathers optimizer state that is sharded as Options.Shard
// shards the parameters onto rank root, as PyTorch's
// ZeroRedundancyOptimizer.consolidate_state_dict does, so that root can
// write a checkpoint that any number of ranks, sharded or not, can load:
// a rank of another group takes its Owned elements of each parameter's
// state from it, or all of them without Shard.
//
// state[i] is one kind of state (a momentum buffer, Adam's first or
// second moment) shaped like parameter i, as Gather's values: on entry,
// each rank's state holds that rank's own elements (Owned) of every
// parameter, and the others are not read; on return root's state holds
// every rank's, and the other ranks' state is unchanged. Call it once per
// kind of state. It is collective: every rank calls it with the same
// root, between steps (it fails with ErrStepInProgress during one). Each
// bucket travels in one all-gather through pool memory, so it costs the
// parameters' bytes on the wire, once per call. Without Options.Shard
// every rank holds the whole state already, and Consolidate only checks
// its arguments.
func (r *Reducer) Consolidate(parent context.Context, root int, state [][]float32) error {
	if err := r.enter(callConsolidate); err != nil {
		return err
	}
	defer r.leave()
	rank, size := r.c.Rank(), r.c.Size()
	if r.state.Load() == syncing {
		return fmt.Errorf("%w: rank %d: Consolidate during synced step %d: call %s first", ErrStepInProgress, rank, r.stepNo, r.stepEnd())
	}
	if root < 0 || root >= size {
		return fmt.Errorf("%w: rank %d: Consolidate onto rank %d of %d", ErrIndex, rank, root, size)
	}
	if len(state) != len(r.params) {
		return fmt.Errorf("%w: rank %d: Consolidate: %d state slices for %d parameters", ErrGradSize, rank, len(state), len(r.params))
	}
	for i, s := range state {
		if n := r.tensors[i].Numel; len(s) != n {
			return fmt.Errorf("%w: rank %d: Consolidate: parameter %d (%q, shape %v) has %d elements, its state slice %d",
				ErrGradSize, rank, i, r.params[i].Name, r.params[i].Shape, n, len(s))
		}
	}
	L := r.lay.Load()
	if L.shard == nil {
		return nil
	}
	ctx, cancel, explain := bounded(parent, r.o.Timeout)
	defer cancel()
	largest := 4
	for k := range L.buckets {
		largest = max(largest, L.hb[k].Buf.Bytes())
	}
	blk, err := r.pool.Get(largest)
	if err != nil {
		return r.fail(fmt.Errorf("ddp: rank %d: Consolidate scratch of %d bytes: %w", rank, largest, err))
	}
	for k := range L.buckets {
		hb := &L.hb[k]
		buf := r.region(blk, 0, hb.Buf.Count, hb.Buf.DType)
		all := buf.AsFloat32()
		clear(all) // the padding between the ranks' parts
		for _, t := range hb.Tensors {
			lo, hi := L.shard.lo[t.Param], L.shard.hi[t.Param]
			copy(all[t.Offset+lo:t.Offset+hi], state[t.Param][lo:hi])
		}
		per := hb.Buf.Count / size
		w := r.c.AllGather(buf.Slice(rank*per, per), buf)
		if err := explain(w.Wait(ctx)); err != nil {
			err = r.fail(fmt.Errorf("ddp: rank %d: consolidating the state of bucket %d (%s) onto rank %d: %w", rank, k, L.describe(k, r.params), root, err))
			return r.abandon(w, blk, "consolidating the state", err)
		}
		if rank == root {
			for _, t := range hb.Tensors {
				copy(state[t.Param], all[t.Offset:t.Offset+r.tensors[t.Param].Numel])
			}
		}
	}
	return r.pool.Put(blk)
}
