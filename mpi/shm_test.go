//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/mpi"
)

// TestSharedMemory: a blocking communicator whose ranks all run on this
// machine offers shared memory (comm.HostSourceOf), and its all-reduces
// run there: every dtype, op and size of testAllReduce, in place and not,
// exact, both staged and in place in the buffers (every size but 0 with a
// direct minimum of 1 byte). Buffers of other memory, on any rank, send
// every rank's all-reduce of the direct kind to MPI.
func TestSharedMemory(t *testing.T) {
	for _, min := range []int{1, 0} {
		t.Run(fmt.Sprintf("directmin=%d", min), func(t *testing.T) {
			if min > 0 {
				defer mpi.SetDirectMin(mpi.SetDirectMin(min))
			}
			testSharedMemory(t)
		})
	}
}

func testSharedMemory(t *testing.T) {
	direct := mpi.SetDirectMin(0)
	mpi.SetDirectMin(direct)
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
		t.Fatalf("rank %d: a blocking communicator on one machine offers no shared memory (Info.SharedMemory %v; %q)", c.Rank(), info.SharedMemory, info.SharedMemoryFailure)
	}
	p := newPool(t, src)
	shared := allocFrom(p)

	before, stagedBefore := mpi.SharedOps(c), mpi.StagedOps(c)
	t.Run("AllReduce", func(t *testing.T) { testAllReduceWith(t, c, shared) })
	// Every call ran in shared memory, staged below the direct minimum.
	calls, staged := 0, 0
	for _, dt := range comm.DTypes {
		for range comm.Ops {
			sizes := testSizes
			if dt == comm.Float32 {
				sizes = append(sizes, 1<<20+5)
			}
			for _, count := range sizes {
				calls += 2
				if count*dt.Size() < direct {
					staged += 2
				}
			}
		}
	}
	if got := mpi.SharedOps(c) - before; got != uint64(calls) {
		t.Fatalf("rank %d: %d all-reduces ran in shared memory, want %d", c.Rank(), got, calls)
	}
	if got := mpi.StagedOps(c) - stagedBefore; got != uint64(staged) {
		t.Fatalf("rank %d: %d all-reduces were staged, want %d (below %d bytes)", c.Rank(), got, staged, direct)
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
		testutil.MustWaitAll(t, c.AllReduce(b, b, comm.Sum))
		if got := mpi.SharedOps(c) - before; got != 0 {
			t.Fatalf("rank %d: other memory on rank %d: %d all-reduces ran in shared memory, want 0", c.Rank(), odd, got)
		}
		checkBuf(t, "all_reduce of other memory", b, func(j int) float64 {
			return reduceValues(comm.Float32, comm.Sum, c.Size(), j, func(q int) float64 { return value(comm.Float32, q, j) })
		})
	}

	// Gradient-sized buffers, averaged as ddp does, each in a slab of its
	// own (a pool of 1 MiB slabs), each larger than the one before so that
	// no new slab lands where a freed one was: results stay exact, and
	// once a process has freed a slab its peers drop their mappings of its
	// slabs that their next call does not use.
	q, err := allocator.New(allocator.Options{Source: src, SlabSize: 1 << 20, Limit: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var prev allocator.Block
	for round := range 6 {
		n := (24+2*round)<<18 + 11
		blk, err := q.Get(n * 4)
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
		if round > 0 {
			if err := q.Put(prev); err != nil {
				t.Fatal(err)
			}
			if q.Trim() == 0 {
				t.Fatalf("rank %d: round %d: trimming freed no slab", c.Rank(), round)
			}
		}
		prev = blk
	}
	if err := q.Put(prev); err != nil {
		t.Fatal(err)
	}
	if m := mpi.SharedMapped(); m > 2*(c.Size()-1) {
		t.Fatalf("rank %d: %d of the peers' slabs are still mapped, want at most %d", c.Rank(), m, 2*(c.Size()-1))
	}

	// Ranks that disagree on the count all fail with ErrMismatch, and the
	// communicator goes on: counts that are all staged, all direct, and
	// rank 0's staged where the others' are not.
	other := (c.Rank() + 1) % c.Size() // the rank the error names: rank 0's nearest differing one
	if c.Rank() != 0 {
		other = 0
	}
	for _, count := range []func(r int) int{
		func(r int) int { return 1<<14 + 16*r },
		func(r int) int { return 100 + r },
		func(r int) int { return 1 + 1<<14*min(r, 1) },
	} {
		n := count(c.Rank())
		b := shared(t, n, comm.Float32)
		w := c.AllReduce(b, b, comm.Sum)
		err = w.Wait(context.Background())
		want := fmt.Sprintf("rank %d all-reduces %d elements of %s (%s), rank %d %d of", c.Rank(), n, comm.Float32, comm.Sum, other, count(other))
		if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), want) {
			t.Fatalf("rank %d: all-reduces of different counts: %v; want ErrMismatch saying %q", c.Rank(), err, want)
		}
		// Judged at its issue or later, it names its own number.
		if oe := (*comm.OpError)(nil); !errors.As(err, &oe) || oe.Seq != w.ID() {
			t.Fatalf("rank %d: the mismatch error of operation #%d: %v", c.Rank(), w.ID(), err)
		}
		for _, n := range []int{1 << 14, 100} {
			b = shared(t, n, comm.Float32)
			fillBuf(b, func(j int) float64 { return value(comm.Float32, c.Rank(), j) })
			testutil.MustWaitAll(t, c.AllReduce(b, b, comm.Sum))
			checkBuf(t, "all_reduce after a mismatch", b, func(j int) float64 {
				return reduceValues(comm.Float32, comm.Sum, c.Size(), j, func(q int) float64 { return value(comm.Float32, q, j) })
			})
		}
	}
}

// TestSharedMemoryUnmappable: when one rank cannot map a peer's memory,
// every rank leaves that all-reduce, and every later one of the
// communicator (even once mapping would work), to MPI, with the same
// results, and Info says why on that rank.
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
		if i == 1 && c.Rank() == c.Size()-1 {
			mpi.FailMapping(false) // mapping would work now; the communicator stays on MPI
		}
		const n = 1<<18 + 3
		b := shared(t, n, comm.Float32)
		fillBuf(b, func(j int) float64 { return value(comm.Float32, c.Rank(), j+i) })
		testutil.MustWaitAll(t, c.AllReduce(b, b, comm.Sum))
		checkBuf(t, "all_reduce left to MPI", b, func(j int) float64 {
			return reduceValues(comm.Float32, comm.Sum, c.Size(), j, func(q int) float64 { return value(comm.Float32, q, j+i) })
		})
	}
	// Left to MPI, the calls are still judged first: ranks that disagree
	// (staged on one, direct-sized on another) fail alike, at once.
	n := 100
	if c.Rank() == c.Size()-1 {
		n = 1 << 14
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := shared(t, n, comm.Float32)
	if err := c.AllReduce(b, b, comm.Sum).Wait(ctx); !errors.Is(err, comm.ErrMismatch) {
		t.Fatalf("rank %d: all-reduces of different counts after the fallback: %v; want ErrMismatch", c.Rank(), err)
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

// TestSharedMemoryBits: with two ranks, float32 sums and averages of
// random values (subnormals to 1e10, both signs) in shared memory are bit
// for bit those of MPI_Allreduce on the same inputs, whether each rank's
// call is in place or not (rank 0 in place, rank 1 not, and the other way
// round), and the elements past the buffer stay untouched.
func TestSharedMemoryBits(t *testing.T) {
	c := open(t, mpi.Options{Blocking: true})
	src := comm.HostSourceOf(c)
	if c.Size() != 2 || src == nil {
		t.Skip("two ranks with shared memory only")
	}
	shared := allocFrom(newPool(t, src))
	const n, tail = 1<<18 + 5, 64 // odd: the last block is short
	rng := rand.New(rand.NewPCG(uint64(c.Rank())+1, 7))
	in := make([]float32, n)
	for i := range in {
		in[i] = float32(math.Ldexp(rng.Float64()-0.5, rng.IntN(200)-160))
	}
	// A number, different on each rank: a write past the buffer that
	// reduced the ranks' canaries would change it (a NaN would not).
	canary := math.Float32bits(float32(c.Rank()) + 1.25)
	bits := func(b comm.Buffer, k int) []uint32 { return unsafe.Slice((*uint32)(b.Addr), k) }
	for _, op := range []comm.Op{comm.Sum, comm.Avg} {
		for _, inPlace := range []bool{c.Rank() == 0, c.Rank() == 1, true, false} {
			// MPI's result, on memory of another source.
			ref := alloc(t, n, comm.Float32)
			copy(ref.AsFloat32(), in)
			testutil.MustWaitAll(t, c.AllReduce(ref, ref, op))
			// The same through shared memory, with a canary after each buffer.
			send := shared(t, n+tail, comm.Float32)
			recv := send
			if !inPlace {
				recv = shared(t, n+tail, comm.Float32)
			}
			for _, b := range []comm.Buffer{send, recv} {
				for i := n; i < n+tail; i++ {
					bits(b, n+tail)[i] = canary
				}
			}
			copy(unsafe.Slice((*float32)(send.Addr), n), in)
			before := mpi.SharedOps(c)
			s, r := send, recv
			s.Count, r.Count = n, n
			testutil.MustWaitAll(t, c.AllReduce(s, r, op))
			if mpi.SharedOps(c)-before != 1 {
				t.Fatalf("rank %d: %s in place %v did not run in shared memory", c.Rank(), op, inPlace)
			}
			got, want := bits(recv, n), bits(ref, n)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("rank %d: %s in place %v: element %d is %#x (%g), MPI's %#x (%g)", c.Rank(), op, inPlace, i,
						got[i], math.Float32frombits(got[i]), want[i], math.Float32frombits(want[i]))
				}
			}
			for _, b := range []comm.Buffer{send, recv} {
				for i := n; i < n+tail; i++ {
					if bits(b, n+tail)[i] != canary {
						t.Fatalf("rank %d: %s in place %v: element %d past the buffer was written", c.Rank(), op, inPlace, i-n)
					}
				}
			}
		}
	}
}

// TestSharedMemoryCollectives: on shared memory, every collective but
// Send and Recv runs on the engine too, staged below the direct minimum
// and in place in the buffers above it, with the results of
// TestBlockingCollectives (which runs them on other memory, where the
// larger ones go to MPI).
func TestSharedMemoryCollectives(t *testing.T) {
	c := open(t, mpi.Options{Blocking: true})
	src := comm.HostSourceOf(c)
	if src == nil {
		t.Skip("no shared memory (one rank)")
	}
	shared := allocFrom(newPool(t, src))
	before := mpi.EngineOps(c)
	t.Run("Broadcast", func(t *testing.T) { testBroadcastWith(t, c, shared) })
	t.Run("Reduce", func(t *testing.T) { testReduceWith(t, c, shared) })
	t.Run("AllGather", func(t *testing.T) { testAllGatherWith(t, c, shared) })
	t.Run("ReduceScatter", func(t *testing.T) { testReduceScatterWith(t, c, shared) })
	t.Run("Barrier", func(t *testing.T) { testutil.MustWaitAll(t, c.Barrier(), c.Barrier()) })
	if got := mpi.EngineOps(c) - before; got == 0 {
		t.Fatalf("rank %d: no collective ran in shared memory", c.Rank())
	}
	// A reduce-scatter has the bits of the all-reduce it is a block of:
	// both reduce in rank order with the same kernels. Random floats make
	// any other order show.
	const per = 1<<14 + 5
	n := c.Size()
	rng := rand.New(rand.NewPCG(uint64(c.Rank())+1, 11))
	for _, count := range []int{3, per} { // staged, then in place
		all := shared(t, n*count, comm.Float32)
		for i := range all.AsFloat32() {
			all.AsFloat32()[i] = float32(math.Ldexp(rng.Float64()-0.5, rng.IntN(40)-20))
		}
		block := shared(t, count, comm.Float32)
		testutil.MustWaitAll(t, c.ReduceScatter(all, block, comm.Avg))
		testutil.MustWaitAll(t, c.AllReduce(all, all, comm.Avg))
		want := all.AsFloat32()[c.Rank()*count : (c.Rank()+1)*count]
		for i, g := range block.AsFloat32() {
			if math.Float32bits(g) != math.Float32bits(want[i]) {
				t.Fatalf("rank %d, count %d: reduce_scatter element %d is %v, the all-reduce's %v", c.Rank(), count, i, g, want[i])
			}
		}
	}
}
