package ddp

import (
	"context"
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
)

// BroadcastParameters copies rank 0's parameter values into values on
// every rank (PyTorch DDP's initial _sync_module_states). values[i] must
// have parameter i's element count on every rank. It is collective and
// must not run during a synced step. The values travel bucket by bucket
// through a block of pool memory (uploaded and downloaded with the pool's
// kernels, so a device pool works too), so the collectives see pool memory
// only. It honours ctx and Options.Timeout. Any failure, including values
// of the wrong size (which leave this rank out of collectives its peers
// are waiting in), aborts the group and is sticky, as in Wait; a broadcast
// still in flight then keeps its block out of the pool until it completes.
func (r *Reducer) BroadcastParameters(parent context.Context, values [][]float32) error {
	if err := r.usable(); err != nil {
		return err
	}
	if r.state.Load() == syncing {
		return fmt.Errorf("%w: rank %d: BroadcastParameters during synced step %d", ErrStepInProgress, r.c.Rank(), r.stepNo)
	}
	if len(values) != len(r.params) {
		return r.fail(fmt.Errorf("%w: rank %d: BroadcastParameters: %d value slices for %d parameters", ErrGradSize, r.c.Rank(), len(values), len(r.params)))
	}
	for i, v := range values {
		if n := r.tensors[i].Numel; len(v) != n {
			return r.fail(fmt.Errorf("%w: rank %d: BroadcastParameters: parameter %d (%q) has %d elements, got %d", ErrGradSize, r.c.Rank(), i, r.params[i].Name, n, len(v)))
		}
	}
	ctx, cancel, explain := bounded(parent, r.o.Timeout)
	defer cancel()
	L := r.lay.Load()
	largest := 4
	for _, b := range L.buckets {
		largest = max(largest, b.Bytes)
	}
	blk, err := r.pool.Get(largest)
	if err != nil {
		return r.fail(fmt.Errorf("ddp: rank %d: BroadcastParameters scratch of %d bytes: %w", r.c.Rank(), largest, err))
	}
	root := r.c.Rank() == 0
	for k, b := range L.buckets {
		n := b.Bytes / 4
		if n == 0 {
			continue
		}
		buf := r.region(blk, 0, n, comm.Float32)
		if root {
			for j, p := range b.Tensors {
				r.kern.Upload(buf.Slice(b.Offsets[j]/4, len(values[p])), asBytes(values[p]))
			}
		}
		w := r.c.Broadcast(buf, 0)
		if err := explain(w.Wait(ctx)); err != nil {
			err = r.fail(fmt.Errorf("ddp: rank %d broadcasting parameters of bucket %d (%s): %w", r.c.Rank(), k, L.describe(k, r.params), err))
			return r.abandon(w, blk, "the parameter broadcast", err)
		}
		if !root {
			for j, p := range b.Tensors {
				r.kern.Download(asBytes(values[p]), buf.Slice(b.Offsets[j]/4, len(values[p])))
			}
		}
	}
	return r.pool.Put(blk)
}
