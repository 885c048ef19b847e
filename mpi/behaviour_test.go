//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/mpi"
)

// TestHalfSum checks 16-bit sums whose exact value needs rounding. Every
// pairwise addition rounds once (a float32 sum rounded to the dtype), so
// with 2 ranks the result is the single rounding of the exact sum, as
// inproc gives; with more, each further addition may add half a unit in
// the last place. Every rank must get the same bits.
func TestHalfSum(t *testing.T) {
	c := open(t, mpi.Options{})
	n, r := c.Size(), c.Rank()
	const count = 4<<10 + 3
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		for _, op := range []comm.Op{comm.Sum, comm.Avg} {
			// Fractions in [1, 2) exact in dt: 10 (or 7) bits after the point.
			frac := func(q, j int) float64 {
				bits := 10
				if dt == comm.BFloat16 {
					bits = 7
				}
				return 1 + float64((q*389+j*97)%(1<<bits))/float64(int(1)<<bits)
			}
			b := alloc(t, count, dt)
			fillBuf(b, func(j int) float64 { return frac(r, j) })
			testutil.MustWaitAll(t, c.AllReduce(b, b, op))
			ulps := 0
			if n > 2 {
				ulps = n - 2
			}
			if op == comm.Avg {
				ulps++ // the division rounds again
			}
			for j := range count {
				want := reduceValues(dt, op, n, j, func(q int) float64 { return frac(q, j) })
				got := b.AsUint16()[j]
				if d := ulpDiff(dt, got, want); d > ulps {
					t.Fatalf("%s %s over %d ranks: rank %d, element %d = %v, want %v (%d ulps off, %d allowed)", dt, op, n, r, j, get(b, j), rounded(dt, want), d, ulps)
				}
			}
			// Every rank holds the same bits: compare with rank 0's.
			ref := alloc(t, count, dt)
			copy(ref.AsBytes(), b.AsBytes())
			testutil.MustWaitAll(t, c.Broadcast(ref, 0))
			if string(ref.AsBytes()) != string(b.AsBytes()) {
				t.Fatalf("%s %s: rank %d's result differs from rank 0's", dt, op, r)
			}
		}
	}
}

func ulpDiff(dt comm.DType, got uint16, want float64) int {
	var w uint16
	if dt == comm.Float16 {
		w = fp16.FromFloat32(float32(want))
	} else {
		w = fp16.BFloat16FromFloat32(float32(want))
	}
	d := int(got) - int(w) // both positive: the bit patterns are ordered
	if d < 0 {
		d = -d
	}
	return d
}

// TestWaitDeadline: a collective that the last rank joins late; Wait with
// a short deadline returns the context's error, naming the operation, and
// the collective completes once the rank joins.
func TestWaitDeadline(t *testing.T) {
	c := open(t, mpi.Options{})
	n, r := c.Size(), c.Rank()
	if n == 1 {
		t.Skip("needs a peer that joins late")
	}
	b := alloc(t, 2, comm.Float32)
	b.AsFloat32()[0], b.AsFloat32()[1] = float32(r), 2
	if r == n-1 {
		time.Sleep(300 * time.Millisecond)
	}
	w := c.AllReduce(b, b, comm.Sum)
	if r != n-1 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := w.Wait(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "all_reduce") {
			t.Errorf("rank %d: Wait with a 20ms deadline on a collective rank %d joins after 300ms: %v; want DeadlineExceeded naming all_reduce", r, n-1, err)
		}
	}
	testutil.MustWaitAll(t, w)
	if want := float32(n * (n - 1) / 2); b.AsFloat32()[0] != want || b.AsFloat32()[1] != float32(2*n) {
		t.Errorf("rank %d: %v, want [%v %v]", r, b.AsFloat32(), want, 2*n)
	}
}

// TestInvalid: every rank makes the same bad call; each gets
// comm.ErrInvalid without MPI being involved, and the communicator stays
// usable.
func TestInvalid(t *testing.T) {
	c := open(t, mpi.Options{})
	n := c.Size()
	f := func(k int) comm.Buffer { return alloc(t, k, comm.Float32) }
	cases := []struct {
		name string
		w    func() comm.Work
	}{
		{"broadcast root -1", func() comm.Work { return c.Broadcast(f(4), -1) }},
		{"reduce root n", func() comm.Work { return c.Reduce(f(4), f(4), comm.Sum, n) }},
		{"all_gather recv count", func() comm.Work { return c.AllGather(f(4), f(4*n+1)) }},
		{"reduce_scatter send count", func() comm.Work { return c.ReduceScatter(f(4*n-1), f(4), comm.Sum) }},
		{"all_reduce op 99", func() comm.Work { return c.AllReduce(f(4), f(4), 99) }},
		{"all_reduce counts", func() comm.Work { return c.AllReduce(f(4), f(5), comm.Sum) }},
		{"all_reduce overlap", func() comm.Work { b := f(8); return c.AllReduce(b.Slice(0, 4), b.Slice(2, 4), comm.Sum) }},
		{"device memory", func() comm.Work { b := f(4); b.Loc = comm.Device; return c.AllReduce(b, b, comm.Sum) }},
		{"send to self", func() comm.Work { return c.Send(f(4), c.Rank()) }},
		{"recv from rank n", func() comm.Work { return c.Recv(f(4), n) }},
	}
	for _, tc := range cases {
		err := tc.w().Wait(context.Background())
		var oe *comm.OpError
		if !errors.Is(err, comm.ErrInvalid) || !errors.As(err, &oe) || oe.Rank != c.Rank() {
			t.Errorf("%s: %v; want an OpError of rank %d wrapping ErrInvalid", tc.name, err, c.Rank())
		}
	}
	testutil.MustWaitAll(t, c.Barrier())
}

// TestMPIError: a receive shorter than the message is MPI's
// MPI_ERR_TRUNCATE, returned as an OpError naming the rank, the operation
// and MPI's text; the communicator is unusable afterwards. A message
// shorter than the receive is caught by the backend as a mismatch.
func TestMPIError(t *testing.T) {
	c := open(t, mpi.Options{})
	n, r := c.Size(), c.Rank()
	if n == 1 {
		t.Skip("needs two ranks")
	}
	short := alloc(t, 4, comm.Float32)
	long := alloc(t, 8, comm.Float32)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch r {
	case 0:
		testutil.MustWaitAll(t, c.Send(short, 1), c.Send(long, 1))
	case 1:
		err := c.Recv(long, 0).Wait(ctx)
		if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "received 4 elements") {
			t.Errorf("recv of 8 elements, message of 4: %v; want ErrMismatch naming the 4 elements", err)
		}
		err = c.Recv(short, 0).Wait(ctx)
		var me *mpi.Error
		var oe *comm.OpError
		if !errors.As(err, &me) || !errors.As(err, &oe) || oe.Rank != 1 || oe.Kind != comm.KindRecv || oe.Count != 4 || !strings.Contains(err.Error(), "MPI_ERR_TRUNCATE") {
			t.Errorf("recv of 4 elements, message of 8: %v; want an OpError of rank 1's recv of 4 elements wrapping *mpi.Error MPI_ERR_TRUNCATE", err)
		}
		err = c.Barrier().Wait(ctx)
		if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, me) {
			t.Errorf("barrier after an MPI error: %v; want ErrAborted wrapping the first error", err)
		}
	}
	// The broken communicator is rank 1's alone; the others' is closed by
	// the cleanup without further collectives.
}

// TestClose: Close is idempotent and operations issued after it fail with
// ErrClosed.
func TestClose(t *testing.T) {
	c, err := mpi.Open(mpi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := alloc(t, 10, comm.Float32)
	testutil.MustWaitAll(t, c.AllReduce(b, b, comm.Sum))
	for i := range 2 {
		if err := c.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if err := c.AllReduce(b, b, comm.Sum).Wait(context.Background()); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("all_reduce after Close: %v; want ErrClosed", err)
	}
}

// TestProgressModes: one communicator of the process may be blocking;
// while it is open, the next ones are non-blocking on every rank even if
// they ask to block, and they can be driven from different goroutines in
// different orders on different ranks.
func TestProgressModes(t *testing.T) {
	type blocker interface{ Blocking() bool }
	a := open(t, mpi.Options{Blocking: true})
	b := open(t, mpi.Options{Blocking: true})
	nb := open(t, mpi.Options{})
	if !a.(blocker).Blocking() || b.(blocker).Blocking() || nb.(blocker).Blocking() {
		t.Fatalf("Blocking() = %v, %v, %v; want the first communicator blocking, the others not", a.(blocker).Blocking(), b.(blocker).Blocking(), nb.(blocker).Blocking())
	}
	// Each goroutine uses one communicator; the ranks' goroutines are not
	// synchronised with each other, so the operations of a and b
	// interleave differently on different ranks.
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i, c := range []comm.Communicator{a, b, nb} {
		buf := alloc(t, 1000, comm.Float32)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			n := c.Size()
			for it := range 50 {
				f := buf.AsFloat32()
				for j := range f {
					f[j] = float32(c.Rank() + it + j%10)
				}
				if err := c.AllReduce(buf, buf, comm.Sum).Wait(ctx); err != nil {
					errs <- fmt.Errorf("communicator %d, iteration %d: %w", i, it, err)
					return
				}
				for j, v := range f {
					if want := float32(n*(n-1)/2 + n*(it+j%10)); v != want {
						errs <- fmt.Errorf("communicator %d, iteration %d: element %d = %v, want %v", i, it, j, v, want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestNoAllocs: issuing and waiting allocate nothing once warm.
func TestNoAllocs(t *testing.T) {
	for _, o := range []mpi.Options{{Blocking: true}, {}} {
		c := open(t, o)
		b := alloc(t, 1024, comm.Float32)
		out := alloc(t, 1024, comm.Float32)
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			f    func() comm.Work
		}{
			{"all_reduce in place", func() comm.Work { return c.AllReduce(b, b, comm.Sum) }},
			{"all_reduce", func() comm.Work { return c.AllReduce(b, out, comm.Avg) }},
			{"broadcast", func() comm.Work { return c.Broadcast(b, 0) }},
			{"barrier", func() comm.Work { return c.Barrier() }},
		} {
			allocs := testing.AllocsPerRun(200, func() {
				if err := tc.f().Wait(ctx); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("blocking %v: %s: %v allocations per issue and wait, want 0", o.Blocking, tc.name, allocs)
			}
		}
	}
}

func TestLibraryInfo(t *testing.T) {
	open(t, mpi.Options{})
	info := mpi.LibraryInfo()
	if !info.Built || !info.Initialized || info.Library == "" || info.Provided == "" || info.WorldSize < 1 {
		t.Fatalf("LibraryInfo() = %+v; want built, initialised, a library and a thread level", info)
	}
	t.Logf("%+v", info)
}

// TestStagedDoneAtIssue: a staged all-reduce that its issue finishes (in a
// 1-rank world with a segment of its own, every one is) has
// completed when AllReduce returns, with the right result, and takes the
// next operation number as any other: Test and Wait find it done, and the
// next operation gets the number after it.
func TestStagedDoneAtIssue(t *testing.T) {
	if underMpirun() {
		t.Skip("1-rank world only")
	}
	defer mpi.SetStagedAlone(mpi.SetStagedAlone(true))
	c, err := mpi.Open(mpi.Options{Blocking: true}) // shared memory is for blocking communicators
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send, recv := alloc(t, 1000, comm.Float32), alloc(t, 1000, comm.Float32)
	for i := range send.AsFloat32() {
		send.AsFloat32()[i] = float32(i)
	}
	for i := range 3 {
		w := c.AllReduce(send, recv, comm.Sum)
		if i == 0 && mpi.StagedOps(c) == 0 {
			t.Skip("no shared-memory segment here (DDPGO_MPI_SHM=0, or no shared memory)")
		}
		if done, err := w.Test(); !done || err != nil || w.ID() != uint64(i+1) {
			t.Fatalf("all-reduce %d: done %v, %v, id %d; want complete, id %d", i, done, err, w.ID(), i+1)
		}
		if err := w.Wait(t.Context()); err != nil {
			t.Fatalf("all-reduce %d: Wait: %v", i, err)
		}
		for j, v := range recv.AsFloat32() {
			if v != float32(j) {
				t.Fatalf("all-reduce %d: recv[%d] = %v, want %v", i, j, v, float32(j))
			}
		}
		clear(recv.AsFloat32())
	}
	if n := mpi.StagedOps(c); n != 3 {
		t.Errorf("%d all-reduces staged, want 3", n)
	}
	if w := c.Barrier(); w.ID() != 4 {
		t.Errorf("the barrier after them has id %d, want 4", w.ID())
	} else if err := w.Wait(t.Context()); err != nil {
		t.Error(err)
	}
}

// TestWaitOldInline: a Wait on an all-reduce that was left pending at its
// issue and finished long ago, after all-reduces finished at their issue
// have reused its ring slot, returns its result at once (it waited for
// ever: nothing resets the inline mark, and the slot no longer said
// done). 2 ranks: rank 1 posts the first all-reduce late, so that rank 0's
// is pending inline, then rank 0 posts every later one last.
func TestWaitOldInline(t *testing.T) {
	c := open(t, mpi.Options{Blocking: true}) // shared memory is for blocking communicators
	if c.Size() != 2 {
		t.Skip("2 ranks only")
	}
	b := alloc(t, 256, comm.Float32)
	clear(b.AsFloat32())
	ctx := t.Context()
	if c.Rank() == 1 {
		time.Sleep(50 * time.Millisecond)
	}
	first := c.AllReduce(b, b, comm.Sum)
	if err := first.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if mpi.StagedOps(c) == 0 {
		t.Skip("no shared-memory segment here (DDPGO_MPI_SHM=0, or no shared memory)") // every rank alike
	}
	for range backend.RingSize + 10 {
		if c.Rank() == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		if err := c.AllReduce(b, b, comm.Sum).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The case needs rank 0's first all-reduce to be the inline one still:
	// on a busy machine rank 0 may have posted a later one first.
	still := c.Rank() == 0 && mpi.InlineSeq(c) == first.ID()
	if still {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := first.Wait(wctx); err != nil {
			t.Errorf("Wait on all-reduce #%d, finished %d operations ago: %v", first.ID(), backend.RingSize+10, err)
		}
	}
	testutil.MustWaitAll(t, c.Barrier())
	if c.Rank() == 0 && !still {
		t.Skipf("rank 0's inline all-reduce is #%d, not the first (#%d): a later one was pending at its issue", mpi.InlineSeq(c), first.ID())
	}
}
