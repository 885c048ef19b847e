package commtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// Bench measures collective k on comms with messages of the given size in
// bytes (nccl-tests' size: the full vector for AllGather and
// ReduceScatter). Every iteration issues the collective on every rank and
// waits for all of them, so the time per iteration is the slowest rank's.
// It reports busbw-GB/s, algbw-GB/s and us/op. Supported kinds: AllReduce
// (Sum), Broadcast (root 0), Reduce (Sum, root 0), AllGather,
// ReduceScatter (Sum) and Barrier.
func Bench(b *testing.B, comms []comm.Communicator, k comm.Kind, dt comm.DType, bytes int) {
	n := len(comms)
	count := bytes / dt.Size()
	if k == comm.KindAllGather || k == comm.KindReduceScatter {
		count /= n
	}
	// The buffers are pool memory, off the Go heap, as the contract
	// requires of every buffer handed to a collective.
	o := allocator.Options{}
	if need := int64(n) * (2*int64(n*count*dt.Size()) + 1<<20); need > allocator.DefaultLimit {
		o.Limit = need
	}
	pool, err := allocator.New(o)
	if err != nil {
		b.Fatalf("commtest.Bench: a pool for the buffers: %v", err)
	}
	var blocks []allocator.Block
	b.Cleanup(func() {
		for _, blk := range blocks {
			if err := pool.Put(blk); err != nil {
				b.Errorf("commtest.Bench: returning a buffer: %v", err)
			}
		}
		if err := pool.Close(); err != nil {
			b.Errorf("commtest.Bench: closing the buffer pool: %v", err)
		}
	})
	get := func(count int) comm.Buffer {
		blk, err := pool.Get(max(count*dt.Size(), 1))
		if err != nil {
			b.Fatalf("commtest.Bench: a buffer of %d x %s: %v", count, dt, err)
		}
		blocks = append(blocks, blk)
		return comm.HostBuffer(blk.Addr(), count, dt)
	}
	send := make([]comm.Buffer, n)
	recv := make([]comm.Buffer, n)
	for r := range n {
		switch k {
		case comm.KindAllGather:
			send[r], recv[r] = get(count), get(n*count)
		case comm.KindReduceScatter:
			send[r], recv[r] = get(n*count), get(count)
		default:
			send[r], recv[r] = get(count), get(count)
		}
	}
	issue := func(r int) comm.Work {
		c := comms[r]
		switch k {
		case comm.KindAllReduce:
			return c.AllReduce(send[r], send[r], comm.Sum)
		case comm.KindBroadcast:
			return c.Broadcast(send[r], 0)
		case comm.KindReduce:
			return c.Reduce(send[r], recv[r], comm.Sum, 0)
		case comm.KindAllGather:
			return c.AllGather(send[r], recv[r])
		case comm.KindReduceScatter:
			return c.ReduceScatter(send[r], recv[r], comm.Sum)
		case comm.KindBarrier:
			return c.Barrier()
		}
		b.Fatalf("commtest.Bench: unsupported kind %s", k)
		return comm.Work{}
	}
	ctx := context.Background()
	ws := make([]comm.Work, n)
	run := func() {
		for r := range n {
			ws[r] = issue(r)
		}
		for r := range n {
			if err := ws[r].Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	run() // warm up: first-touch page faults, worker start
	iters := 0
	start := time.Now()
	for b.Loop() {
		run()
		iters++
	}
	d := time.Since(start) / time.Duration(max(iters, 1))
	size := int64(n * count * dt.Size())
	if k != comm.KindAllGather && k != comm.KindReduceScatter {
		size = int64(count * dt.Size())
	}
	b.ReportMetric(comm.BusBW(k, n, size, d), "busbw-GB/s")
	b.ReportMetric(comm.AlgBW(size, d), "algbw-GB/s")
	b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
}

// SizeName formats a byte size the way benchmark names use it: 4KiB,
// 64MiB, 100B.
func SizeName(bytes int) string {
	switch {
	case bytes >= 1<<20 && bytes%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", bytes>>20)
	case bytes >= 1<<10 && bytes%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", bytes>>10)
	}
	return fmt.Sprintf("%dB", bytes)
}
