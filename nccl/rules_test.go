//go:build cgo

package nccl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// The tests here hold the binding to NCCL's rules for non-blocking
// communicators (see calls.go). Over the stand-in following NCCL 2.23 or
// newer (DDPGO_STANDIN_NCCL; 2.26 by default) every enqueue answers
// ncclInProgress, and the stand-in records any breach (newGroup fails the
// test on one).

// TestGroupStaysGroup: a group is launched as one group whenever its turn
// comes, also when the launch before it is still being enqueued by NCCL:
// NCCL picks algorithms from a group's combined size, so ranks that split
// a group differently can hang or corrupt data.
func TestGroupStaysGroup(t *testing.T) {
	standInOnly(t)
	const n = 2
	cs := newGroup(t, n, nil)
	runRanks(t, cs, func(r int, c *Comm) error {
		var ws []comm.Work
		for round := range 5 {
			b := floats(t, 8, float32(r+1))
			ws = append(ws, c.AllReduce(b, b, comm.Sum))
			c.GroupStart()
			for range 3 {
				g := floats(t, 8, float32(r+1))
				ws = append(ws, c.AllReduce(g, g, comm.Sum))
			}
			if round%2 == 1 {
				// A nested group is part of the outer one.
				c.GroupStart()
				g := floats(t, 8, float32(r+1))
				ws = append(ws, c.AllReduce(g, g, comm.Sum))
				if err := c.GroupEnd(); err != nil {
					return err
				}
			}
			if err := c.GroupEnd(); err != nil {
				return err
			}
		}
		for i, w := range ws {
			if err := w.Wait(t.Context()); err != nil {
				return fmt.Errorf("work %d: %w", i, err)
			}
		}
		return nil
	})
	want := []int{1, 3, 1, 4, 1, 3, 1, 4, 1, 3}
	for r, c := range cs {
		if got := si.Launches(c.handle); !slices.Equal(got, want) {
			t.Errorf("rank %d launched %v, want %v (each group one launch)", r, got, want)
		}
	}
}

// TestOneCallerAtATime: with the watchdog polling every millisecond and
// two goroutines per rank testing and waiting for work while collectives
// and kernels are issued, no two calls into one communicator overlap and
// nothing goes on a stream while NCCL enqueues on it (the stand-in
// records either).
func TestOneCallerAtATime(t *testing.T) {
	standInOnly(t)
	const n = 2
	cs := newGroup(t, n, func(cfg *Config) { cfg.PollInterval = time.Millisecond })
	runRanks(t, cs, func(r int, c *Comm) error {
		pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 64 << 20, SlabSize: 1 << 20})
		if err != nil {
			return err
		}
		defer pool.Close()
		m := newMem(t, c, pool, 1024, comm.Float32)
		k := c.Kernels()
		var works []comm.Work
		var mu sync.Mutex
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					ws := slices.Clone(works)
					mu.Unlock()
					for _, w := range ws {
						w.Test()
					}
				}
			})
		}
		for range 100 {
			w := c.AllReduce(m.buf, m.buf, comm.Max)
			k.Scale(m.buf, 1)
			mu.Lock()
			works = append(works, w)
			mu.Unlock()
		}
		for _, w := range works {
			if err := w.Wait(t.Context()); err != nil {
				close(stop)
				wg.Wait()
				return err
			}
		}
		close(stop)
		wg.Wait()
		return k.Sync()
	})
}

// TestCommunicatorsApart: several communicators of one process (NewComms,
// as ddpbench --ranks runs them), each driven from goroutines that the Go
// scheduler moves between OS threads, never have two group jobs on one
// thread (NCCL 2.14-2.26 keep the job in thread-local storage).
func TestCommunicatorsApart(t *testing.T) {
	standInOnly(t)
	testutil.NoLeak(t)
	id, err := lib.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	cfgs := make([]Config, n)
	for r := range n {
		cfgs[r] = testConfig(r, n, id)
	}
	noViolations(t)
	cs, err := lib.NewComms(t.Context(), cfgs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	runRanks(t, cs, func(r int, c *Comm) error {
		for i := range 50 {
			var wg sync.WaitGroup
			var errs [2]error
			for j := range 2 {
				// Issue from a new goroutine each time: it may run on any
				// thread, and so may the previous issuer's.
				wg.Go(func() {
					b := floats(t, 4, float32(r))
					errs[j] = c.AllReduce(b, b, comm.Sum).Wait(t.Context())
				})
				wg.Wait()
			}
			if err := errors.Join(errs[:]...); err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
		}
		return nil
	})
}

// TestOverflowsConcurrent: concurrent Overflows calls on one communicator
// each count their own buffer (they share the device counter).
func TestOverflowsConcurrent(t *testing.T) {
	c := newGroup(t, 1, nil)[0]
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 64 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	k := c.Kernels()
	const count = 4096
	// Buffer i holds i+1 overflows: float32 values past half's range.
	type pair struct{ wire, in *mem }
	var ps [4]pair
	for i := range ps {
		in := make([]float32, count)
		for j := range in {
			in[j] = 1
			if j <= i {
				in[j] = 1e6
			}
		}
		ps[i] = pair{newMem(t, c, pool, count, comm.Float16), newMem(t, c, pool, count, comm.Float32)}
		ps[i].in.set(f32Bytes(in))
		k.Compress(ps[i].wire.buf, ps[i].in.buf, 1)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ps))
	for i := range ps {
		wg.Go(func() {
			for range 50 {
				if got := k.Overflows(ps[i].wire.buf, ps[i].in.buf); got != int64(i+1) {
					errs[i] = fmt.Errorf("buffer %d: %d overflows, want %d", i, got, i+1)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := k.Sync(); err != nil {
		t.Fatal(err)
	}
	if fp16.FromFloat32(1e6) != 0x7c00 || math.IsInf(1e6, 0) {
		t.Fatal("1e6 is not past half's range")
	}
}

// TestRegistrationInTurn: device memory registered and deregistered
// (a pool growing and trimming) while collectives run on the same
// communicator: NCCL's registration calls take their turn with the rest.
func TestRegistrationInTurn(t *testing.T) {
	standInOnly(t)
	const n = 2
	cs := newGroup(t, n, nil)
	runRanks(t, cs, func(r int, c *Comm) error {
		pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 64 << 20, SlabSize: 1 << 20})
		if err != nil {
			return err
		}
		defer pool.Close()
		done := make(chan error, 1)
		go func() {
			for range 30 {
				blk, err := pool.Get(1 << 20)
				if err != nil {
					done <- err
					return
				}
				pool.Put(blk)
				pool.Trim()
			}
			done <- nil
		}()
		for range 100 {
			b := floats(t, 4, 1)
			if err := c.AllReduce(b, b, comm.Sum).Wait(t.Context()); err != nil {
				return err
			}
		}
		return <-done
	})
}

// TestAbortFailedRegistered: a communicator whose registrations are live
// fails asynchronously; its abort calls ncclCommAbort, which releases the
// registrations, and asks nothing else of the failed communicator.
func TestAbortFailedRegistered(t *testing.T) {
	standInOnly(t)
	cs := newGroup(t, 2, nil)
	c := cs[0]
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 64 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	blk, err := pool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Put(blk)
	if si.Registrations(c.handle) != 1 {
		t.Fatalf("%d registrations, want 1", si.Registrations(c.handle))
	}
	si.AsyncError(c.handle, int(ResultSystemError), "stand-in: injected failure")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	b := floats(t, 4, 1)
	if err := c.AllReduce(b, b, comm.Sum).Wait(ctx); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("all-reduce on the failed communicator: %v, want ErrAborted", err)
	}
	c.Abort(errors.New("the test aborts"))
	if got := si.Registrations(c.handle); got != 0 {
		t.Fatalf("%d registrations after ncclCommAbort", got)
	}
	cs[1].Abort(errors.New("the test aborts"))
}

// TestNewCommsPartialFailure: when NewComms made every communicator but
// cannot set up one of them, it aborts each with its own device's context
// and returns the error.
func TestNewCommsPartialFailure(t *testing.T) {
	standInOnly(t)
	noViolations(t)
	id, err := lib.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	// The first communicator's setup makes two streams: its second fails.
	si.FailStreamCreate(2)
	defer si.FailStreamCreate(0)
	_, err = lib.NewComms(t.Context(), []Config{testConfig(0, 3, id), testConfig(1, 3, id), testConfig(2, 3, id)})
	var ce *CUDAError
	if !errors.As(err, &ce) {
		t.Fatalf("NewComms with a failing stream: %v, want a CUDA error", err)
	}
}

// TestConfigFlags: communicators are non-blocking unless Config.Blocking,
// and the communicator's stream does not synchronise with the legacy
// default stream (CU_STREAM_NON_BLOCKING), so a library's work on stream
// 0 never waits behind a collective.
func TestConfigFlags(t *testing.T) {
	standInOnly(t)
	for _, blocking := range []bool{false, true} {
		cs := newGroup(t, 2, func(cfg *Config) { cfg.Blocking = blocking })
		for r, c := range cs {
			if got := si.CommBlocking(c.handle); got != blocking {
				t.Errorf("Blocking %v: rank %d's communicator is blocking = %v", blocking, r, got)
			}
			if f := si.StreamFlags(c.stream); f != 1 {
				t.Errorf("rank %d's stream has flags %#x, want CU_STREAM_NON_BLOCKING (0x1)", r, f)
			}
		}
		runRanks(t, cs, func(r int, c *Comm) error {
			b := floats(t, 4, 1)
			return c.AllReduce(b, b, comm.Sum).Wait(t.Context())
		})
	}
}
