package ddp

import (
	"context"
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
)

// BroadcastParameters copies rank 0's parameter values into values on
// every rank (PyTorch DDP's initial _sync_module_states): Broadcast from
// rank 0 for a model whose parameters are all float32. values[i] must
// have parameter i's element count on every rank.
func (r *Reducer) BroadcastParameters(ctx context.Context, values [][]float32) error {
	bufs := make([]comm.Buffer, len(values))
	for i, v := range values {
		bufs[i] = comm.Float32s(v)
	}
	return r.Broadcast(ctx, 0, bufs)
}

// Broadcast copies rank root's parameter values into values on every
// rank: values[i] is host memory holding parameter i's elements in its
// dtype (comm.Float32s, comm.Float64s, comm.Halves, comm.BFloat16s), the
// same count and dtype on every rank. After Join, root is the rank Join
// returns, whose model saw every step.
//
// Broadcast is collective and must not run during a synced step. The
// values travel bucket by bucket through a block of pool memory (uploaded
// and downloaded with the pool's kernels, so a device pool works too), so
// the collectives see pool memory only. It honours ctx and
// Options.Timeout. Any failure, including values of the wrong size or
// dtype or a root out of range (which leave this rank out of collectives
// its peers are waiting in), aborts the group and is sticky, as in Wait;
// a broadcast still in flight then keeps its block out of the pool until
// it completes.
func (r *Reducer) Broadcast(parent context.Context, root int, values []comm.Buffer) error {
	if err := r.enter(callBroadcast); err != nil {
		return err
	}
	defer r.leave()
	if r.state.Load() == syncing {
		return fmt.Errorf("%w: rank %d: Broadcast during synced step %d: call %s first", ErrStepInProgress, r.c.Rank(), r.stepNo, r.stepEnd())
	}
	if root < 0 || root >= r.c.Size() {
		return r.fail(fmt.Errorf("%w: rank %d: Broadcast from rank %d of %d", ErrIndex, r.c.Rank(), root, r.c.Size()))
	}
	if len(values) != len(r.params) {
		return r.fail(fmt.Errorf("%w: rank %d: Broadcast: %d value buffers for %d parameters", ErrGradSize, r.c.Rank(), len(values), len(r.params)))
	}
	for i, v := range values {
		p := r.params[i]
		if v.DType != p.DType || v.Loc != comm.Host {
			return r.fail(fmt.Errorf("%w: rank %d: Broadcast: parameter %d (%q) is %s; its value buffer is %s in %v memory, want host memory", ErrDType, r.c.Rank(), i, p.Name, p.DType, v.DType, v.Loc))
		}
		if n := r.tensors[i].Numel; v.Count != n {
			return r.fail(fmt.Errorf("%w: rank %d: Broadcast: parameter %d (%q) has %d elements, got %d", ErrGradSize, r.c.Rank(), i, p.Name, n, v.Count))
		}
	}
	ctx, cancel, explain := bounded(parent, r.o.Timeout)
	defer cancel()
	L := r.lay.Load()
	largest := 8
	for _, b := range L.buckets {
		largest = max(largest, b.Bytes)
	}
	blk, err := r.pool.Get(largest)
	if err != nil {
		return r.fail(fmt.Errorf("ddp: rank %d: Broadcast scratch of %d bytes: %w", r.c.Rank(), largest, err))
	}
	me := r.c.Rank() == root
	for k, b := range L.buckets {
		size := b.DType.Size()
		n := b.Bytes / size
		if n == 0 {
			continue
		}
		buf := r.region(blk, 0, n, b.DType)
		if me {
			for j, p := range b.Tensors {
				r.kern.Upload(buf.Slice(b.Offsets[j]/size, values[p].Count), values[p].AsBytes())
			}
		}
		w := r.c.Broadcast(buf, root)
		if err := explain(w.Wait(ctx)); err != nil {
			err = r.fail(fmt.Errorf("ddp: rank %d broadcasting parameters of bucket %d (%s) from rank %d: %w", r.c.Rank(), k, L.describe(k, r.params), root, err))
			return r.abandon(w, blk, "the parameter broadcast", err)
		}
		if !me {
			for j, p := range b.Tensors {
				r.kern.Download(values[p].AsBytes(), buf.Slice(b.Offsets[j]/size, values[p].Count))
			}
		}
	}
	return r.pool.Put(blk)
}
