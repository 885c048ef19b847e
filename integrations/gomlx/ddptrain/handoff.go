package ddptrain

import (
	"context"
	"fmt"
	"time"

	"github.com/ddpgo/ddpgo/ddp"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// handIn copies the gradients (the gradient graph's outputs, in the
// order of t.trainable) into their slots of bucket memory, last variable
// first, which is the order backward produced them in and the order of
// the Reducer's initial buckets, marking them ready Options.ReadyBatch at
// a time. A synced step first writes the buffers and this rank's status.
func (t *Trainer) handIn(mode ddp.SyncMode, grads []*tensors.Tensor) error {
	if mode == ddp.Sync {
		if err := t.writeBuffers(); err != nil {
			return err
		}
		if err := t.writeStatus(false); err != nil {
			return err
		}
	}
	t.batch = t.batch[:0]
	for k := len(grads) - 1; k >= 0; k-- {
		if err := t.copyIn(k, grads[k]); err != nil {
			return fmt.Errorf("%s: %w", t.trainable[k].ScopeAndName(), err)
		}
		t.batch = append(t.batch, k)
		if len(t.batch) < t.o.ReadyBatch && k > 0 {
			continue
		}
		for _, i := range t.batch {
			if err := t.ready(i); err != nil {
				return err
			}
		}
		t.batch = t.batch[:0]
	}
	return nil
}

// ready marks parameter i ready.
func (t *Trainer) ready(i int) error {
	if err := t.r.Ready(i); err != nil {
		return err
	}
	t.marked[i] = true
	return nil
}

// copyIn writes gradient k into its bucket slot: a copy in the first step
// of an accumulation window, an addition in the others. The source is the
// backend's own buffer where it shares memory with Go (simplego), so this
// is the only copy between the graph and the wire.
func (t *Trainer) copyIn(k int, grad *tensors.Tensor) error {
	if t.trainable[k].DType() == dtypes.Float64 {
		b, err := t.r.GradBuffer(k)
		if err != nil {
			return err
		}
		return fromTensor(grad, b.AsFloat64(), t.fresh)
	}
	dst, err := t.r.Grad(k)
	if err != nil {
		return err
	}
	return fromTensor(grad, dst, t.fresh)
}

// fromTensor copies (or adds, unless overwrite) x's data into dst.
func fromTensor[T float32 | float64](x *tensors.Tensor, dst []T, overwrite bool) error {
	var err error
	if cerr := x.ConstFlatData(func(flat any) {
		src, _ := flat.([]T)
		err = into(dst, src, overwrite)
	}); cerr != nil {
		return cerr
	}
	return err
}

// toTensor copies src into x's data.
func toTensor[T float32 | float64](x *tensors.Tensor, src []T) error {
	var err error
	if merr := x.MutableFlatData(func(flat any) {
		dst, _ := flat.([]T)
		err = into(dst, src, true)
	}); merr != nil {
		return merr
	}
	return err
}

// into copies src into dst, or adds it unless overwrite.
func into[T float32 | float64](dst, src []T, overwrite bool) error {
	if len(dst) != len(src) {
		return fmt.Errorf("gradient of %d elements for a slot of %d", len(src), len(dst))
	}
	if overwrite {
		copy(dst, src)
		return nil
	}
	for i, x := range src {
		dst[i] += x
	}
	return nil
}

// wait waits for the step's buckets, copying each bucket's averages into
// the optimizer graph's inputs as soon as it is reduced, while later
// buckets are still on the wire, and reads the ranks' status.
func (t *Trainer) wait(ctx context.Context) error {
	t.outErr, t.copyTime, t.failed = nil, 0, t.failed[:0]
	if err := t.r.WaitEach(ctx, t.copyOut); err != nil {
		return fmt.Errorf("ddptrain: rank %d: step %d: %w", t.c.Rank(), t.steps, err)
	}
	if err := t.readBuffers(); err != nil && t.outErr == nil {
		t.outErr = err
	}
	if t.shard {
		return nil // the status and t.outErr are read after the gather (shard.go)
	}
	if len(t.failed) > 0 {
		return fmt.Errorf("%w: rank %d: step %d: %s failed (its own error says why)", ErrPeer, t.c.Rank(), t.steps, rankList(t.failed))
	}
	if t.outErr != nil {
		// Only this rank's copy failed: its peers will apply the step.
		return t.tellPeers(ctx, ddp.NoSync, fmt.Errorf("ddptrain: rank %d: step %d: copying the averages: %w", t.c.Rank(), t.steps, t.outErr))
	}
	return nil
}

// copyAverages is WaitEach's callback: it copies the averaged gradients
// of a reduced bucket into the optimizer graph's inputs, and reads the
// status of the ranks from the trainer's own parameter.
func (t *Trainer) copyAverages(red ddp.Reduced) {
	start := time.Now()
	if t.shard {
		// Only this rank's variables hold averages; the status, if
		// it is this rank's, is gathered (shard.go).
		for _, pt := range red.Owned {
			if pt.Param != t.status && t.input[pt.Param] >= 0 {
				t.note(t.copyOutOne(pt.Param))
			}
		}
		t.copyTime += time.Since(start)
		return
	}
	for _, p := range red.Params {
		var err error
		if p == t.status {
			err = t.readStatus()
		} else {
			err = t.copyOutOne(p)
		}
		if err != nil && t.outErr == nil {
			t.outErr = err
		}
	}
	t.copyTime += time.Since(start)
}

// copyOutOne copies parameter p's average (its elements t.span[p]) into
// the optimizer's input for it.
func (t *Trainer) copyOutOne(p int) error {
	x := t.optIn[t.input[p]]
	if t.trainable[p].DType() == dtypes.Float64 {
		b, err := t.r.GradBuffer(p)
		if err != nil {
			return err
		}
		return toTensor(x, b.AsFloat64()) // not sharded: all of it
	}
	src, err := t.r.Grad(p)
	if err != nil {
		return err
	}
	return toTensor(x, src[t.span[p].Lo:t.span[p].Hi])
}

// writeBuffers copies the buffer variables, as the gradient graph left
// them, into the Reducer's buffers, which it broadcasts from rank 0 during
// the step.
func (t *Trainer) writeBuffers() error { return t.moveBuffers(true) }

// readBuffers copies the broadcast buffers back into their variables.
func (t *Trainer) readBuffers() error { return t.moveBuffers(false) }

// moveBuffers copies the buffer variables' bytes into the Reducer's
// buffers, or back if !in.
func (t *Trainer) moveBuffers(in bool) error {
	for i, v := range t.buffers {
		b, err := t.r.Buffer(i)
		if err != nil {
			return err
		}
		value, err := v.Value()
		if err != nil {
			return err
		}
		mem := b.AsBytes()
		if in {
			err = value.ConstBytes(func(src []byte) { copy(mem, src) })
		} else {
			err = value.MutableBytes(func(dst []byte) { copy(dst, mem) })
		}
		if err != nil {
			return fmt.Errorf("buffer %s: %w", v.ScopeAndName(), err)
		}
	}
	return nil
}
