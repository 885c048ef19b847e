package ddp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bucket"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
)

// layout is one bucket layout with its memory: a pool block per bucket,
// each parameter's slot in its block, the hook's scratch, and the schedule
// over it.
type layout struct {
	buckets  []bucket.Bucket
	enc      []int64           // bucket.Encode(buckets)
	blocks   []allocator.Block // one per bucket, then the scratch slots
	bufs     []comm.Buffer     // per parameter: its slot in its bucket
	views    [][]float32       // per parameter: bufs as Go slices (host pools only)
	bucketOf []int             // parameter -> bucket
	hb       []hooks.Bucket    // what the hook reduces, per bucket
	sched    *schedule
	// works[k] is bucket k's collective in this step, for stall reports;
	// the launcher stores it, then counts it in issued, which the waiting
	// goroutine reads first.
	works  []comm.Work
	issued atomic.Int32
	shard  *shardLayout // Options.Shard's partition (shard.go); nil without it
}

// adopt makes bs the current layout: it takes new blocks from the pool
// and returns the old layout's blocks. The new blocks are zeroed. It
// takes the new blocks before returning the old ones, so that memory a
// stale gradient slice still points to is not handed straight back: the
// old layout stays out of the pool, with canaries, until the step ends
// (canary.go). If the pool cannot hold both, adopt returns the old blocks
// first, but only where no host gradient of the old layout was handed
// out: a write through such a slice would land, unseen, in whatever the
// new layout put at that address. With one handed out it fails instead,
// and Begin's failure aborts the group, so that every rank fails rather
// than some going on in a layout others did not adopt. adopt runs only
// between steps, when no collective uses the old layout's memory.
func (r *Reducer) adopt(bs []bucket.Bucket) error {
	old := r.lay.Load()
	L, err := r.build(bs)
	if err != nil && old != nil && errors.Is(err, allocator.ErrExhausted) {
		if i := r.handedOutHost(); i >= 0 {
			return fmt.Errorf("the pool cannot hold the rebuilt layout (%d gradient bytes) beside the old one (%d bytes), "+
				"which must stay out of the pool since parameter %d's (%q) gradient was handed out in it and a write through that slice "+
				"would land in another gradient: give the pool room for both layouts, or set Options.KeepLayout: %w",
				layoutBytes(bs), old.bytes(), i, r.params[i].Name, err)
		}
		if err := old.free(r.pool); err != nil {
			return fmt.Errorf("ddp: returning the old bucket memory: %w", err)
		}
		old = nil
		L, err = r.build(bs)
	}
	if err != nil {
		return err
	}
	r.lay.Store(L)
	r.layGen++
	if old != nil {
		if err := r.retire(old); err != nil {
			return fmt.Errorf("ddp: returning the old bucket memory: %w", err)
		}
	} else if r.copies == nil {
		// The old memory went back to make room, and no host slice of
		// it was handed out: nothing of the new layout is handed out yet.
		for i := range r.out {
			r.out[i].Store(false)
		}
	}
	return nil
}

// handedOutHost returns the first parameter whose gradient slot in the
// current layout was handed out as host memory that Go code may still
// write, or -1. CopyGrads' slices are the Reducer's own and do not move.
func (r *Reducer) handedOutHost() int {
	if !r.host || r.copies != nil {
		return -1
	}
	for i := range r.out {
		if r.out[i].Load() {
			return i
		}
	}
	return -1
}

// layoutBytes is the gradient bytes of the buckets bs.
func layoutBytes(bs []bucket.Bucket) int {
	n := 0
	for _, b := range bs {
		n += b.Bytes
	}
	return n
}

// bytes is the memory the layout holds: its buckets and scratch.
func (L *layout) bytes() int {
	n := 0
	for _, b := range L.blocks {
		n += b.Size()
	}
	return n
}

// build takes memory for layout bs and lays the parameters out in it. The
// hook's scratch comes in min(window, buckets) slots: bucket k uses slot k
// mod slots, which no other bucket in flight with it shares, since at most
// window consecutive buckets are in flight at once. With the default
// window every bucket has a slot of its own, sized for it.
func (r *Reducer) build(bs []bucket.Bucket) (*layout, error) {
	L := &layout{
		buckets:  bs,
		enc:      bucket.Encode(bs),
		blocks:   make([]allocator.Block, 0, len(bs)),
		bufs:     make([]comm.Buffer, len(r.params)),
		bucketOf: make([]int, len(r.params)),
		hb:       make([]hooks.Bucket, len(bs)),
		works:    make([]comm.Work, len(bs)),
	}
	if r.host {
		L.views = make([][]float32, len(r.params))
	}
	if r.o.Shard != ShardOff {
		L.shard = &shardLayout{
			owned:  make([][]Part, len(bs)),
			lo:     make([]int, len(r.params)),
			hi:     make([]int, len(r.params)),
			values: make([][][]float32, len(bs)),
			direct: make([]bool, len(bs)),
			works:  make([]comm.Work, len(bs)),
		}
	}
	loc := location(r.host)
	owned := make([]int, r.c.Size()) // each rank's share so far (ShardParams)
	for k, b := range bs {
		size := b.DType.Size()
		n := b.Bytes / size
		var offs []int // the tensors' element offsets, where sharding moves them
		if L.shard != nil {
			// N blocks of per elements: the reduce-scatter's and the
			// all-gather's shape (shard.go).
			var per int
			offs, per = place(b, r.tensors, r.c.Size(), r.o.Shard, owned)
			n = per * r.c.Size()
			L.shard.owned[k] = ownedParts(b, r.tensors, offs, r.c.Rank(), per, L.shard.lo, L.shard.hi)
		}
		blk, err := r.pool.Get(max(n*size, size))
		if err != nil {
			L.free(r.pool)
			return nil, fmt.Errorf("ddp: memory for bucket %d (%d bytes): %w", k, n*size, err)
		}
		L.blocks = append(L.blocks, blk)
		buf := r.region(blk, 0, n, b.DType)
		r.kern.Zero(buf)
		ts := make([]hooks.Tensor, len(b.Tensors))
		for j, p := range b.Tensors {
			off := b.Offsets[j] / size
			if offs != nil {
				off = offs[j]
			}
			L.bufs[p] = buf.Slice(off, r.tensors[p].Numel)
			if r.host && b.DType == comm.Float32 {
				L.views[p] = L.bufs[p].AsFloat32()
			}
			L.bucketOf[p] = k
			ts[j] = hooks.Tensor{Param: p, Offset: off, Shape: r.params[p].Shape}
		}
		L.hb[k] = hooks.Bucket{Index: k, Buf: buf, Tensors: ts, Scratch: comm.Buffer{DType: comm.Uint8, Loc: loc, Device: r.dev}, Scatter: L.shard != nil}
	}
	slots := min(r.window, len(bs))
	need := make([]int, slots)
	for k := range bs {
		need[k%slots] = max(need[k%slots], hooks.ScratchFor(r.hook, &L.hb[k]))
	}
	for j, bytes := range need {
		if bytes == 0 {
			continue
		}
		blk, err := r.pool.Get(bytes)
		if err != nil {
			L.free(r.pool)
			return nil, fmt.Errorf("ddp: hook %s scratch for bucket slot %d (%d bytes): %w", r.hook.Name(), j, bytes, err)
		}
		L.blocks = append(L.blocks, blk)
		for k := j; k < len(bs); k += slots {
			L.hb[k].Scratch = r.region(blk, 0, bytes, comm.Uint8)
		}
	}
	L.sched = newSchedule(L.bucketOf, len(bs))
	if L.shard != nil {
		L.sched.shard()
	}
	return L, nil
}

// free returns the layout's blocks to the pool.
func (L *layout) free(pool *allocator.Pool) error {
	var first error
	for _, b := range L.take() {
		if err := pool.Put(b); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// take hands over the layout's blocks, leaving it none.
func (L *layout) take() []allocator.Block {
	b := L.blocks
	L.blocks = nil
	if L.shard != nil {
		b = append(b, L.shard.takeValues()...)
	}
	return b
}

// describe names bucket k's parameters for an error message.
func (L *layout) describe(k int, params []Param) string {
	if k < 0 || k >= len(L.buckets) {
		return "no bucket"
	}
	ts := L.buckets[k].Tensors
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d parameters: ", len(ts))
	for j, p := range ts {
		if j == 4 {
			fmt.Fprintf(&sb, ", ... %q", params[ts[len(ts)-1]].Name)
			break
		}
		if j > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%q", params[p].Name)
	}
	return sb.String()
}

// rebuild computes the layout to adopt at the next Begin from the order in
// which this step's gradients became ready (rank 0's order, broadcast to
// every rank), as PyTorch's Reducer::rebuild_buckets does after the first
// iteration. It runs inside the first synced step's Wait, after every
// bucket is reduced, so the collectives it issues are in the same place of
// every rank's sequence. The memory swap waits for the next Begin, so
// gradient slices handed out in this step stay valid until then.
func (r *Reducer) rebuild(parent context.Context) error {
	ctx, cancel, explain := bounded(parent, r.o.Timeout)
	defer cancel()
	n := len(r.params)
	var enc []int64
	size := []int64{0}
	var buildErr error
	if r.c.Rank() == 0 {
		order := make([]int, n)
		for j := range order {
			order[j] = int(r.order[j].Load())
		}
		bs, err := bucket.Rebuild(r.tensors, order, r.o.FirstBucketCap, r.o.BucketCap)
		if err != nil {
			buildErr = fmt.Errorf("ddp: rank 0 rebuilding buckets: %w", err)
			size[0] = -1
		} else {
			enc = bucket.Encode(bs)
			size[0] = int64(len(enc))
		}
	}
	if err := explain(r.ctlBroadcast(ctx, "the rebuilt layout's size", asBytes(size), comm.Int64, 0)); err != nil {
		return fmt.Errorf("ddp: rank %d broadcasting the rebuilt layout's size: %w", r.c.Rank(), err)
	}
	if buildErr != nil {
		return buildErr
	}
	if size[0] <= 0 {
		return fmt.Errorf("ddp: rank %d: rank 0 failed to rebuild the buckets", r.c.Rank())
	}
	if enc == nil {
		enc = make([]int64, size[0])
	}
	if err := explain(r.ctlBroadcast(ctx, "the rebuilt layout", asBytes(enc), comm.Int64, 0)); err != nil {
		return fmt.Errorf("ddp: rank %d broadcasting the rebuilt layout: %w", r.c.Rank(), err)
	}
	bs, err := bucket.Decode(r.tensors, enc)
	if err != nil {
		return fmt.Errorf("ddp: rank %d adopting rank 0's rebuilt layout: %w", r.c.Rank(), err)
	}
	if slices.Equal(enc, r.lay.Load().enc) {
		return nil
	}
	r.next = bs
	return nil
}
