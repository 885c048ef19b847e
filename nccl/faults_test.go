//go:build cgo

package nccl

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// floats returns a host pool buffer of n float32 values v.
func floats(t testing.TB, n int, v float32) comm.Buffer {
	blk, err := hostPool(t).Get(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	f := blk.Float32s()[:n]
	for i := range f {
		f[i] = v
	}
	return comm.Float32s(f)
}

// TestInProgress runs initialisation and collectives while the stand-in
// answers ncclInProgress: the binding must poll ncclCommGetAsyncError,
// hold later launches until it reports success, and record each
// operation's event only then.
func TestInProgress(t *testing.T) {
	standInOnly(t)
	testutil.NoLeak(t)
	si.SetInProgress(3)
	defer si.SetInProgress(0)
	cs := newGroup(t, 2, nil)
	bufs := [][]comm.Buffer{{floats(t, 8, 1), floats(t, 8, 2), floats(t, 8, 3)}, {floats(t, 8, 10), floats(t, 8, 20), floats(t, 8, 30)}}
	launches0, inProgress0 := cs[0].lib.Launches()
	runRanks(t, cs, func(r int, c *Comm) error {
		var ws []comm.Work
		for _, b := range bufs[r] {
			ws = append(ws, c.AllReduce(b, b, comm.Sum))
		}
		c.GroupStart()
		ws = append(ws, c.AllReduce(bufs[r][0], bufs[r][0], comm.Sum), c.Barrier())
		if err := c.GroupEnd(); err != nil {
			return err
		}
		for _, w := range ws {
			if err := w.Wait(t.Context()); err != nil {
				return err
			}
		}
		return nil
	})
	for r := range 2 {
		for i, want := range []float32{22, 22, 33} {
			if got := bufs[r][i].AsFloat32()[7]; got != want {
				t.Errorf("rank %d buffer %d = %v, want %v", r, i, got, want)
			}
		}
	}
	// Per rank, three launches of one all-reduce and one of a group.
	launches, inProgress := cs[0].lib.Launches()
	if launches-launches0 != 8 || inProgress-inProgress0 != 8 {
		t.Errorf("Library.Launches: %d launches, %d answered ncclInProgress; want 8 and 8", launches-launches0, inProgress-inProgress0)
	}
}

// TestAsyncError: an asynchronous error found by the watchdog aborts the
// communicator; the pending operation fails naming the rank, operation,
// sequence number and NCCL's last error, and so do later ones.
func TestAsyncError(t *testing.T) {
	standInOnly(t)
	testutil.NoLeak(t)
	cs := newGroup(t, 2, nil)
	b := floats(t, 4, 1)
	w := cs[0].AllReduce(b, b, comm.Sum) // rank 1 never joins it
	si.AsyncError(cs[0].handle, int(ResultSystemError), "stand-in: injected failure")
	err := wait(t, w)[0]
	var oe *comm.OpError
	if !errors.Is(err, comm.ErrAborted) || !errors.As(err, &oe) || oe.Rank != 0 || oe.Seq != 1 || oe.Kind != comm.KindAllReduce {
		t.Fatalf("pending all-reduce: %v, want an OpError of rank 0, #1, all_reduce wrapping ErrAborted", err)
	}
	for _, want := range []string{"ncclSystemError", "stand-in: injected failure", "rank 0", "all_reduce #1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := wait(t, cs[0].Barrier())[0]; !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("barrier after the abort: %v, want ErrAborted", err)
	}
}

// TestStallTimeout: a rank that never joins is reported as a stall, then
// the deadline aborts the communicator and the operation fails with
// comm.ErrTimeout, on both sides.
func TestStallTimeout(t *testing.T) {
	standInOnly(t)
	testutil.NoLeak(t)
	var stalls atomic.Int32
	cs := newGroup(t, 2, func(c *Config) {
		c.Timeout = 300 * time.Millisecond
		c.StallInterval = 50 * time.Millisecond
		c.OnStall = func(s comm.Stall) {
			if s.Kind == comm.KindAllReduce && s.Seq == 1 && s.Missing == nil && s.Detail == "4 x float" &&
				strings.Contains(s.String(), "cannot tell which ranks") {
				stalls.Add(1)
			}
		}
	})
	si.Stall(cs[1].handle, true)
	b0, b1 := floats(t, 4, 1), floats(t, 4, 2)
	start := time.Now()
	errs := wait(t, cs[0].AllReduce(b0, b0, comm.Sum), cs[1].AllReduce(b1, b1, comm.Sum))
	for r, err := range errs {
		if !errors.Is(err, comm.ErrTimeout) || !errors.Is(err, comm.ErrAborted) {
			t.Errorf("rank %d: %v, want ErrTimeout and ErrAborted", r, err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the timeout of 300ms took %v", d)
	}
	if stalls.Load() < 2 {
		t.Errorf("%d stall reports, want some from each rank", stalls.Load())
	}
	if b0.AsFloat32()[0] != 1 || b1.AsFloat32()[0] != 2 {
		t.Errorf("a failed all-reduce wrote its buffers: %v %v", b0.AsFloat32(), b1.AsFloat32())
	}
}

// TestAbort: Abort is local and bounded; the peer learns of it through
// its own failure (the stand-in reports a remote error, as NCCL's network
// transport does).
func TestAbort(t *testing.T) {
	testutil.NoLeak(t)
	cs := newGroup(t, 2, nil)
	b0, b1 := floats(t, 4, 1), floats(t, 4, 2)
	w := cs[0].AllReduce(b0, b0, comm.Sum)
	cause := errors.New("the test gives up")
	start := time.Now()
	cs[0].Abort(cause)
	cs[0].Abort(errors.New("again"))
	err := wait(t, w)[0]
	if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, cause) {
		t.Fatalf("pending work after Abort: %v, want ErrAborted and the cause", err)
	}
	if d := time.Since(start); d > AbortDrain {
		t.Fatalf("Abort took %v", d)
	}
	if err := wait(t, cs[0].AllReduce(b0, b0, comm.Sum))[0]; !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("work after Abort: %v", err)
	}
	err = wait(t, cs[1].AllReduce(b1, b1, comm.Sum))[0]
	if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "rank 0 of the communicator was aborted") {
		t.Fatalf("peer of an aborted rank: %v", err)
	}
}

// TestClose: Close fails pending work with ErrClosed, is idempotent, and
// later work fails too.
func TestClose(t *testing.T) {
	testutil.NoLeak(t)
	cs := newGroup(t, 2, nil)
	b := floats(t, 4, 1)
	w := cs[0].AllReduce(b, b, comm.Sum)
	if err := cs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, w)[0]; !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("pending work after Close: %v, want ErrClosed", err)
	}
	if err := cs[0].Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := wait(t, cs[0].Barrier())[0]; !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("work after Close: %v, want ErrClosed", err)
	}
	if err := wait(t, cs[1].Barrier())[0]; err == nil {
		t.Fatal("the peer of a closed rank completed a barrier")
	}
}

// TestWaitDeadline: Wait honours its context and leaves the operation
// pending.
func TestWaitDeadline(t *testing.T) {
	cs := newGroup(t, 2, nil)
	b0, b1 := floats(t, 4, 1), floats(t, 4, 2)
	w := cs[0].AllReduce(b0, b0, comm.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "all_reduce #1") {
		t.Fatalf("Wait with a deadline: %v", err)
	}
	if done, _ := w.Test(); done {
		t.Fatal("the all-reduce completed without rank 1")
	}
	waitOK(t, w, cs[1].AllReduce(b1, b1, comm.Sum))
	if b0.AsFloat32()[3] != 3 {
		t.Fatalf("all-reduce after a Wait deadline: %v", b0.AsFloat32())
	}
}

// TestInvalid: bad arguments fail as ErrInvalid without a launch.
func TestInvalid(t *testing.T) {
	cs := newGroup(t, 2, nil)
	c := cs[0]
	f, g := floats(t, 4, 1), floats(t, 8, 1)
	other := comm.Buffer{Addr: f.Addr, Count: 4, DType: comm.Float32, Loc: comm.Device, Device: 3}
	for name, w := range map[string]comm.Work{
		"count":     c.AllReduce(f, g, comm.Sum),
		"op":        c.AllReduce(f, f, comm.Op(9)),
		"dtype":     c.AllReduce(comm.Buffer{Addr: f.Addr, Count: 1}, comm.Buffer{Addr: f.Addr, Count: 1}, comm.Sum),
		"root":      c.Broadcast(f, 2),
		"peer":      c.Send(f, 0),
		"device":    c.AllReduce(other, other, comm.Sum),
		"gather":    c.AllGather(f, f),
		"scatter":   c.ReduceScatter(f, f, comm.Sum),
		"overlap":   c.AllReduce(g.Slice(0, 4), g.Slice(2, 4), comm.Sum),
		"nil":       c.AllReduce(comm.Buffer{Count: 2, DType: comm.Float32}, f.Slice(0, 2), comm.Sum),
		"groupless": comm.FailedWork(c.GroupEnd()),
	} {
		if err := wait(t, w)[0]; !errors.Is(err, comm.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestStreamOrder checks the three ordering primitives by what the
// collective reads and what the caller's stream then sees, with gates,
// points in a stream that the stand-in holds until the test opens them.
// The stand-in's streams are threads of its own and the binding calls it
// through cgo, so testing/synctest cannot order them; nor can the test
// see a stream parked at a wait, so it does not wait for one: the user's
// work behind the gate changes the all-reduce's input, and a collective
// that ran before it reduced the old value. The Test calls before a gate
// opens hold at any instant; they catch an early run only if it has
// already happened.
func TestStreamOrder(t *testing.T) {
	standInOnly(t)
	cs := newGroup(t, 2, nil)
	c := cs[0]
	user, err := lib.d.streamCreate(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.d.streamDestroy(c.ctx, user)
	// zeroBehindGate holds the user stream at a gate, then zeroes b on
	// it; the function returned opens the gate, as the test's end does if
	// it fails first.
	zeroBehindGate := func(b comm.Buffer) (open func()) {
		t.Helper()
		gate := si.Gate(user)
		var once sync.Once
		open = func() { once.Do(gate.Open) }
		t.Cleanup(open)
		if err := lib.d.memset(c.ctx, uintptr(b.Addr), 0, b.Bytes(), user); err != nil {
			t.Fatal(err)
		}
		return open
	}
	// reduced checks both ranks' results: rank 1's 2 plus rank 0's 0,
	// as the user stream left it (rank 0's 1 if the all-reduce ran first).
	reduced := func(what string, b0, b1 comm.Buffer) {
		t.Helper()
		if got0, got1 := b0.AsFloat32()[3], b1.AsFloat32()[3]; got0 != 2 || got1 != 2 {
			t.Errorf("%s: all-reduce gave %v and %v, want 2 (rank 0's input zeroed on the user stream, plus 2)", what, got0, got1)
		}
	}

	// The communicator's stream waits for the user's: the all-reduce
	// issued after WaitStream reads what the user stream wrote behind
	// the gate.
	b0, b1 := floats(t, 4, 1), floats(t, 4, 2)
	open := zeroBehindGate(b0)
	if err := c.WaitStream(Stream(user)); err != nil {
		t.Fatal(err)
	}
	w0, w1 := c.AllReduce(b0, b0, comm.Sum), cs[1].AllReduce(b1, b1, comm.Sum)
	if done, _ := w0.Test(); done {
		t.Fatal("the all-reduce ran before the user stream's work")
	}
	open()
	waitOK(t, w0, w1)
	reduced("after WaitStream", b0, b1)

	// The same through an event the caller records.
	uev, err := lib.d.eventCreate(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.d.eventDestroy(c.ctx, uev)
	b0, b1 = floats(t, 4, 1), floats(t, 4, 2)
	open = zeroBehindGate(b0)
	if err := lib.d.eventRecord(c.ctx, uev, user); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitEvent(Event(uev)); err != nil {
		t.Fatal(err)
	}
	w0, w1 = c.AllReduce(b0, b0, comm.Sum), cs[1].AllReduce(b1, b1, comm.Sum)
	if done, _ := w0.Test(); done {
		t.Fatal("the all-reduce ran before the event it waits for")
	}
	open()
	waitOK(t, w0, w1)
	reduced("after WaitEvent", b0, b1)

	// A user stream waits for a Work: a copy issued on it after
	// StreamWait reads the collective's result. Device memory, whose
	// result is in place when the Work's event completes (a host
	// buffer's comes back later).
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 4 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	blk, err := pool.Get(16)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Put(blk)
	d := comm.Buffer{Addr: blk.Addr(), Count: 4, DType: comm.Float32, Loc: comm.Device, Device: c.Device()}
	c.Kernels().Zero(d)
	b1, out := floats(t, 4, 2), floats(t, 4, -1)
	w0 = c.AllReduce(d, d, comm.Sum)
	if err := c.StreamWait(Stream(user), w0); err != nil {
		t.Fatal(err)
	}
	if err := lib.d.dtod(c.ctx, uintptr(out.Addr), uintptr(d.Addr), d.Bytes(), user); err != nil {
		t.Fatal(err)
	}
	ev, err := lib.d.eventCreate(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.d.eventDestroy(c.ctx, ev)
	if err := lib.d.eventRecord(c.ctx, ev, user); err != nil {
		t.Fatal(err)
	}
	if ok, _ := lib.d.eventQuery(c.ctx, ev); ok {
		t.Fatal("the user stream went past StreamWait before the collective ran")
	}
	waitOK(t, w0, cs[1].AllReduce(b1, b1, comm.Sum))
	// Once the Work has completed, the user stream runs to its end.
	if err := lib.d.streamSync(c.ctx, user); err != nil {
		t.Fatal(err)
	}
	if got := out.AsFloat32()[3]; got != 2 {
		t.Errorf("the user stream's copy after StreamWait read %v, want the all-reduce's 2 (0 if it ran first)", got)
	}
	if err := c.StreamWait(Stream(user), w0); err != nil {
		t.Fatalf("StreamWait for a completed Work: %v", err)
	}
}

// TestOneGoroutineSeveralDevices: NewComms initialises two ranks from one
// goroutine inside a group, and one goroutine drives both.
func TestOneGoroutineSeveralDevices(t *testing.T) {
	if si == nil && devices < 2 {
		t.Skipf("needs 2 devices; this machine has %d", devices)
	}
	testutil.NoLeak(t)
	id, err := lib.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := lib.NewComms(t.Context(), []Config{testConfig(0, 2, id), testConfig(1, 2, id)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	if cs[0].Device() != 0 || cs[1].Device() != 1 {
		t.Fatalf("devices %d, %d", cs[0].Device(), cs[1].Device())
	}
	b0, b1 := floats(t, 4, 1), floats(t, 4, 2)
	var mu sync.Mutex
	mu.Lock()
	waitOK(t, cs[0].AllReduce(b0, b0, comm.Max), cs[1].AllReduce(b1, b1, comm.Max))
	mu.Unlock()
	if b0.AsFloat32()[0] != 2 || b1.AsFloat32()[0] != 2 {
		t.Fatalf("max: %v %v", b0.AsFloat32(), b1.AsFloat32())
	}
}
