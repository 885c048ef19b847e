//go:build cgo

package nccl

import (
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// BenchmarkIssueWait is the host side of one small all-reduce, issued and
// waited for, on one rank: what the binding adds to each collective. Over
// the stand-in it measures the binding and the stand-in's threads, not a
// GPU; on a GPU (DDPGO_NCCL_DEVICE=1) it is the latency a small bucket
// pays.
func BenchmarkIssueWait(b *testing.B) {
	c := newGroup(b, 1, nil)[0]
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 1 << 20, SlabSize: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	m := newMem(b, c, pool, 256, comm.Float32)
	ctx := b.Context()
	for b.Loop() {
		if err := c.AllReduce(m.buf, m.buf, comm.Sum).Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
