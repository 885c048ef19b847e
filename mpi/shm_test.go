//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/mpi"
)

// TestSharedMemory: a blocking communicator whose ranks all run on this
// machine offers shared memory (comm.HostSourceOf), and its all-reduces of
// buffers from it run there: every dtype, op and size of testAllReduce,
// in place and not, exact. Buffers of other memory, on any rank, send
// every rank's all-reduce to MPI.
func TestSharedMemory(t *testing.T) {
	c := open(t, mpi.Options{Blocking: true})
	src := comm.HostSourceOf(c)
	info := mpi.LibraryInfo()
	if c.Size() == 1 {
		if src != nil || info.SharedMemory {
			t.Fatal("a 1-rank communicator offers shared memory")
		}
		t.Skip("one rank: nothing to share")
	}
	if src == nil || !info.SharedMemory {
		t.Fatalf("rank %d: a blocking communicator on one machine offers no shared memory (Info.SharedMemory %v)", c.Rank(), info.SharedMemory)
	}
	p := newPool(t, src)
	shared := allocFrom(p)
	defer mpi.SetSharedMin(mpi.SetSharedMin(1))

	before := mpi.SharedOps(c)
	t.Run("AllReduce", func(t *testing.T) { testAllReduceWith(t, c, shared) })
	// Every call with elements ran in shared memory.
	calls := 0
	for _, dt := range comm.DTypes {
		for range comm.Ops {
			for _, count := range testSizes {
				if count > 0 {
					calls += 2
				}
			}
			if dt == comm.Float32 {
				calls += 2
			}
		}
	}
	if got := mpi.SharedOps(c) - before; got != uint64(calls) {
		t.Fatalf("rank %d: %d all-reduces ran in shared memory, want %d", c.Rank(), got, calls)
	}
	if mpi.SharedMapped() == 0 {
		t.Fatalf("rank %d: no peer's memory is mapped", c.Rank())
	}

	// One rank's buffer of other memory: every rank leaves the call to MPI,
	// and the result is the same.
	for _, odd := range []int{-1, 0, c.Size() - 1} {
		const n = 1<<18 + 3
		var b comm.Buffer
		if odd == -1 || c.Rank() == odd {
			b = alloc(t, n, comm.Float32)
		} else {
			b = shared(t, n, comm.Float32)
		}
		fillBuf(b, func(j int) float64 { return value(comm.Float32, c.Rank(), j) })
		before := mpi.SharedOps(c)
		waitAll(t, c.AllReduce(b, b, comm.Sum))
		if got := mpi.SharedOps(c) - before; got != 0 {
			t.Fatalf("rank %d: other memory on rank %d: %d all-reduces ran in shared memory, want 0", c.Rank(), odd, got)
		}
		checkBuf(t, "all_reduce of other memory", b, func(j int) float64 {
			return reduceValues(comm.Float32, comm.Sum, c.Size(), j, func(q int) float64 { return value(comm.Float32, q, j) })
		})
	}

	// A gradient-sized buffer, averaged as ddp does, over and over with new
	// slabs: results stay exact, and the mappings of freed slabs do not
	// pile up.
	for round := range 4 {
		const n = 25<<18 + 11 // 25 MiB and a bit: a slab of its own
		blk, err := p.Get(n * 4)
		if err != nil {
			t.Fatal(err)
		}
		b := comm.HostBuffer(blk.Addr(), n, comm.Float32)
		v := unsafe.Slice((*float32)(b.Addr), n)
		for k := range v {
			v[k] = float32((c.Rank() + 1) * (k%1000 + round))
		}
		if err := c.AllReduce(b, b, comm.Avg).Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		f := float32(c.Size()+1) / 2
		for k := range v {
			if want := f * float32(k%1000+round); v[k] != want {
				t.Fatalf("rank %d: round %d: element %d is %v, want %v", c.Rank(), round, k, v[k], want)
			}
		}
		if err := p.Put(blk); err != nil {
			t.Fatal(err)
		}
		p.Trim()
	}
	// Each peer freed its slabs: of theirs, only those the last call used
	// (or that it mapped since) are still mapped here.
	if m := mpi.SharedMapped(); m > 2*(c.Size()-1) {
		t.Fatalf("rank %d: %d of the peers' slabs are still mapped", c.Rank(), m)
	}

	// Ranks that disagree on the count all fail with ErrMismatch, and the
	// communicator goes on.
	n := 1<<14 + 16*c.Rank()
	b := shared(t, n, comm.Float32)
	err := c.AllReduce(b, b, comm.Sum).Wait(context.Background())
	other := (c.Rank() + 1) % c.Size() // the rank the error names: rank 0's nearest differing one
	if c.Rank() != 0 {
		other = 0
	}
	want := fmt.Sprintf("rank %d all-reduces %d elements of %s (%s), rank %d %d of", c.Rank(), n, comm.Float32, comm.Sum, other, 1<<14+16*other)
	if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), want) {
		t.Fatalf("rank %d: all-reduces of different counts: %v; want ErrMismatch saying %q", c.Rank(), err, want)
	}
	b = shared(t, 1<<14, comm.Float32)
	fillBuf(b, func(j int) float64 { return value(comm.Float32, c.Rank(), j) })
	waitAll(t, c.AllReduce(b, b, comm.Sum))
	checkBuf(t, "all_reduce after a mismatch", b, func(j int) float64 {
		return reduceValues(comm.Float32, comm.Sum, c.Size(), j, func(q int) float64 { return value(comm.Float32, q, j) })
	})
}

// TestSharedMemoryUnmappable: when one rank cannot map a peer's memory,
// every rank leaves that all-reduce, and every later one, to MPI, with the
// same results, and Info says why on that rank.
func TestSharedMemoryUnmappable(t *testing.T) {
	c := open(t, mpi.Options{Blocking: true})
	src := comm.HostSourceOf(c)
	if src == nil {
		t.Skip("no shared memory (one rank)")
	}
	shared := allocFrom(newPool(t, src))
	if c.Rank() == c.Size()-1 {
		mpi.FailMapping(true)
		defer mpi.FailMapping(false)
	}
	for i := range 3 {
		const n = 1<<18 + 3
		b := shared(t, n, comm.Float32)
		fillBuf(b, func(j int) float64 { return value(comm.Float32, c.Rank(), j+i) })
		waitAll(t, c.AllReduce(b, b, comm.Sum))
		checkBuf(t, "all_reduce left to MPI", b, func(j int) float64 {
			return reduceValues(comm.Float32, comm.Sum, c.Size(), j, func(q int) float64 { return value(comm.Float32, q, j+i) })
		})
	}
	if got := mpi.SharedOps(c); got != 0 {
		t.Fatalf("rank %d: %d all-reduces ran in shared memory, want 0", c.Rank(), got)
	}
	f := mpi.LibraryInfo().SharedMemoryFailure
	if c.Rank() == c.Size()-1 && !strings.Contains(f, "could not map rank") {
		t.Fatalf("rank %d: Info.SharedMemoryFailure %q does not say why", c.Rank(), f)
	}
}

// newPool returns a pool over src, closed when the test ends, after the
// cleanups of the buffers taken from it.
func newPool(t testing.TB, src allocator.Source) *allocator.Pool {
	t.Helper()
	p, err := allocator.New(allocator.Options{Source: src, Limit: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// allocFrom is alloc over p.
func allocFrom(p *allocator.Pool) func(testing.TB, int, comm.DType) comm.Buffer {
	return func(t testing.TB, count int, dt comm.DType) comm.Buffer {
		t.Helper()
		b, err := p.Get(count * dt.Size())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Put(b); err != nil {
				t.Error(err)
			}
		})
		return comm.HostBuffer(b.Addr(), count, dt)
	}
}
