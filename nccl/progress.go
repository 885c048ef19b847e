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
	c.advance(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	if id <= c.done {
		return true, c.errs[id]
	}
	return false, nil
}

// WaitOp implements comm.Waiter: it polls the operation's event, spinning
// briefly and then sleeping up to 200 µs between polls, until it
// completes or ctx ends.
func (c *Comm) WaitOp(ctx context.Context, id uint64) error {
	delay := time.Duration(0)
	for i := 0; ; i++ {
		c.advance(true)
		c.mu.Lock()
		if id <= c.done {
			err := c.errs[id]
			c.mu.Unlock()
			return err
		}
		c.mu.Unlock()
		if err := ctx.Err(); err != nil {
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
// buffers. Staging memory of operations whose stream did not drain is
// never reused. Peers are not told: they fail through their own watchdog.
// Abort after Abort or Close does nothing. On a blocking communicator
// (Config.Blocking) Abort waits for a call NCCL blocks in to return.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = errors.New("Abort called")
	}
	reason := fmt.Errorf("%w: %w", comm.ErrAborted, err)
	c.mu.Lock()
	if c.abortReq == nil && c.stopping == nil {
		// A launch settling meanwhile gives up on seeing it.
		c.abortReq = reason
	}
	c.mu.Unlock()
	c.lockCalls()
	defer c.unlockCalls()
	c.teardown(reason, true)
}

// Close releases the communicator. With operations pending it aborts (they
// fail with comm.ErrClosed), otherwise it destroys the communicator
// cleanly (ncclCommDestroy) after deregistering the device memory Source
// registered. Close is idempotent; it returns the first Close's error.
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
	// What completed keeps its success.
	c.advance(true)
	c.lockCalls()
	err := c.teardown(fmt.Errorf("%w: rank %d", comm.ErrClosed, c.rank), false)
	c.unlockCalls()
	close(c.stop)
	c.wg.Wait()
	c.mu.Lock()
	if c.leaked == 0 {
		c.release()
	} else {
		// The stream may still write staging memory: keep it, and the
		// stream, rather than free them under it.
		c.staging = nil
	}
	c.mu.Unlock()
	c.closeErr = err
	return err
}
