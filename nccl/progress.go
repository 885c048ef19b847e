package nccl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// TestOp implements comm.Waiter. It completes what has completed, if no
// other caller holds the communicator's call lock.
func (c *Comm) TestOp(id uint64) (bool, error) {
	c.advance(nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	if id <= c.done {
		return true, c.errs[id]
	}
	return false, nil
}

// WaitOp implements comm.Waiter: it polls the operation's event, spinning
// briefly and then sleeping up to 200 µs between polls, until it
// completes or ctx ends. It returns at ctx's end even while another call
// holds the call lock (a launch settling, say).
func (c *Comm) WaitOp(ctx context.Context, id uint64) error {
	delay := time.Duration(0)
	for i := 0; ; i++ {
		aerr := c.advance(ctx)
		c.mu.Lock()
		if id <= c.done {
			err := c.errs[id]
			c.mu.Unlock()
			return err
		}
		c.mu.Unlock()
		if err := ctx.Err(); err != nil || aerr != nil {
			if err == nil {
				err = aerr
			}
			c.mu.Lock()
			sl := c.slot(id)
			desc := fmt.Sprintf("%s #%d (%d x %s)", sl.kind, id, sl.count, sl.dtype)
			if sl.seq != id {
				desc = fmt.Sprintf("operation #%d", id)
			}
			c.mu.Unlock()
			return fmt.Errorf("nccl: rank %d: waiting for %s: %w", c.rank, desc, err)
		}
		if i < 64 {
			runtime.Gosched()
			continue
		}
		delay = min(max(2*delay, 5*time.Microsecond), 200*time.Microsecond)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// Abort fails every pending and later operation of this rank with an
// error wrapping comm.ErrAborted and err. The owner calls ncclCommAbort,
// which makes NCCL's kernels of this communicator exit, and then waits up
// to AbortDrain for the communicator's stream to drain (the kernels issued
// on it through Kernels, and copies, finish on their own) before the
// pending operations fail: Abort returns within that bound plus what
// ncclCommAbort takes, and once an operation has failed nothing writes its
// buffers. If the stream did not drain, the memory it may still write is
// quarantined: staging memory of the pending operations is never reused,
// and Close and the device pool of Source free nothing the stream may
// touch until the stream is seen idle. Peers are not told: they fail
// through their own watchdog. Abort after Abort or Close does nothing. On
// a blocking communicator (Config.Blocking) Abort waits for a call NCCL
// blocks in to return.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = errors.New("Abort called")
	}
	reason := fmt.Errorf("%w: %w", comm.ErrAborted, err)
	c.requestStop(reason)
	c.lockCalls()
	defer c.unlockCalls()
	c.teardown(reason, true)
}

// requestStop asks a launch settling meanwhile to give up, failing with
// reason.
func (c *Comm) requestStop(reason error) {
	c.mu.Lock()
	if c.abortReq == nil && c.stopping == nil {
		c.abortReq = reason
	}
	c.mu.Unlock()
}

// Close releases the communicator. With operations pending it aborts (they
// fail with comm.ErrClosed, and a launch still settling gives up),
// otherwise it destroys the communicator cleanly (ncclCommDestroy) after
// deregistering the device memory Source registered. Close is idempotent;
// it returns the first Close's error.
func (c *Comm) Close() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.closeErr
	}
	c.closed = true
	c.mu.Unlock()
	reason := fmt.Errorf("%w: rank %d", comm.ErrClosed, c.rank)
	c.requestStop(reason)
	c.lockCalls()
	// What completed keeps its success.
	if done, end, qerr := c.completed(); qerr == nil && end > done {
		c.complete(done, end)
	}
	err := c.teardown(reason, false)
	c.unlockCalls()
	close(c.stop)
	c.wg.Wait()
	c.mu.Lock()
	if c.streamIdle() {
		c.release()
	} else {
		// The stream may still write the communicator's memory: keep it,
		// and the stream, rather than free them under it.
		c.staging, c.pinned = nil, nil
	}
	c.mu.Unlock()
	c.closeErr = err
	return err
}
