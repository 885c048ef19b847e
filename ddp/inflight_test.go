package ddp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// heldComm is a one-rank communicator whose all-reduces (and, with
// holdBroadcast, broadcasts) stay in flight until the test releases them,
// and which, with deaf, ignores Abort: the worst case a backend may
// present. It records the order in which collectives are issued and
// completed, and the groups the Reducer opens. A released all-reduce
// writes its result (the input times 1, plus mark) into recv, as a
// collective that completes late would.
type heldComm struct {
	commtest.Solo
	deaf          bool
	holdBroadcast bool
	mark          float32

	mu      sync.Mutex
	ops     []*heldOp
	events  []string
	changed chan struct{}
	aborted error
}

type heldOp struct {
	seq  int
	kind comm.Kind
	recv comm.Buffer
	done chan struct{}
	err  error
}

func newHeldComm() *heldComm { return &heldComm{changed: make(chan struct{}, 1)} }

func (c *heldComm) Capabilities() comm.Caps {
	return comm.Caps{Backend: "held", NativeAvg: true, HostMemory: true}
}

func (c *heldComm) hold(kind comm.Kind, recv comm.Buffer) comm.Work {
	c.mu.Lock()
	defer c.mu.Unlock()
	op := &heldOp{seq: len(c.ops), kind: kind, recv: recv, done: make(chan struct{})}
	c.ops = append(c.ops, op)
	c.events = append(c.events, fmt.Sprintf("issue %d", op.seq))
	if c.aborted != nil && !c.deaf {
		op.err = c.aborted
		close(op.done)
	}
	c.notify()
	return comm.NewWork(c, uint64(op.seq))
}

func (c *heldComm) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *heldComm) AllReduce(_, recv comm.Buffer, _ comm.Op) comm.Work {
	return c.hold(comm.KindAllReduce, recv)
}

func (c *heldComm) Broadcast(buf comm.Buffer, root int) comm.Work {
	if !c.holdBroadcast {
		return comm.Work{}
	}
	return c.hold(comm.KindBroadcast, buf)
}

func (c *heldComm) GroupStart() {
	c.mu.Lock()
	c.events = append(c.events, "group")
	c.mu.Unlock()
}

func (c *heldComm) GroupEnd() error {
	c.mu.Lock()
	c.events = append(c.events, "end")
	c.notify()
	c.mu.Unlock()
	return nil
}

func (c *heldComm) Abort(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted == nil {
		c.aborted = fmt.Errorf("%w: %w", comm.ErrAborted, err)
	}
	if c.deaf {
		return
	}
	for _, op := range c.ops {
		select {
		case <-op.done:
		default:
			op.err = c.aborted
			close(op.done)
		}
	}
}

// release completes operation seq, writing mark into its buffer first.
func (c *heldComm) release(seq int) {
	c.mu.Lock()
	op := c.ops[seq]
	c.mu.Unlock()
	if op.kind == comm.KindAllReduce && op.recv.Count > 0 {
		v := op.recv.AsFloat32()
		for i := range v {
			v[i] += c.mark
		}
	}
	c.mu.Lock()
	c.events = append(c.events, fmt.Sprintf("complete %d", seq))
	close(op.done)
	c.mu.Unlock()
}

// waitIssued waits until n operations have been issued.
func (c *heldComm) waitIssued(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		got := len(c.ops)
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-c.changed:
		case <-deadline:
			t.Fatalf("%d operations issued after 10s, want %d (events %v)", got, n, c.log())
		}
	}
}

// waitLogged waits until the log from event from on holds ev.
func (c *heldComm) waitLogged(t *testing.T, from int, ev string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if l := c.log(); len(l) > from && slices.Contains(l[from:], ev) {
			return
		}
		select {
		case <-c.changed:
		case <-deadline:
			t.Fatalf("no %q logged after event %d: %v", ev, from, c.log())
		}
	}
}

func (c *heldComm) log() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.events...)
}

func (c *heldComm) WaitOp(ctx context.Context, id uint64) error {
	c.mu.Lock()
	op := c.ops[id]
	c.mu.Unlock()
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *heldComm) TestOp(id uint64) (bool, error) {
	c.mu.Lock()
	op := c.ops[id]
	c.mu.Unlock()
	select {
	case <-op.done:
		return true, op.err
	default:
		return false, nil
	}
}

// fourParams make four buckets of one parameter each with 64-byte caps.
var fourParams = []Param{{Name: "w0", Shape: []int{16}}, {Name: "w1", Shape: []int{16}}, {Name: "w2", Shape: []int{16}}, {Name: "w3", Shape: []int{16}}}

func heldOpts(o Options) Options {
	o.BucketCap, o.FirstBucketCap, o.KeepLayout = 64, 64, true
	return o
}

// TestPipelined: with collectives that take longer than the gaps between
// gradients, bucket k+1 goes on the wire before bucket k completes, and
// every bucket completes in order; buckets complete at the same time
// launch as one group.
func TestPipelined(t *testing.T) {
	testutil.NoLeak(t)
	c := newHeldComm()
	r, err := New(context.Background(), c, fourParams, heldOpts(Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	// Parameters 3, 2, 1 one by one: buckets 0, 1, 2 launch one by one,
	// none of them complete.
	for j, i := range []int{3, 2, 1} {
		if err := r.Ready(i); err != nil {
			t.Fatal(err)
		}
		c.waitIssued(t, j+1)
	}
	c.release(0)
	c.release(1)
	if err := r.Ready(0); err != nil {
		t.Fatal(err)
	}
	c.waitIssued(t, 4)
	c.release(2)
	c.release(3)
	if err := r.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := "issue 0,issue 1,issue 2,complete 0,complete 1,issue 3,complete 2,complete 3"
	if got := strings.Join(c.log(), ","); got != want {
		t.Errorf("events %s\nwant   %s", got, want)
	}

	// All four complete at once (Ready in reverse order: bucket 3 first):
	// they launch as one group.
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1, 2, 3} {
		if err := r.Ready(i); err != nil {
			t.Fatal(err)
		}
	}
	c.waitIssued(t, 8)
	// The group ends after its last issue: release nothing before, or a
	// completion could be logged ahead of the end.
	c.waitLogged(t, 8, "end")
	for k := 4; k < 8; k++ {
		c.release(k)
	}
	if err := r.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	ev := c.log()[8:]
	if got := strings.Join(ev[:6], ","); got != "group,issue 4,issue 5,issue 6,issue 7,end" {
		t.Errorf("second step %v; want the four buckets issued as one group", ev)
	}
}

// TestMaxInFlight: with a window of one bucket, bucket k+1 is issued only
// after bucket k completed.
func TestMaxInFlight(t *testing.T) {
	testutil.NoLeak(t)
	synctest.Test(t, func(t *testing.T) {
		c := newHeldComm()
		r, err := New(context.Background(), c, fourParams, heldOpts(Options{MaxInFlight: 1}))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := r.Begin(Sync); err != nil {
			t.Fatal(err)
		}
		for _, i := range []int{3, 2, 1, 0} {
			if err := r.Ready(i); err != nil {
				t.Fatal(err)
			}
		}
		for k := range 4 {
			c.waitIssued(t, k+1)
			// Every goroutine of the bubble is blocked: a wrong second
			// launch would have been issued by now.
			synctest.Wait()
			c.release(k)
		}
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		want := "issue 0,complete 0,issue 1,complete 1,issue 2,complete 2,issue 3,complete 3"
		if got := strings.Join(c.log(), ","); got != want {
			t.Errorf("events %s\nwant   %s", got, want)
		}
	})
}

// inUse returns the bytes of pool in use.
func inUse(pool *allocator.Pool) int64 { return pool.Stats().InUse }

// waitInUse waits until pool has want bytes in use.
func waitInUse(t *testing.T, pool *allocator.Pool, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for inUse(pool) != want {
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d bytes in use after 10s, want %d", inUse(pool), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNoReleaseInFlight: memory a collective may still write stays out of
// the pool until the collective completes, whatever made the Reducer let
// go of it: Close during a step, a failed step, a failed
// BroadcastParameters. The communicator ignores Abort (the worst case), so
// the Reducer gives up waiting after DrainTimeout, reports ErrInFlight,
// and returns the memory once the collective completes; the late write
// lands in memory nobody else holds.
func TestNoReleaseInFlight(t *testing.T) {
	testutil.NoLeak(t)
	cases := []struct {
		name string
		run  func(t *testing.T, r *Reducer, c *heldComm) error // leaves collectives in flight; returns the error that reports it
	}{
		{"close during step", func(t *testing.T, r *Reducer, c *heldComm) error {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			if err := r.Ready(3); err != nil {
				t.Fatal(err)
			}
			c.waitIssued(t, 1)
			return r.Close()
		}},
		{"failed step", func(t *testing.T, r *Reducer, c *heldComm) error {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{3, 2, 1, 0} {
				if err := r.Ready(i); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if err := r.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Wait with a collective held: %v", err)
			}
			return r.Close()
		}},
		{"failed broadcast", func(t *testing.T, r *Reducer, c *heldComm) error {
			c.holdBroadcast = true
			vals := make([][]float32, len(fourParams))
			for i := range vals {
				vals[i] = make([]float32, 16)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			err := r.BroadcastParameters(ctx, vals)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("BroadcastParameters with the broadcast held: %v", err)
			}
			if cerr := r.Close(); cerr != nil {
				t.Fatalf("Close after the failed broadcast: %v", cerr)
			}
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := allocator.New(allocator.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			c := newHeldComm()
			c.deaf, c.mark = true, 1e6
			r, err := New(context.Background(), c, fourParams, heldOpts(Options{Pool: pool, DrainTimeout: 20 * time.Millisecond}))
			if err != nil {
				t.Fatal(err)
			}
			held := inUse(pool)
			err = tc.run(t, r, c)
			if !errors.Is(err, ErrInFlight) {
				t.Fatalf("letting go of memory with a collective in flight: %v, want ErrInFlight", err)
			}
			if got := inUse(pool); got == 0 || got > held {
				t.Fatalf("%d bytes in use after Close with a collective in flight (%d before Close); want the in-flight memory still held", got, held)
			}
			// Nobody else can be handed that memory: take all the pool has.
			var blocks []allocator.Block
			for {
				b, err := pool.Get(512)
				if err != nil {
					break
				}
				clear(b.Bytes())
				blocks = append(blocks, b)
				if len(blocks) > 1<<12 {
					break
				}
			}
			c.mu.Lock()
			n := len(c.ops)
			c.mu.Unlock()
			for k := range n {
				c.release(k)
			}
			for _, b := range blocks {
				for _, v := range b.Bytes() {
					if v != 0 {
						t.Fatalf("a block handed out after Close was written by the late collective")
					}
				}
				pool.Put(b)
			}
			waitInUse(t, pool, 0)
		})
	}
}

// TestCloseMidCollective closes one rank 30 times while a large all-reduce
// is running, with a pool shared by both ranks (64 MiB: its freed blocks
// the invariants build poisons and checks at the next Get) and with the
// Reducer's own pool (16 MiB, since each round maps and faults in a fresh
// pool, which Close unmaps): the memory goes back only once the backend
// has stopped writing it, so there is no crash and no write after release.
func TestCloseMidCollective(t *testing.T) {
	testutil.NoLeak(t)
	for _, shared := range []bool{false, true} {
		elems, rounds := 4<<20, 30
		if shared {
			elems = 16 << 20
		}
		if testing.Short() {
			elems, rounds = 1<<20, 5
		}
		params := []Param{{Name: "big", Shape: []int{elems}}}
		t.Run(fmt.Sprintf("shared pool %v", shared), func(t *testing.T) {
			var pool *allocator.Pool
			if shared {
				var err error
				if pool, err = allocator.New(allocator.Options{Limit: 4 << 30}); err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
			}
			for round := range rounds {
				cs := newTestGroup(t, 2)
				errs := runRanks(cs, func(rank int, c comm.Communicator) error {
					r, err := New(context.Background(), c, params, Options{Pool: pool, KeepLayout: true, NoZeroGrad: true})
					if err != nil {
						return err
					}
					if err := r.Begin(Sync); err != nil {
						return err
					}
					if err := r.Ready(0); err != nil {
						return err
					}
					if rank == 0 {
						// Close as the collective runs; rank 1 sees the abort.
						time.Sleep(time.Duration(round%5) * 100 * time.Microsecond)
						return r.Close()
					}
					r.Wait(context.Background())
					return r.Close()
				})
				for rank, err := range errs {
					if err != nil {
						t.Fatalf("round %d: rank %d: %v", round, rank, err)
					}
				}
				if shared {
					waitInUse(t, pool, 0)
					// A Get of the freed memory checks its poison (invariants).
					b, err := pool.Get(4 * elems)
					if err != nil {
						t.Fatal(err)
					}
					pool.Put(b)
				}
			}
		})
	}
}

// TestCloseEndsWait: Close ends a Wait (here WaitEach, whose loop the test
// can see it enter) blocked on another goroutine with
// ErrClosed even when the backend leaves the collective in flight after
// Abort (the finisher then stops without reducing the bucket, so nothing
// else would wake the Wait).
func TestCloseEndsWait(t *testing.T) {
	testutil.NoLeak(t)
	c := newHeldComm()
	c.deaf = true
	r, err := New(context.Background(), c, fourParams, heldOpts(Options{DrainTimeout: 20 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{3, 2, 1, 0} {
		if err := r.Ready(i); err != nil {
			t.Fatal(err)
		}
	}
	c.waitIssued(t, 1)
	waited := make(chan error, 1)
	go func() { waited <- r.WaitEach(context.Background(), func(Reduced) {}) }()
	for !r.watch.Load() { // WaitEach is past its checks, in its wait loop
		runtime.Gosched()
	}
	if err := r.Close(); !errors.Is(err, ErrInFlight) {
		t.Fatalf("Close with a collective in flight: %v, want ErrInFlight", err)
	}
	select {
	case err := <-waited:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Wait ended by Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still blocked 10 s after Close returned")
	}
	c.mu.Lock()
	n := len(c.ops)
	c.mu.Unlock()
	for k := range n {
		c.release(k)
	}
}
