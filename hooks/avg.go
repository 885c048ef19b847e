package hooks

import (
	"context"
	"fmt"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// Avg returns the fused averaging hook: one all-reduce with comm.Avg in
// place, so the backend divides by N inside its reduction pass (inproc
// while the data is in cache, NCCL with ncclAvg) instead of in a separate
// pass over the bucket. Its result is the rounded sum divided by N, which
// differs from AllReduce's sum of divided values by at most one rounding
// per element; for N a power of two the two agree exactly unless a value
// is subnormal or the sum overflows. It needs no scratch.
func Avg() Hook { return &avg{} }

type avg struct {
	c      comm.Communicator
	max    int
	closed bool
}

func (h *avg) Name() string { return "avg" }

func (h *avg) Setup(c comm.Communicator, _ *allocator.Pool, counts []int) error {
	if h.c != nil && h.c != c {
		return fmt.Errorf("%w: %s hook set up on rank %d, then given rank %d's communicator", ErrShared, h.Name(), h.c.Rank(), c.Rank())
	}
	h.c, h.max, h.closed = c, maxCount(counts), false
	return nil
}

func (h *avg) Reduce(ctx context.Context, c comm.Communicator, b *Bucket) error {
	if err := check(h.Name(), h.c, h.closed, h.max, c, b); err != nil {
		return err
	}
	t := &b.Times
	*t = Times{}
	t.CompressStart = since(b.Start)
	t.CompressEnd, t.CollectiveStart = t.CompressStart, t.CompressStart
	err := c.AllReduce(b.Buf, comm.Avg).Wait(ctx)
	t.CollectiveEnd = since(b.Start)
	t.DecompressEnd = t.CollectiveEnd
	t.WireBytes = int64(b.Buf.Bytes())
	if err != nil {
		return fmt.Errorf("hooks: %s of bucket %d (%d elements): %w", h.Name(), b.Index, b.Buf.Count, err)
	}
	return nil
}

func (h *avg) Close() error {
	h.closed = true
	return nil
}
