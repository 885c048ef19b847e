package checked_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/checked"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// How the wrapper's own detection is tested. inproc detects mismatches
// itself, so an ErrMismatch from a wrapped inproc group could be inproc's.
// The tests therefore put a referee between the wrapper and inproc: blind
// forwards every call to inproc, reports no mismatch detection, and
// records, for every collective number and every message, each rank's
// call as the backend receives it. A call that differs from another rank's
// call of the same collective (or message) is a violation: a mismatched
// call reached the backend. The wrapper must fail every mismatch with
// ErrMismatch while the referee sees no violation, which proves both that
// the detection is the wrapper's and that the real call never ran;
// inproc's detection is never exercised. TestSameMessageAsInproc then
// compares the wrapper's errors with bare inproc's, word for word.

// referee records what a group's backend receives.
type referee struct {
	mu         sync.Mutex
	colls      map[uint64][]*comm.Call // collective number -> per-rank call
	msgs       map[[3]uint64][2]*comm.Call
	kinds      [][]comm.Kind // per rank, every call the backend received
	violations []string
}

func newReferee(n int) *referee {
	return &referee{colls: map[uint64][]*comm.Call{}, msgs: map[[3]uint64][2]*comm.Call{}, kinds: make([][]comm.Kind, n)}
}

func (f *referee) collective(rank, n int, k uint64, c comm.Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kinds[rank] = append(f.kinds[rank], c.Kind)
	calls := f.colls[k]
	if calls == nil {
		calls = make([]*comm.Call, n)
		f.colls[k] = calls
	}
	calls[rank] = &c
	for q, o := range calls {
		if o != nil && !o.Matches(c) {
			f.violations = append(f.violations, fmt.Sprintf("collective #%d reached the backend as %s on rank %d and %s on rank %d", k, o, q, c, rank))
		}
	}
}

func (f *referee) message(rank int, src, dst int, k uint64, c comm.Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kinds[rank] = append(f.kinds[rank], c.Kind)
	key := [3]uint64{uint64(src), uint64(dst), k}
	ends := f.msgs[key]
	end := 0
	if c.Kind == comm.KindRecv {
		end = 1
	}
	ends[end] = &c
	f.msgs[key] = ends
	if ends[0] != nil && ends[1] != nil && (ends[0].Count != ends[1].Count || ends[0].DType != ends[1].DType) {
		f.violations = append(f.violations, fmt.Sprintf("message %d from %d to %d reached the backend as %s and %s", k, src, dst, ends[0], ends[1]))
	}
}

func (f *referee) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, v := range f.violations {
		t.Errorf("referee: %s", v)
	}
}

// received returns the kinds of the calls rank's backend received.
func (f *referee) received(rank int) []comm.Kind {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.kinds[rank])
}

// blind is an inproc rank seen through the referee, with no mismatch
// detection of its own as far as the wrapper can tell.
type blind struct {
	*inproc.Comm
	ref          *referee
	colls        uint64
	sends, recvs []uint64
	mu           sync.Mutex
}

func (b *blind) Capabilities() comm.Caps {
	caps := b.Comm.Capabilities()
	caps.Backend, caps.MismatchDetection = "blind inproc", false
	return caps
}

func (b *blind) coll(c comm.Call) {
	b.mu.Lock()
	b.colls++
	k := b.colls
	b.mu.Unlock()
	b.ref.collective(b.Rank(), b.Size(), k, c)
}

func (b *blind) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	b.coll(comm.Call{Kind: comm.KindAllReduce, Op: op, DType: send.DType, Count: send.Count})
	return b.Comm.AllReduce(send, recv, op)
}

func (b *blind) Broadcast(buf comm.Buffer, root int) comm.Work {
	b.coll(comm.Call{Kind: comm.KindBroadcast, DType: buf.DType, Count: buf.Count, Root: root})
	return b.Comm.Broadcast(buf, root)
}

func (b *blind) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	b.coll(comm.Call{Kind: comm.KindReduce, Op: op, DType: send.DType, Count: send.Count, Root: root})
	return b.Comm.Reduce(send, recv, op, root)
}

func (b *blind) AllGather(send, recv comm.Buffer) comm.Work {
	b.coll(comm.Call{Kind: comm.KindAllGather, DType: send.DType, Count: send.Count})
	return b.Comm.AllGather(send, recv)
}

func (b *blind) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	b.coll(comm.Call{Kind: comm.KindReduceScatter, Op: op, DType: recv.DType, Count: recv.Count})
	return b.Comm.ReduceScatter(send, recv, op)
}

func (b *blind) Barrier() comm.Work {
	b.coll(comm.Call{Kind: comm.KindBarrier})
	return b.Comm.Barrier()
}

func (b *blind) Send(buf comm.Buffer, peer int) comm.Work {
	if peer >= 0 && peer < b.Size() && peer != b.Rank() {
		b.mu.Lock()
		b.sends[peer]++
		k := b.sends[peer]
		b.mu.Unlock()
		b.ref.message(b.Rank(), b.Rank(), peer, k, comm.Call{Kind: comm.KindSend, DType: buf.DType, Count: buf.Count, Root: peer})
	}
	return b.Comm.Send(buf, peer)
}

func (b *blind) Recv(buf comm.Buffer, peer int) comm.Work {
	if peer >= 0 && peer < b.Size() && peer != b.Rank() {
		b.mu.Lock()
		b.recvs[peer]++
		k := b.recvs[peer]
		b.mu.Unlock()
		b.ref.message(b.Rank(), peer, b.Rank(), k, comm.Call{Kind: comm.KindRecv, DType: buf.DType, Count: buf.Count, Root: peer})
	}
	return b.Comm.Recv(buf, peer)
}

// blindGroup returns n inproc ranks behind one referee, not wrapped.
func blindGroup(t testing.TB, n int, o inproc.Options) ([]comm.Communicator, *referee) {
	t.Helper()
	cs, err := inproc.NewGroupWith(n, o)
	if err != nil {
		t.Fatal(err)
	}
	ref := newReferee(n)
	out := make([]comm.Communicator, n)
	for r, c := range cs {
		out[r] = &blind{Comm: c, ref: ref, sends: make([]uint64, n), recvs: make([]uint64, n)}
	}
	return out, ref
}

// wrapAll wraps every rank of cs and closes them when the test ends.
func wrapAll(t testing.TB, cs []comm.Communicator, o checked.Options) []comm.Communicator {
	t.Helper()
	out := make([]comm.Communicator, len(cs))
	for r, c := range cs {
		w, err := checked.Wrap(c, o)
		if err != nil {
			t.Fatal(err)
		}
		out[r] = w
	}
	t.Cleanup(func() {
		for _, c := range out {
			c.Close()
		}
	})
	return out
}

// checkedGroup returns n wrapped inproc ranks behind a referee, which the
// test checks when it ends.
func checkedGroup(t testing.TB, n int, o inproc.Options) ([]comm.Communicator, *referee) {
	t.Helper()
	bs, ref := blindGroup(t, n, o)
	if tt, ok := t.(*testing.T); ok {
		t.Cleanup(func() { ref.check(tt) })
	}
	return wrapAll(t, bs, checked.Options{}), ref
}

// TestConformance runs the conformance suite, mismatch checks included,
// over wrapped ranks whose backend cannot detect a mismatch; every
// group's referee must see no mismatched call reach the backend.
func TestConformance(t *testing.T) {
	commtest.Run(t, func(t *testing.T, n int) []comm.Communicator {
		bs, ref := blindGroup(t, n, inproc.Options{})
		t.Cleanup(func() { ref.check(t) })
		out := make([]comm.Communicator, n)
		for r, b := range bs {
			w, err := checked.Wrap(b, checked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			out[r] = w
		}
		return out
	})
}

// scenario issues one call per rank that some ranks disagree on.
type scenario struct {
	name  string
	n     int
	issue func(c comm.Communicator) comm.Work
}

func f32(n int) comm.Buffer { return comm.Float32s(make([]float32, n)) }

var scenarios = []scenario{
	{"op on rank 2", 3, func(c comm.Communicator) comm.Work {
		op := comm.Sum
		if c.Rank() == 2 {
			op = comm.Max
		}
		b := f32(2)
		return c.AllReduce(b, b, op)
	}},
	{"odd rank 0 count", 4, func(c comm.Communicator) comm.Work {
		b := f32(7 + min(1, 1-c.Rank()))
		return c.AllReduce(b, b, comm.Sum)
	}},
	{"dtype", 2, func(c comm.Communicator) comm.Work {
		if c.Rank() == 1 {
			b := comm.Int32s(make([]int32, 5))
			return c.AllReduce(b, b, comm.Sum)
		}
		b := f32(5)
		return c.AllReduce(b, b, comm.Sum)
	}},
	{"kind", 3, func(c comm.Communicator) comm.Work {
		if c.Rank() == 1 {
			return c.Broadcast(f32(4), 0)
		}
		b := f32(4)
		return c.AllReduce(b, b, comm.Avg)
	}},
	{"root", 3, func(c comm.Communicator) comm.Work { return c.Broadcast(f32(4), min(c.Rank(), 1)) }},
	{"reduce op and root", 4, func(c comm.Communicator) comm.Work {
		if c.Rank() == 3 {
			return c.Reduce(f32(3), f32(3), comm.Min, 1)
		}
		return c.Reduce(f32(3), f32(3), comm.Sum, 0)
	}},
	{"all_gather count", 2, func(c comm.Communicator) comm.Work {
		k := 3 + c.Rank()
		return c.AllGather(f32(k), f32(2*k))
	}},
	{"barrier against all_reduce", 2, func(c comm.Communicator) comm.Work {
		if c.Rank() == 0 {
			return c.Barrier()
		}
		b := f32(1)
		return c.AllReduce(b, b, comm.Sum)
	}},
	{"message count", 2, func(c comm.Communicator) comm.Work {
		if c.Rank() == 0 {
			return c.Send(f32(4), 1)
		}
		return c.Recv(f32(5), 0)
	}},
	{"message dtype", 3, func(c comm.Communicator) comm.Work {
		switch c.Rank() {
		case 2:
			return c.Send(comm.Int64s(make([]int64, 2)), 0)
		case 0:
			return c.Recv(f32(4), 2)
		}
		return comm.Work{}
	}},
}

// TestSameMessageAsInproc runs each mismatch on bare inproc and on wrapped
// blind inproc: every rank gets the same error, word for word, after one
// good collective (so the mismatch is not the first call).
func TestSameMessageAsInproc(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			run := func(cs []comm.Communicator) []string {
				good := make([]comm.Work, len(cs))
				for r, c := range cs {
					b := f32(3)
					good[r] = c.AllReduce(b, b, comm.Sum)
				}
				for r, err := range testutil.WaitAll(t, good...) {
					if err != nil {
						t.Fatalf("rank %d: the first, good all_reduce: %v", r, err)
					}
				}
				ws := make([]comm.Work, len(cs))
				for r, c := range cs {
					ws[r] = sc.issue(c)
				}
				msgs := make([]string, len(cs))
				for r, err := range testutil.WaitAll(t, ws...) {
					if err != nil {
						msgs[r] = err.Error()
					}
				}
				return msgs
			}
			plain, err := inproc.NewGroup(sc.n)
			if err != nil {
				t.Fatal(err)
			}
			pcs := make([]comm.Communicator, sc.n)
			for r, c := range plain {
				pcs[r] = c
				defer c.Close()
			}
			want := run(pcs)
			wcs, _ := checkedGroup(t, sc.n, inproc.Options{})
			got := run(wcs)
			for r := range sc.n {
				if got[r] != want[r] {
					t.Errorf("rank %d:\nchecked: %s\n inproc: %s", r, got[r], want[r])
				}
				if want[r] != "" && !strings.Contains(want[r], comm.ErrMismatch.Error()) {
					t.Errorf("rank %d: inproc says %q, not a mismatch", r, want[r])
				}
			}
		})
	}
}

// TestMismatchNeverRuns: after a mismatched all-reduce the buffers hold
// what they held, no rank's backend received an all_reduce after the good
// one, and the group stays usable.
func TestMismatchNeverRuns(t *testing.T) {
	cs, ref := checkedGroup(t, 3, inproc.Options{})
	bufs := make([][]float32, 3)
	ws := make([]comm.Work, 3)
	for r, c := range cs {
		bufs[r] = []float32{float32(r), 1, 2}
		op := comm.Sum
		if r == 1 {
			op = comm.Max
		}
		ws[r] = c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), op)
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		var oe *comm.OpError
		if !errors.Is(err, comm.ErrMismatch) || !errors.As(err, &oe) || oe.Rank != r || oe.Seq != 1 || oe.Kind != comm.KindAllReduce {
			t.Errorf("rank %d: %v; want an OpError of rank %d, all_reduce #1, wrapping ErrMismatch", r, err, r)
		}
		if bufs[r][0] != float32(r) || bufs[r][1] != 1 || bufs[r][2] != 2 {
			t.Errorf("rank %d: buffer %v after a mismatched all_reduce; want it untouched", r, bufs[r])
		}
		if got := ref.received(r); !slices.Equal(got, []comm.Kind{comm.KindAllGather}) {
			t.Errorf("rank %d: the backend received %v; want only the fingerprint exchange", r, got)
		}
	}
	for r, c := range cs {
		ws[r] = c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), comm.Sum)
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if err != nil || bufs[r][0] != 3 || bufs[r][2] != 6 {
			t.Errorf("rank %d after the mismatch: %v, %v; want nil, [3 3 6]", r, err, bufs[r])
		}
	}
}

// TestInvalidOnOneRank: a call invalid on one rank only fails on every
// rank with ErrInvalid naming that rank and why, and never reaches the
// backend (where the valid ranks would wait for the invalid one).
func TestInvalidOnOneRank(t *testing.T) {
	for _, tc := range []struct {
		name  string
		issue func(c comm.Communicator) comm.Work
		why   string
	}{
		{"broadcast root", func(c comm.Communicator) comm.Work { return c.Broadcast(f32(4), 7*(c.Rank()%2)) }, "rank 1: broadcast(root 7, 4 x float) (seq 1): root 7 out of range for 3 ranks"},
		{"all_gather recv", func(c comm.Communicator) comm.Work { return c.AllGather(f32(2), f32(6+c.Rank()%2)) }, "rank 1: all_gather(2 x float) (seq 1): recv is 7 x float, want 6 x float"},
		{"all_reduce op", func(c comm.Communicator) comm.Work {
			b := f32(2)
			return c.AllReduce(b, b, comm.Op(1+98*(c.Rank()%2)))
		}, "rank 1: all_reduce(Op(99), 2 x float) (seq 1): reduction op Op(99)"},
		{"reduce_scatter dtype", func(c comm.Communicator) comm.Work {
			if c.Rank() == 1 {
				return c.ReduceScatter(comm.Int32s(make([]int32, 6)), f32(2), comm.Sum)
			}
			return c.ReduceScatter(f32(6), f32(2), comm.Sum)
		}, "rank 1: reduce_scatter(sum, 2 x float) (seq 1): send is 6 x int32, want 6 x float"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, ref := checkedGroup(t, 3, inproc.Options{})
			ws := make([]comm.Work, 3)
			for r, c := range cs {
				ws[r] = tc.issue(c)
			}
			for r, err := range testutil.WaitAll(t, ws...) {
				if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), "invalid call on rank(s) [1]") || !strings.Contains(err.Error(), tc.why) {
					t.Errorf("rank %d: %v; want ErrInvalid saying %q", r, err, tc.why)
				}
				if got := ref.received(r); !slices.Equal(got, []comm.Kind{comm.KindAllGather}) {
					t.Errorf("rank %d: the backend received %v; want only the fingerprint exchange", r, got)
				}
			}
		})
	}
}

// TestMessages: messages in a ring agree and arrive; a bad peer fails on
// its own rank at once.
func TestMessages(t *testing.T) {
	const n = 4
	cs, _ := checkedGroup(t, n, inproc.Options{})
	got := make([][]int64, n)
	var ws []comm.Work
	for r, c := range cs {
		got[r] = []int64{-1, -1}
		next, prev := (r+1)%n, (r+n-1)%n
		send := comm.Int64s([]int64{int64(r), int64(10 * r)})
		if r%2 == 0 {
			ws = append(ws, c.Send(send, next), c.Recv(comm.Int64s(got[r]), prev))
		} else {
			ws = append(ws, c.Recv(comm.Int64s(got[r]), prev), c.Send(send, next))
		}
	}
	for i, err := range testutil.WaitAll(t, ws...) {
		if err != nil {
			t.Fatalf("operation %d: %v", i, err)
		}
	}
	for r := range n {
		if prev := (r + n - 1) % n; got[r][0] != int64(prev) || got[r][1] != int64(10*prev) {
			t.Errorf("rank %d received %v from rank %d", r, got[r], prev)
		}
	}
	for _, peer := range []int{0, n, -1} {
		err := testutil.WaitAll(t, []comm.Work{cs[0].Send(f32(1), peer)}...)[0]
		if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("peer %d", peer)) {
			t.Errorf("send to peer %d: %v; want ErrInvalid naming the peer", peer, err)
		}
	}
}

// TestStallNamesMissingRanks: a rank left out of a collective is named in
// the wrapper's stall reports and by Missing, and after the timeout every
// waiting rank fails with ErrTimeout and the backend is aborted.
func TestStallNamesMissingRanks(t *testing.T) {
	bs, _ := blindGroup(t, 3, inproc.Options{})
	var mu sync.Mutex
	var stalls []comm.Stall
	cs := wrapAll(t, bs, checked.Options{Watchdog: comm.Watchdog{StallInterval: time.Millisecond, Timeout: 200 * time.Millisecond, OnStall: func(s comm.Stall) {
		mu.Lock()
		stalls = append(stalls, s)
		mu.Unlock()
	}}})
	ws := []comm.Work{cs[0].Barrier(), cs[1].Barrier()}
	for {
		m := comm.MissingRanks(cs[0], ws[0])
		if slices.Equal(m, []int{2}) {
			break
		}
		if done, err := ws[0].Test(); done {
			t.Fatalf("barrier without rank 2 completed: %v", err)
		}
		runtime.Gosched()
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if !errors.Is(err, comm.ErrTimeout) {
			t.Errorf("rank %d: %v; want ErrTimeout", r, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stalls) == 0 {
		t.Fatal("no stall reported")
	}
	// A report made before the other waiting rank's fingerprint arrived
	// names that rank too; every report names rank 2, and once both
	// waiting ranks have met, only rank 2.
	exact := false
	for _, s := range stalls {
		other := 1 - s.Rank
		early := slices.Equal(s.Missing, []int{min(other, 2), max(other, 2)})
		if s.Seq != 1 || s.Kind != comm.KindBarrier || (s.Rank != 0 && s.Rank != 1) || !(early || slices.Equal(s.Missing, []int{2})) {
			t.Errorf("stall %v; want rank 0 or 1 waiting in barrier #1 for rank 2 (and the other, before it arrived)", s)
		}
		exact = exact || slices.Equal(s.Missing, []int{2})
	}
	if !exact {
		t.Errorf("no stall report named rank 2 alone, of %d", len(stalls))
	}
	late := testutil.WaitAll(t, []comm.Work{cs[2].Barrier()}...)[0]
	if !errors.Is(late, comm.ErrAborted) {
		t.Errorf("the late rank after the timeout: %v; want ErrAborted", late)
	}
}

// TestAbortAndClose: Abort fails a pending operation of every rank;
// Close is idempotent, fails later operations with ErrClosed and leaves
// no goroutine behind.
func TestAbortAndClose(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		bs, _ := blindGroup(t, 2, inproc.Options{})
		cs := make([]comm.Communicator, 2)
		for r, b := range bs {
			w, err := checked.Wrap(b, checked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			cs[r] = w
		}
		pending := cs[0].AllReduce(f32(4), f32(4), comm.Sum)
		cs[1].Abort(errors.New("test"))
		if err := testutil.WaitAll(t, []comm.Work{pending}...)[0]; !errors.Is(err, comm.ErrAborted) {
			t.Errorf("pending all_reduce after rank 1 aborted: %v; want ErrAborted", err)
		}
		if err := testutil.WaitAll(t, []comm.Work{cs[1].Barrier()}...)[0]; !errors.Is(err, comm.ErrAborted) {
			t.Errorf("barrier on the aborted rank: %v; want ErrAborted", err)
		}
		for _, c := range cs {
			for range 2 {
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
		}
		if err := testutil.WaitAll(t, []comm.Work{cs[0].Barrier()}...)[0]; !errors.Is(err, comm.ErrClosed) {
			t.Errorf("barrier after Close: %v; want ErrClosed", err)
		}
	}()
	testutil.Goroutines(t, before)
}

// TestAllocs: a warm checked all-reduce and its Wait allocate nothing.
func TestAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	plain, err := inproc.NewGroup(2)
	if err != nil {
		t.Fatal(err)
	}
	cs := wrapAll(t, []comm.Communicator{plain[0], plain[1]}, checked.Options{})
	ctx := context.Background()
	bufs := []comm.Buffer{f32(1024), f32(1024)}
	ws := make([]comm.Work, 2)
	step := func() {
		for r, c := range cs {
			ws[r] = c.AllReduce(bufs[r], bufs[r], comm.Sum)
		}
		for _, w := range ws {
			if err := w.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 10 {
		step()
	}
	if a := testing.AllocsPerRun(200, step); a != 0 {
		t.Errorf("%v allocations per checked all_reduce + Wait on two ranks, want 0", a)
	}
}

func TestCaps(t *testing.T) {
	bs, _ := blindGroup(t, 1, inproc.Options{})
	cs := wrapAll(t, bs, checked.Options{})
	caps := comm.CapsOf(cs[0])
	if !caps.MismatchDetection || caps.Backend != "blind inproc" || !caps.HostMemory || !caps.NativeAvg {
		t.Errorf("Caps %+v; want the backend's with MismatchDetection", caps)
	}
	if _, ok := cs[0].(comm.Grouper); ok {
		t.Error("the wrapper of a backend without groups is a comm.Grouper")
	}
	if _, ok := cs[0].(comm.KernelSource); ok {
		t.Error("the wrapper of a backend without kernels is a comm.KernelSource")
	}
	if u, ok := cs[0].(interface{ Unwrap() comm.Communicator }); !ok || u.Unwrap() != bs[0] {
		t.Error("Unwrap does not return the wrapped communicator")
	}
	if _, err := checked.Wrap(bs[0], checked.Options{Watchdog: comm.Watchdog{Timeout: -1}}); !errors.Is(err, comm.ErrInvalid) {
		t.Errorf("a negative watchdog timeout: %v; want ErrInvalid", err)
	}
}

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{{"", false}, {"DETAIL", true}, {"detail", true}, {"INFO", false}, {"OFF", false}} {
		t.Setenv(checked.EnvVar, tc.v)
		if got := checked.Requested(); got != tc.want {
			t.Errorf("%s=%q: Requested() = %v, want %v", checked.EnvVar, tc.v, got, tc.want)
		}
	}
}
