package hooks

import (
	"context"
	"fmt"
	"sync"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// AllReduce returns the plain averaging hook, PyTorch's allreduce_hook:
// divide the bucket by the group size in float32, then all-reduce it with
// Sum in place. It needs no scratch memory. Dividing before summing keeps
// the partial sums in the range of the gradients themselves, at the cost
// of a separate pass over the bucket.
func AllReduce() Hook { return &plain{name: "allreduce", prescale: true} }

// Avg returns the fused averaging hook (the Reducer's default): one
// all-reduce with comm.Avg in place, so the backend divides by N inside
// its reduction pass (inproc while the data is in cache, NCCL with
// ncclAvg) instead of in a separate pass over the bucket. Its result is
// the rounded sum divided by N, which differs from AllReduce's sum of
// divided values by at most one rounding per element; for N a power of two
// the two agree exactly unless a value is subnormal or the sum overflows.
// It needs no scratch.
func Avg() Hook { return &plain{name: "avg"} }

// plain is the uncompressed hook: AllReduce with prescale, Avg without.
type plain struct {
	name     string
	prescale bool
	mu       sync.Mutex // Setup and Close: a value shared by mistake fails cleanly
	c        comm.Communicator
	max      int
	closed   bool
}

func (h *plain) Name() string { return h.name }

func (h *plain) Setup(c comm.Communicator, _ *allocator.Pool, counts []int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c != nil && h.c != c {
		return fmt.Errorf("%w: %s hook set up on rank %d, then given rank %d's communicator", ErrShared, h.Name(), h.c.Rank(), c.Rank())
	}
	h.c, h.max, h.closed = c, maxCount(counts), false
	return nil
}

func (h *plain) Reduce(ctx context.Context, c comm.Communicator, b *Bucket) error {
	if err := check(h.Name(), h.c, h.closed, h.max, c, b); err != nil {
		return err
	}
	t := &b.Times
	*t = Times{}
	t.CompressStart = since(b.Start)
	op := comm.Avg
	if h.prescale {
		op = comm.Sum
		if n := c.Size(); n > 1 {
			Scale(b.Buf.AsFloat32(), 1/float32(n))
		}
	}
	t.CompressEnd = since(b.Start)
	t.CollectiveStart = t.CompressEnd
	err := c.AllReduce(b.Buf, b.Buf, op).Wait(ctx)
	t.CollectiveEnd = since(b.Start)
	t.DecompressEnd = t.CollectiveEnd
	t.WireBytes = int64(b.Buf.Bytes())
	if err != nil {
		return fmt.Errorf("hooks: %s of bucket %d (%d elements): %w", h.Name(), b.Index, b.Buf.Count, err)
	}
	return nil
}

func (h *plain) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return nil
}

// check validates a Reduce call against the hook's setup.
func check(name string, hc comm.Communicator, closed bool, max int, c comm.Communicator, b *Bucket) error {
	switch {
	case hc == nil || closed:
		return fmt.Errorf("%w: %s Reduce of bucket %d", ErrNotSetup, name, b.Index)
	case hc != c:
		return fmt.Errorf("%w: %s hook set up on rank %d, Reduce called with rank %d's communicator", ErrShared, name, hc.Rank(), c.Rank())
	case b.Buf.DType != comm.Float32:
		return fmt.Errorf("%w: bucket %d is %s", ErrDType, b.Index, b.Buf.DType)
	case b.Buf.Count > max:
		return fmt.Errorf("%w: bucket %d has %d elements, Setup's largest was %d", ErrTooLarge, b.Index, b.Buf.Count, max)
	}
	return nil
}

func maxCount(counts []int) int {
	m := 0
	for _, n := range counts {
		m = max(m, n)
	}
	return m
}

// Scale multiplies every element of v by s in place.
func Scale(v []float32, s float32) {
	i := 0
	for ; i+8 <= len(v); i += 8 {
		w := v[i : i+8 : i+8]
		w[0] *= s
		w[1] *= s
		w[2] *= s
		w[3] *= s
		w[4] *= s
		w[5] *= s
		w[6] *= s
		w[7] *= s
	}
	for ; i < len(v); i++ {
		v[i] *= s
	}
}
