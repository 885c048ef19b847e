package ddp

import (
	"fmt"
	"math"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bucket"
	"github.com/ddpgo/ddpgo/comm"
)

// Buffers: model state that is not a gradient but must match across
// ranks, such as BatchNorm's running statistics (PyTorch's
// broadcast_buffers). They live in pool memory of their own, packed by
// dtype, one block per dtype, allocated by New and never moved. Every
// synced step broadcasts them from rank 0 (from the lowest rank still
// active, with Options.Join): the launcher issues the broadcasts just
// before bucket 0's collective, when backward has begun, so forward has
// finished updating them, and the finisher waits for them with the
// buckets, so they overlap the rest of backward and the reduction.

// bufferSet is the Reducer's buffers and their memory.
type bufferSet struct {
	params []Param
	groups []bucket.Bucket   // per dtype
	blocks []allocator.Block // one per group
	wire   []comm.Buffer     // per group: what is broadcast
	bufs   []comm.Buffer     // per buffer: its slot in its group
	byName map[string]int
}

// prepareBuffers checks Options.Buffers and takes their memory.
func (r *Reducer) prepareBuffers(ps []Param) error {
	b := &r.bufs
	if len(ps) == 0 {
		return nil
	}
	b.params = make([]Param, len(ps))
	b.byName = make(map[string]int, len(ps))
	tensors := make([]bucket.Tensor, len(ps))
	total := 0
	for i, p := range ps {
		if p.DType == 0 {
			p.DType = comm.Float32
		}
		p.Shape = append([]int(nil), p.Shape...)
		b.params[i] = p
		if _, dup := b.byName[p.Name]; dup {
			b.byName[p.Name] = -1
		} else {
			b.byName[p.Name] = i
		}
		if !p.DType.Valid() {
			return fmt.Errorf("%w: rank %d: buffer %d (%q) has dtype %s", ErrUnsupported, r.c.Rank(), i, p.Name, p.DType)
		}
		n, size := p.Numel(), p.DType.Size()
		if n < 0 || n > (math.MaxInt-total)/size {
			return fmt.Errorf("%w: rank %d: buffer %d (%q) has shape %v: a negative dimension, or more bytes than an int holds", ErrUnsupported, r.c.Rank(), i, p.Name, p.Shape)
		}
		tensors[i] = bucket.Tensor{Numel: n, DType: p.DType}
		total += n * size
	}
	groups, err := bucket.Assign(tensors, []int{math.MaxInt}, nil)
	if err != nil {
		return fmt.Errorf("ddp: rank %d: laying out the buffers: %w", r.c.Rank(), err)
	}
	b.groups = groups
	b.bufs = make([]comm.Buffer, len(ps))
	for _, g := range groups {
		size := g.DType.Size()
		blk, err := r.pool.Get(max(g.Bytes, size))
		if err != nil {
			return fmt.Errorf("ddp: rank %d: memory for %d bytes of %s buffers: %w", r.c.Rank(), g.Bytes, g.DType, err)
		}
		b.blocks = append(b.blocks, blk)
		w := r.region(blk, 0, g.Bytes/size, g.DType)
		r.kern.Zero(w)
		b.wire = append(b.wire, w)
		for j, t := range g.Tensors {
			b.bufs[t] = w.Slice(g.Offsets[j]/size, tensors[t].Numel)
		}
	}
	return nil
}

// Buffer returns buffer i (of Options.Buffers) as a comm.Buffer of its
// dtype, in the pool's memory (on the host, Buffer.AsFloat32 and the like
// give Go views). Its memory is the Reducer's and never moves: keep it for
// the model, and update it in forward. Every synced step overwrites it
// with rank 0's values (Options.Buffers says when). It fails with ErrIndex
// for an index out of range and ErrClosed after Close.
func (r *Reducer) Buffer(i int) (comm.Buffer, error) {
	if i < 0 || i >= len(r.bufs.params) {
		return comm.Buffer{}, fmt.Errorf("%w: rank %d: Buffer(%d): the reducer has %d buffers", ErrIndex, r.c.Rank(), i, len(r.bufs.params))
	}
	if r.closed.Load() {
		return comm.Buffer{}, ErrClosed
	}
	return r.bufs.bufs[i], nil
}

// BufferIndex returns the index of the buffer named name, failing as
// Index does.
func (r *Reducer) BufferIndex(name string) (int, error) {
	i, ok := r.bufs.byName[name]
	switch {
	case !ok:
		return -1, fmt.Errorf("%w: rank %d: no buffer is named %q", ErrIndex, r.c.Rank(), name)
	case i < 0:
		return -1, fmt.Errorf("%w: rank %d: several buffers are named %q", ErrIndex, r.c.Rank(), name)
	}
	return i, nil
}
