package ddp

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// firstAbort records the first error a rank aborts its group with: over
// MPI, the one the job ends with.
type firstAbort struct {
	comm.Communicator
	mu    sync.Mutex
	first error
}

func (c *firstAbort) Abort(err error) {
	c.mu.Lock()
	if c.first == nil {
		c.first = err
	}
	c.mu.Unlock()
	c.Communicator.Abort(err)
}

// TestAbortNamesCause: when New's check times out, the first abort (the
// one a job over MPI ends with) says so, rather than naming only the
// memory the Reducer was releasing.
func TestAbortNamesCause(t *testing.T) {
	testutil.NoLeak(t)
	synctest.Test(t, func(t *testing.T) {
		g, cs := commtest.NewFakeGroup(2)
		g.HangSeq = 1 // New's check
		rec := []*firstAbort{{Communicator: cs[0]}, {Communicator: cs[1]}}
		var wg sync.WaitGroup
		for rank := range 2 {
			wg.Go(func() {
				_, err := New(context.Background(), rec[rank], threeParams, Options{Timeout: time.Second, DrainTimeout: time.Second})
				if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("rank %d: New: %v, want its timeout or the peer's", rank, err)
				}
			})
		}
		wg.Wait()
		// Both ranks time out at once: the first to abort does so in the
		// check's abandon ("the parameter check"); the other, whose wait
		// then ends with the group's abort, in New ("checking parameters").
		// Neither may name only the memory it releases, as settle's does.
		for rank, r := range rec {
			msg := ""
			if r.first != nil {
				msg = r.first.Error()
			}
			names := strings.Contains(msg, "the parameter check") || strings.Contains(msg, "checking parameters")
			if !names || strings.Contains(msg, "releasing the memory") ||
				!errors.Is(r.first, context.DeadlineExceeded) && !errors.Is(r.first, comm.ErrTimeout) {
				t.Errorf("rank %d aborted the group first with %v; want New's timeout", rank, r.first)
			}
		}
	})
}

// TestWaitNamesCause: a Wait ended by a context cancelled with a cause
// (the signal that interrupted the program) names it, with the step and
// bucket, and still matches context.Canceled.
func TestWaitNamesCause(t *testing.T) {
	testutil.NoLeak(t)
	synctest.Test(t, func(t *testing.T) {
		g, cs := commtest.NewFakeGroup(1)
		g.HangSeq = 2 // the step's bucket
		r, err := New(context.Background(), cs[0], threeParams, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := r.Begin(Sync); err != nil {
			t.Fatal(err)
		}
		for i := range threeParams {
			if err := r.Ready(i); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errors.New("received SIGTERM"))
		err = r.Wait(ctx)
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "received SIGTERM") || !strings.Contains(err.Error(), "step 1: waiting for bucket 0") {
			t.Fatalf("Wait: %v; want the step, the bucket and the context's cause", err)
		}
	})
}
