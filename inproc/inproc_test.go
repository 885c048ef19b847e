package inproc

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

func testGroup(t testing.TB, n int, o Options) []*Comm {
	t.Helper()
	cs, err := NewGroupWith(n, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

func TestNewGroupInvalid(t *testing.T) {
	for _, tc := range []struct {
		n int
		o Options
	}{{0, Options{}}, {-1, Options{}}, {2, Options{Timeout: -1}}, {2, Options{StallInterval: -time.Second}}} {
		if _, err := NewGroupWith(tc.n, tc.o); !errors.Is(err, comm.ErrInvalid) {
			t.Errorf("NewGroupWith(%d, %+v) = %v, want ErrInvalid", tc.n, tc.o, err)
		}
	}
}

// TestAllocs checks that issuing collectives and waiting for them
// allocates nothing once the group is warm, on either the one-rank or the
// parallel path.
func TestAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	cs := testGroup(t, 2, Options{})
	ctx := context.Background()
	for _, count := range []int{1024, 64 << 10} {
		bufs := [][]float32{make([]float32, count), make([]float32, count)}
		halves := [][]uint16{make([]uint16, count), make([]uint16, count)}
		ws := make([]comm.Work, 4)
		step := func() {
			for r, c := range cs {
				ws[r] = c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), comm.Avg)
				ws[2+r] = c.AllReduce(comm.Halves(halves[r]), comm.Halves(halves[r]), comm.Sum)
			}
			for _, w := range ws {
				if err := w.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		step()
		if a := testing.AllocsPerRun(200, step); a != 0 {
			t.Errorf("count %d: %v allocations per all_reduce + Wait on two ranks, want 0", count, a)
		}
	}
	sb, rb := make([]int64, 100), make([]int64, 100)
	p2p := func() {
		s := cs[0].Send(comm.Int64s(sb), 1)
		r := cs[1].Recv(comm.Int64s(rb), 0)
		b0, b1 := cs[0].Barrier(), cs[1].Barrier()
		for _, w := range []comm.Work{s, r, b0, b1} {
			if err := w.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	p2p()
	if a := testing.AllocsPerRun(200, p2p); a != 0 {
		t.Errorf("%v allocations per send + recv + barrier, want 0", a)
	}
}

// TestCloseLeavesNoGoroutine checks that Close stops every worker and is
// idempotent: after completed work, with a collective and a message
// pending (their workers parked), after a timeout aborted the group, and
// with ranks closed from several goroutines at once.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	cases := []struct {
		name string
		o    Options
		run  func(t *testing.T, cs []*Comm) []comm.Work
	}{
		{"completed", Options{}, func(t *testing.T, cs []*Comm) []comm.Work {
			ws := make([]comm.Work, len(cs))
			for r, c := range cs {
				ws[r] = allReduceInPlace(c, comm.Float32s(make([]float32, 100)), comm.Sum)
			}
			for r, err := range testutil.WaitAll(t, ws...) {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			return nil
		}},
		{"pending", Options{}, func(t *testing.T, cs []*Comm) []comm.Work {
			ws := []comm.Work{
				allReduceInPlace(cs[0], comm.Float32s(make([]float32, 100<<10)), comm.Sum),
				allReduceInPlace(cs[1], comm.Float32s(make([]float32, 100<<10)), comm.Sum),
				cs[3].Send(comm.Float32s(make([]float32, 4)), 2),
			}
			for !cs[0].parked.Load() || !cs[3].parked.Load() {
				runtime.Gosched()
			}
			return ws
		}},
		{"timed out", Options{Timeout: time.Millisecond}, func(t *testing.T, cs []*Comm) []comm.Work {
			w := cs[2].Barrier()
			if err := testutil.WaitAll(t, []comm.Work{w}...)[0]; !errors.Is(err, comm.ErrTimeout) {
				t.Fatalf("%v, want ErrTimeout", err)
			}
			return nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			cs, err := NewGroupWith(4, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			pending := tc.run(t, cs)
			var wg sync.WaitGroup
			for _, c := range cs {
				wg.Go(func() {
					for range 2 {
						if err := c.Close(); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			for i, err := range testutil.WaitAll(t, pending...) {
				if !errors.Is(err, comm.ErrClosed) {
					t.Errorf("operation %d pending at Close: %v, want ErrClosed", i, err)
				}
			}
			testutil.Goroutines(t, before)
		})
	}
}

// TestMismatchReport checks what a mismatch error says and that the group
// stays usable after it.
func TestMismatchReport(t *testing.T) {
	cs := testGroup(t, 3, Options{})
	bufs := make([][]float32, 3)
	ws := make([]comm.Work, 3)
	for r, c := range cs {
		bufs[r] = []float32{float32(r), 1}
		ws[r] = c.Barrier()
	}
	testutil.WaitAll(t, ws...)
	for r, c := range cs {
		op := comm.Sum
		if r == 2 {
			op = comm.Max
		}
		ws[r] = c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), op)
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
		}
		for _, want := range []string{"collective #2", "rank(s) [2] differ", "rank 0: all_reduce(sum, 2 x float) (seq 2)", "rank 2: all_reduce(max, 2 x float) (seq 2)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d: %q does not say %q", r, err, want)
			}
		}
		var oe *comm.OpError
		if !errors.As(err, &oe) || oe.Rank != r || oe.Seq != 2 || oe.Kind != comm.KindAllReduce {
			t.Errorf("rank %d: %#v, want an OpError for rank %d, seq 2, all_reduce", r, oe, r)
		}
	}
	for r, c := range cs {
		ws[r] = c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), comm.Sum)
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if err != nil || bufs[r][0] != 3 || bufs[r][1] != 3 {
			t.Errorf("rank %d after the mismatch: %v, %v; want nil, [3 3]", r, err, bufs[r])
		}
	}
}

// TestInvalidOnOneRank checks that a call that is invalid on one rank only
// fails the collective on every rank rather than hanging the others.
func TestInvalidOnOneRank(t *testing.T) {
	cs := testGroup(t, 3, Options{})
	ws := make([]comm.Work, 3)
	for r, c := range cs {
		root := 0
		if r == 1 {
			root = 7
		}
		ws[r] = c.Broadcast(comm.Float32s(make([]float32, 4)), root)
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if !errors.Is(err, comm.ErrInvalid) {
			t.Errorf("rank %d: %v, want ErrInvalid", r, err)
		} else if r != 1 && !strings.Contains(err.Error(), "rank(s) [1]") {
			t.Errorf("rank %d: %q does not name rank 1", r, err)
		}
	}
}

// TestStallAndTimeout leaves one rank out of a collective: the others
// report the stall naming it, then fail with ErrTimeout, and the group is
// aborted.
func TestStallAndTimeout(t *testing.T) {
	var mu sync.Mutex
	var stalls []comm.Stall
	cs := testGroup(t, 3, Options{
		StallInterval: time.Millisecond,
		Timeout:       50 * time.Millisecond,
		OnStall: func(s comm.Stall) {
			mu.Lock()
			stalls = append(stalls, s)
			mu.Unlock()
		},
	})
	ws := []comm.Work{
		allReduceInPlace(cs[0], comm.Float32s(make([]float32, 4)), comm.Sum),
		allReduceInPlace(cs[1], comm.Float32s(make([]float32, 4)), comm.Sum),
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if !errors.Is(err, comm.ErrTimeout) {
			t.Errorf("rank %d: %v, want ErrTimeout", r, err)
		}
	}
	mu.Lock()
	if len(stalls) == 0 {
		t.Error("no stall reported")
	}
	for _, s := range stalls {
		if s.Kind != comm.KindAllReduce || len(s.Missing) != 1 || s.Missing[0] != 2 || s.Seq != 1 || s.Rank == 2 {
			t.Errorf("stall report %v, want rank 0 or 1 waiting in all_reduce #1 for rank 2", s)
		}
	}
	mu.Unlock()
	err := testutil.WaitAll(t, []comm.Work{allReduceInPlace(cs[2], comm.Float32s(make([]float32, 4)), comm.Sum)}...)[0]
	if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, comm.ErrTimeout) {
		t.Errorf("late rank: %v, want ErrAborted wrapping ErrTimeout", err)
	}
}

func TestSendRecvMismatch(t *testing.T) {
	cs := testGroup(t, 2, Options{})
	ws := []comm.Work{
		cs[0].Send(comm.Float32s(make([]float32, 4)), 1),
		cs[1].Recv(comm.Float32s(make([]float32, 5)), 0),
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
}

// TestAbortRace aborts a group while small and large collectives are in
// flight: every Work must complete, successfully or with
// ErrAborted (the race detector checks that no buffer is touched after).
func TestAbortRace(t *testing.T) {
	for trial := range 20 {
		cs := testGroup(t, 3, Options{})
		var wg sync.WaitGroup
		for r, c := range cs {
			wg.Go(func() {
				buf := make([]float32, 64<<10)
				for i := 0; ; i++ {
					b := buf
					if i%2 == 0 {
						b = buf[:16] // the one-rank path
					}
					err := c.AllReduce(comm.Float32s(b), comm.Float32s(b), comm.Sum).Wait(context.Background())
					if err != nil {
						if !errors.Is(err, comm.ErrAborted) {
							t.Errorf("trial %d, rank %d, op %d: %v", trial, r, i, err)
						}
						return
					}
					buf[0] = 1 // the Work is complete: the buffer is ours again
					if r == trial%3 && i == trial {
						c.Abort(errors.New("test"))
					}
				}
			})
		}
		wg.Wait()
	}
}

func TestWaitOldAndUnknownOps(t *testing.T) {
	cs := testGroup(t, 2, Options{})
	var first []comm.Work
	for i := range 2*ringSize + 5 {
		ws := []comm.Work{cs[0].Barrier(), cs[1].Barrier()}
		if i == 0 {
			first = ws
		}
		testutil.WaitAll(t, ws...)
	}
	if errs := testutil.WaitAll(t, first...); errs[0] != nil || errs[1] != nil {
		t.Errorf("waiting again on the first barrier: %v", errs)
	}
	if _, err := cs[0].TestOp(1 << 40); !errors.Is(err, comm.ErrInvalid) {
		t.Errorf("TestOp of an operation never issued: %v, want ErrInvalid", err)
	}
}

func TestSingleRank(t *testing.T) {
	cs := testGroup(t, 1, Options{})
	buf := []int32{1, 2, 3}
	if err := cs[0].AllReduce(comm.Int32s(buf), comm.Int32s(buf), comm.Avg).Wait(context.Background()); err != nil || buf[2] != 3 {
		t.Fatalf("%v %v", err, buf)
	}
}

// TestLargeGroup checks that a group of many ranks starts, runs a
// collective and a message exchange, and stops.
func TestLargeGroup(t *testing.T) {
	const n = 256
	cs := testGroup(t, n, Options{})
	ws := make([]comm.Work, 0, n+2)
	bufs := make([][]int32, n)
	for r, c := range cs {
		bufs[r] = []int32{1}
		ws = append(ws, c.AllReduce(comm.Int32s(bufs[r]), comm.Int32s(bufs[r]), comm.Sum))
	}
	msg := []int32{0}
	ws = append(ws, cs[n-1].Send(comm.Int32s([]int32{42}), 0), cs[0].Recv(comm.Int32s(msg), n-1))
	for i, err := range testutil.WaitAll(t, ws...) {
		if err != nil {
			t.Fatalf("operation %d: %v", i, err)
		}
	}
	if bufs[0][0] != n || bufs[n-1][0] != n || msg[0] != 42 {
		t.Errorf("all_reduce over %d ranks: %d, %d; message %d", n, bufs[0][0], bufs[n-1][0], msg[0])
	}
	// A uint8 average over more ranks than a uint8 can count: the sum
	// wraps and its quotient by 256 is 0 (it must not divide by zero).
	ws = ws[:0]
	small := make([][]uint8, n)
	for r, c := range cs {
		small[r] = []uint8{1, 255}
		ws = append(ws, c.AllReduce(comm.Uint8s(small[r]), comm.Uint8s(small[r]), comm.Avg))
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if err != nil || small[r][0] != 0 || small[r][1] != 0 {
			t.Fatalf("rank %d: uint8 avg over %d ranks: %v, %v; want nil, [0 0]", r, n, err, small[r])
		}
	}
}

// TestAllocsWhenParked checks that waiting allocates nothing when both
// the waiting goroutine and the rank's worker have to park: rank 0 issues
// an all-reduce and waits; rank 1 joins only once rank 0's Wait is parked
// on its channel and rank 0's worker is parked (with its deadline timer)
// in the collective. Blocking on a channel takes a runtime sudog, which is
// cached once the runtime has seen as many blocked goroutines; the warm-up
// steps fill that cache.
func TestAllocsWhenParked(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	cs := testGroup(t, 2, Options{})
	ctx := context.Background()
	bufs := [][]float32{make([]float32, 256), make([]float32, 256)}
	start, done := make(chan struct{}), make(chan error)
	go func() {
		for range start {
			// Wait until rank 0's worker has joined the collective and
			// parked, and a Wait on rank 0 is parked.
			for cs[0].g.seg.Published(0) != cs[0].ops.Issued() || !cs[0].parked.Load() || cs[0].ops.Waiting() == 0 {
				runtime.Gosched()
			}
			done <- cs[1].AllReduce(comm.Float32s(bufs[1]), comm.Float32s(bufs[1]), comm.Sum).Wait(ctx)
		}
	}()
	defer close(start)
	step := func() {
		w := cs[0].AllReduce(comm.Float32s(bufs[0]), comm.Float32s(bufs[0]), comm.Sum)
		start <- struct{}{}
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		step()
	}
	if a := testing.AllocsPerRun(50, step); a != 0 {
		t.Errorf("%v allocations per all_reduce + Wait with the waiter and the worker parked, want 0", a)
	}
}

// TestMismatchNamesOddRank: the ranks named as differing are those that
// differ from the call most ranks made, whichever rank that is.
func TestMismatchNamesOddRank(t *testing.T) {
	for _, tc := range []struct {
		n    int
		odd  []int
		want string
	}{
		{4, []int{0}, "rank(s) [0] differ from rank(s) [1 2 3]"},
		{4, []int{3}, "rank(s) [3] differ from rank(s) [0 1 2]"},
		{5, []int{1, 4}, "rank(s) [1 4] differ from rank(s) [0 2 3]"},
		{2, []int{0}, "rank(s) [1] differ from rank(s) [0]"}, // a tie: the lowest rank's call is the reference
	} {
		cs := testGroup(t, tc.n, Options{})
		ws := make([]comm.Work, tc.n)
		for r, c := range cs {
			op := comm.Sum
			if slices.Contains(tc.odd, r) {
				op = comm.Min
			}
			ws[r] = allReduceInPlace(c, comm.Float64s(make([]float64, 3)), op)
		}
		for r, err := range testutil.WaitAll(t, ws...) {
			if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%d ranks, odd %v: rank %d: %v; want ErrMismatch saying %q", tc.n, tc.odd, r, err, tc.want)
			}
		}
	}
}

// allReduceInPlace issues the in-place form of AllReduce on buf.
func allReduceInPlace(c comm.Communicator, buf comm.Buffer, op comm.Op) comm.Work {
	return c.AllReduce(buf, buf, op)
}
