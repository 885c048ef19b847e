package hier_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/comm/hier"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// held wraps one rank's level so that its first all-reduce or
// reduce-scatter never reaches the level and does not complete until the
// wrapper is aborted, as a rank stuck in that phase would leave its peers;
// reached is closed once that collective has been issued.
type held struct {
	comm.Communicator
	reached chan struct{}
	aborted chan struct{}
	first   sync.Once
	once    sync.Once
	err     error // set before aborted is closed
}

func hold(c comm.Communicator) *held {
	return &held{Communicator: c, reached: make(chan struct{}), aborted: make(chan struct{})}
}

func (h *held) take() bool {
	took := false
	h.first.Do(func() { took = true })
	return took
}

func (h *held) AllReduce(s, r comm.Buffer, o comm.Op) comm.Work {
	if h.take() {
		close(h.reached)
		return comm.NewWork(h, 1)
	}
	return h.Communicator.AllReduce(s, r, o)
}

func (h *held) ReduceScatter(s, r comm.Buffer, o comm.Op) comm.Work {
	if h.take() {
		close(h.reached)
		return comm.NewWork(h, 1)
	}
	return h.Communicator.ReduceScatter(s, r, o)
}

func (h *held) Abort(err error) {
	h.once.Do(func() {
		h.err = fmt.Errorf("held: %w: %w", comm.ErrAborted, err)
		close(h.aborted)
	})
	h.Communicator.Abort(err)
}

func (h *held) WaitOp(ctx context.Context, _ uint64) error {
	select {
	case <-h.aborted:
		return h.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *held) TestOp(uint64) (bool, error) {
	select {
	case <-h.aborted:
		return true, h.err
	default:
		return false, nil
	}
}

// TestFaultReachesEveryRank aborts one rank's level while the job's
// all-reduce is in that level's phase, on 2x2: local rank 1 of host 1
// inside its host's reduce-scatter, and local rank 0 of host 1 in its
// cross all-reduce (after its host's reduce-scatter). Every rank's
// all-reduce must fail with an error that wraps the cause, before the
// levels' own deadlines, and the aborted rank's error must name the
// level; every later operation fails too.
func TestFaultReachesEveryRank(t *testing.T) {
	cause := errors.New("injected fault")
	for _, tc := range []struct {
		name  string
		rank  int
		level string
	}{
		{"local phase", 3, "local"},
		{"cross phase", 2, "cross"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.NoLeak(t)
			l := hier.PerHost(2, 2)
			// The levels' own deadline is short, so that a failure that does
			// not spread shows as a timeout, not as a hung test.
			lv := newLevels(t, l, inproc.Options{Timeout: 20 * time.Second})
			var h *held
			cs := make([]*hier.Comm, len(l))
			for r := range l {
				cfg := hier.Config{Layout: l, Rank: r, Local: lv.local[r], Cross: lv.cross[r], World: lv.world[r]}
				if r == tc.rank {
					if tc.level == "local" {
						h = hold(lv.local[r])
						cfg.Local = h
					} else {
						h = hold(lv.cross[r])
						cfg.Cross = h
					}
				}
				c, err := hier.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				cs[r] = c
			}
			defer func() {
				for _, c := range cs {
					c.Close()
				}
			}()
			bufs := make([][]float32, len(l))
			ws := make([]comm.Work, len(l))
			for r, c := range cs {
				bufs[r] = make([]float32, 1000)
				ws[r] = c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), comm.Sum)
			}
			<-h.reached
			h.Abort(cause)
			for r, err := range testutil.WaitAll(t, ws...) {
				switch {
				case !errors.Is(err, cause):
					t.Errorf("rank %d: all_reduce = %v; want an error wrapping the cause", r, err)
				case r == tc.rank && !strings.Contains(err.Error(), tc.level+" level"):
					t.Errorf("rank %d: %q does not name the %s level", r, err, tc.level)
				}
			}
			later := make([]comm.Work, len(l))
			for r, c := range cs {
				later[r] = c.Barrier()
			}
			for r, err := range testutil.WaitAll(t, later...) {
				if !errors.Is(err, cause) {
					t.Errorf("rank %d: barrier after the fault = %v; want an error wrapping the cause", r, err)
				}
			}
		})
	}
}

// never is a level whose collectives never complete until it is closed
// or aborted, as peers that never come would leave them. It starts no
// goroutine and reads no clock, so it runs in a testing/synctest bubble.
type never struct {
	commtest.Solo
	size int
	once sync.Once
	done chan struct{}
	err  error // set before done is closed
}

func newNever(size int) *never { return &never{size: size, done: make(chan struct{})} }

func (n *never) Size() int { return n.size }
func (n *never) ReduceScatter(_, _ comm.Buffer, _ comm.Op) comm.Work {
	return comm.NewWork(n, 1)
}
func (n *never) AllReduce(_, _ comm.Buffer, _ comm.Op) comm.Work { return comm.NewWork(n, 1) }
func (n *never) end(err error) {
	n.once.Do(func() {
		n.err = err
		close(n.done)
	})
}
func (n *never) Abort(err error) { n.end(fmt.Errorf("never: %w: %w", comm.ErrAborted, err)) }
func (n *never) Close() error    { n.end(fmt.Errorf("never: %w", comm.ErrClosed)); return nil }
func (n *never) WaitOp(ctx context.Context, _ uint64) error {
	select {
	case <-n.done:
		return n.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (n *never) TestOp(uint64) (bool, error) {
	select {
	case <-n.done:
		return true, n.err
	default:
		return false, nil
	}
}

// TestCloseWithFullRing closes a rank whose issuing goroutine waits for a
// free slot of the ring, behind operations that wait for peers that never
// come: Close must not wait behind that issue, and every operation, the
// waiting one included, fails with comm.ErrClosed.
func TestCloseWithFullRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := hier.New(hier.Config{Layout: hier.PerHost(2, 2), Rank: 0, Local: newNever(2), Cross: newNever(2)})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]float32, 4)
		const n = backend.RingSize + 1
		ws := make([]comm.Work, n)
		issued := make(chan struct{})
		go func() {
			defer close(issued)
			for i := range ws {
				ws[i] = c.AllReduce(comm.Float32s(buf), comm.Float32s(buf), comm.Sum)
			}
		}()
		synctest.Wait() // the last issue waits for the first operation
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		<-issued
		for i, err := range testutil.WaitAll(t, ws...) {
			if !errors.Is(err, comm.ErrClosed) {
				t.Errorf("operation %d of %d: %v; want an error wrapping comm.ErrClosed", i+1, n, err)
				break
			}
		}
	})
}
