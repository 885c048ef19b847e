package nccl

import (
	"context"
	"errors"
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
)

// TestOp implements comm.Waiter: the ring's Test, which first completes
// what has completed on the stream, if no other caller holds the
// communicator's call lock (ringHooks.Advance).
func (c *Comm) TestOp(id uint64) (bool, error) { return c.ops.Test(id) }

// WaitOp implements comm.Waiter: the ring's Wait. It tests, spins briefly,
// then parks, and the watchdog polls the events for it (every 5 µs,
// backing off to 200 µs) until it completes or ctx ends. It returns at
// ctx's end even while another call holds the call lock (a launch
// settling, say): nothing in it waits for that lock.
func (c *Comm) WaitOp(ctx context.Context, id uint64) error { return c.ops.Wait(ctx, id) }

// ringHooks is how the communicator takes part in its ring's Test and
// Wait (see backend.Config), kept off Comm's API.
type ringHooks Comm

// Advance completes what has completed on the stream, if nobody holds the
// call lock.
func (h *ringHooks) Advance(uint64) { (*Comm)(h).advance() }

// Parking wakes the watchdog, which polls for a parked Wait.
func (h *ringHooks) Parking(uint64) {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Failure is why the communicator stopped: once it has, every pending and
// later operation fails.
func (h *ringHooks) Failure() error { return (*Comm)(h).stoppingErr() }

// WaitError names the operation a Wait that its context ended waited for.
func (h *ringHooks) WaitError(id uint64, cause error) error {
	c := (*Comm)(h)
	c.mu.Lock()
	sl := c.ops.Op(id)
	desc := fmt.Sprintf("%s #%d (%d x %s)", sl.kind, id, sl.count, sl.dtype)
	if sl.seq != id {
		desc = fmt.Sprintf("operation #%d", id)
	}
	c.mu.Unlock()
	return fmt.Errorf("nccl: rank %d: waiting for %s: %w", c.rank, desc, cause)
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
	if c.abortReq == nil && c.stoppingErr() == nil {
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
