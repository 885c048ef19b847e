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
		for rank, r := range rec {
			if r.first == nil || !strings.Contains(r.first.Error(), "the parameter check") ||
				!errors.Is(r.first, context.DeadlineExceeded) && !errors.Is(r.first, comm.ErrTimeout) {
				t.Errorf("rank %d aborted the group first with %v; want New's timeout", rank, r.first)
			}
		}
	})
}
