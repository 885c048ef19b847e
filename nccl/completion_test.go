//go:build cgo

package nccl

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// The tests here hold the binding to what each NCCL's completion rule
// asks of it (the stand-in follows the one DDPGO_STANDIN_NCCL names, and
// make test runs them under each), and to what a Wait, Close and Abort
// promise while a launch settles or the stream does not drain.

// TestLaunchesShareAThread: one goroutine, locked to one OS thread,
// launches on two communicators in turn, as goroutines that the scheduler
// moves between threads can. NCCL 2.23-2.25 leave each launch's group job
// in the thread's storage until the communicator's next call: without
// the join made before the launch lets go, the second communicator's
// launch overwrites the first's job (the stand-in records it).
func TestLaunchesShareAThread(t *testing.T) {
	a, b := newGroup(t, 2, nil), newGroup(t, 2, nil)
	const rounds = 8
	peer := func(c *Comm) func() error {
		return func() error {
			for range rounds {
				x := floats(t, 4, 2)
				if err := c.AllReduce(x, x, comm.Sum).Wait(t.Context()); err != nil {
					return err
				}
			}
			return nil
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Go(func() { errs[1] = peer(a[1])() })
	wg.Go(func() { errs[2] = peer(b[1])() })
	wg.Go(func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for range rounds {
			x, y := floats(t, 4, 1), floats(t, 4, 1)
			wa := a[0].AllReduce(x, x, comm.Sum)
			wb := b[0].AllReduce(y, y, comm.Sum)
			if errs[0] = errors.Join(wa.Wait(t.Context()), wb.Wait(t.Context())); errs[0] != nil {
				return
			}
			if x.AsFloat32()[0] != 3 || y.AsFloat32()[0] != 3 {
				errs[0] = errors.New("wrong sums")
				return
			}
		}
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// settling starts an all-reduce of b on c whose launch answers
// ncclInProgress until the test ends (the stand-in's control), and
// returns once the launch is settling, holding the call lock; the Work
// arrives on the channel when the launch gives up.
func settling(t *testing.T, c *Comm, b comm.Buffer) <-chan comm.Work {
	t.Helper()
	before := c.deferred.Load()
	si.SetInProgress(1 << 30)
	t.Cleanup(func() { si.SetInProgress(0) })
	ch := make(chan comm.Work, 1)
	go func() { ch <- c.AllReduce(b, b, comm.Sum) }()
	for c.deferred.Load() == before {
		runtime.Gosched()
	}
	return ch
}

// streamIdle waits until c's stream has run everything put on it.
func waitStreamIdle(t *testing.T, c *Comm) {
	t.Helper()
	if err := lib.d.streamSync(c.ctx, c.stream); err != nil {
		t.Fatal(err)
	}
}

// TestWaitWhileSettling: a Wait returns at its context's end while
// another launch settles holding the call lock (it once waited for the
// lock, up to Config.Timeout), and Close makes the settle give up, its
// operation failing with ErrClosed, not after Config.Timeout with
// ErrTimeout; what had completed keeps its success.
func TestWaitWhileSettling(t *testing.T) {
	standInOnly(t)
	// No watchdog poll completes anything behind the test's back.
	c := newGroup(t, 1, func(cfg *Config) { cfg.PollInterval = time.Hour })[0]
	b := floats(t, 4, 1)
	done := c.AllReduce(b, b, comm.Sum)
	// Complete on the stream, not yet seen complete: Wait needs the lock.
	waitStreamIdle(t, c)
	ch := settling(t, c, floats(t, 4, 2))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := done.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a deadline while a launch settles: %v, want its deadline", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := wait(t, <-ch)[0]; !errors.Is(err, comm.ErrClosed) || errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("the settling launch after Close: %v, want ErrClosed", err)
	}
	if err := wait(t, done)[0]; err != nil {
		t.Fatalf("an all-reduce complete before Close: %v", err)
	}
}

// TestAbortQuarantine: when the stream does not drain after an abort (a
// long kernel of the user's holds it: a gate here), nothing it may still
// write is reused or freed: not the staging memory of a launch that gave
// up settling, nor the communicator's own memory at Close, nor a slab of
// Source's pool freed afterwards. The stand-in records a free of memory
// that queued work still uses. Once the stream runs again, Close and the
// pool's slabs are freed as usual.
func TestAbortQuarantine(t *testing.T) {
	standInOnly(t)
	c := newGroup(t, 1, func(cfg *Config) { cfg.PollInterval = time.Hour })[0]
	c.abortDrain = 0
	dev, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 4 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var open sync.Once
	gate := si.Gate(c.stream)
	t.Cleanup(func() { open.Do(gate.Open) })

	// Device memory: the all-reduce waits on the stream behind the gate.
	blk, err := dev.Get(64)
	if err != nil {
		t.Fatal(err)
	}
	d := comm.Buffer{Addr: blk.Addr(), Count: 16, DType: comm.Float32, Loc: comm.Device, Device: c.Device()}
	wd := c.AllReduce(d, d, comm.Sum)
	// The communicator's own memory: the barrier's scratch element.
	wb := c.Barrier()
	// Host memory: staged by copies behind the gate, while NCCL still
	// enqueues the all-reduce.
	ch := settling(t, c, floats(t, 4096, 1))

	cause := errors.New("the test gives up")
	c.Abort(cause)
	for _, w := range []comm.Work{wd, wb, <-ch} {
		if err := wait(t, w)[0]; !errors.Is(err, comm.ErrAborted) {
			t.Fatalf("pending work after Abort: %v, want ErrAborted", err)
		}
	}
	c.mu.Lock()
	leaked := c.leaked
	c.mu.Unlock()
	if leaked < 4096*4 {
		t.Errorf("%d bytes quarantined, want the staging of 4096 floats at least", leaked)
	}
	c.Close()
	dev.Put(blk)
	dev.Close()
	c.mu.Lock()
	kept := c.leaked - leaked
	c.mu.Unlock()
	if kept != 1<<20 {
		t.Errorf("closing the device pool while the stream may write it quarantined %d bytes, want its 1 MiB slab", kept)
	}

	// The stream runs again: what is freed from now on is freed.
	open.Do(gate.Open)
	waitStreamIdle(t, c)
	before := si.LiveAllocs(1) + si.LiveAllocs(0)
	src := c.Source()
	r, err := src.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Free(r); err != nil {
		t.Fatalf("Free once the stream is idle: %v", err)
	}
	if after := si.LiveAllocs(1) + si.LiveAllocs(0); after != before {
		t.Errorf("live device allocations %d, then %d after an Alloc and a Free", before, after)
	}
}

// TestAbortWhileKernelsRun: Abort while a long run of kernels holds the
// stream (on a GPU: twenty thousand Scales of 64 MiB; over the stand-in:
// a gate, or twenty Scales without its controls) fails the collective queued behind them, and neither Close nor
// the device pool frees memory under the stream; once the stream is idle
// the quarantined memory can go.
func TestAbortWhileKernelsRun(t *testing.T) {
	c := newGroup(t, 1, func(cfg *Config) { cfg.PollInterval = time.Hour })[0]
	c.abortDrain = 10 * time.Millisecond
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 128 << 20, SlabSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	blk, err := pool.Get(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b := comm.Buffer{Addr: blk.Addr(), Count: 16 << 20, DType: comm.Float32, Loc: comm.Device, Device: c.Device()}
	k := c.Kernels()
	k.Zero(b)
	var open sync.Once
	release := func() {}
	if si != nil {
		gate := si.Gate(c.stream)
		release = func() { open.Do(gate.Open) }
		t.Cleanup(release)
		k.Scale(b, 1)
	} else {
		n := 20000
		if lib.StandIn() != "" {
			// The stand-in's kernels run on the CPU: a few hold its
			// stream long enough (scripts/gpu-check.sh --standin).
			n = 20
		}
		for range n {
			k.Scale(b, 1)
		}
	}
	w := c.AllReduce(b, b, comm.Sum)
	c.Abort(errors.New("abort while kernels run"))
	if err := wait(t, w)[0]; !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("the all-reduce behind the kernels: %v, want ErrAborted", err)
	}
	c.Close()
	pool.Put(blk)
	pool.Close()
	c.mu.Lock()
	undrained, kept := c.undrained, c.leaked
	c.mu.Unlock()
	t.Logf("after Abort and Close: stream busy %v, %d bytes quarantined", undrained, kept)
	if undrained && kept < 64<<20 {
		t.Errorf("the stream is busy but the pool's 64 MiB slab was not quarantined (%d bytes kept)", kept)
	}
	release()
	if undrained {
		// Close kept the stream: wait for it, then the memory can go.
		waitStreamIdle(t, c)
		src := c.Source()
		r, err := src.Alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if err := src.Free(r); err != nil {
			t.Fatalf("Free once the stream is idle: %v", err)
		}
	}
}
