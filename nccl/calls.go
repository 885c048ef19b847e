package nccl

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// Every call into NCCL for a communicator, and every call that puts work
// on its stream (collectives, kernels, copies, stream waits), is made
// holding the communicator's call lock (callMu), on an OS thread locked
// for the duration (lockCalls); calls into NCCL also hold the device's
// NCCL lock. NCCL's rules make this the design:
//
//   - Calls into one communicator must never overlap (NCCL's thread-safety
//     rule), and calls to independent communicators of one device must not
//     run in parallel either. From 2.26 on ncclCommGetAsyncError completes
//     the communicator's group job (it joins a thread; from 2.27 it also
//     frees it), so even that call may not race another.
//   - On a non-blocking communicator a launch may answer ncclInProgress
//     (from 2.23 on nearly every launch of a communicator of more than one
//     rank does; 2.22 only where it sets up connections): NCCL's group
//     job then enqueues from its own thread, and until
//     ncclCommGetAsyncError reports ncclSuccess no CUDA work may go on the
//     communicator's stream and no call may use the communicator (NCCL
//     fails it with ncclInvalidArgument). The launching call settles it before it lets
//     go of the lock, polling ncclCommGetAsyncError (as PyTorch's
//     ProcessGroupNCCL does after each non-blocking call), so a Download
//     or a kernel issued after a collective runs after it, and a group is
//     launched as one group.
//   - From 2.14 to 2.26 the job of a non-blocking group lives in the
//     launching thread's storage (ncclGroupJobMain is __thread in
//     src/group.cc): a second group launched from the same OS thread
//     before the first is complete overwrites it. 2.26 completes the job
//     in ncclCommGetAsyncError; 2.23 to 2.25 only report its result there,
//     and the communicator's next call (ncclCommEnsureReady) joins it, from
//     whatever thread makes it. So once the settle has seen ncclSuccess,
//     the launching call makes one more call on the same thread,
//     ncclCommCount, which runs ncclCommEnsureReady in every version:
//     no job outlives the call, and no other goroutine's launch can land
//     on the thread while one is pending.
//
// Settling waits for NCCL's enqueue, not for the collective: the host
// returns once the kernels are on the stream. It ends early, failing the
// launch, when Abort or Close is asked for or Config.Timeout passes (a
// peer that never joins can keep the first collective's connection setup
// in progress). A Wait that needs the lock to complete what has completed
// gives up at its context's end rather than wait out a settle.

// callLock is the call lock: a mutex that a waiter can stop waiting for
// when its context ends.
type callLock chan struct{}

func newCallLock() callLock { return make(callLock, 1) }

// lockCalls takes the call lock on a locked OS thread.
func (c *Comm) lockCalls() {
	c.callMu <- struct{}{}
	runtime.LockOSThread()
}

// tryLockCalls is lockCalls if nobody holds the lock.
func (c *Comm) tryLockCalls() bool {
	select {
	case c.callMu <- struct{}{}:
		runtime.LockOSThread()
		return true
	default:
		return false
	}
}

func (c *Comm) unlockCalls() {
	runtime.UnlockOSThread()
	<-c.callMu
}

// launch launches ps and settles it: a group is one launch, every staging
// copy in, then the NCCL calls between ncclGroupStart and ncclGroupEnd,
// then every copy back, as NCCL runs grouped operations together. The
// caller holds the call lock.
func (c *Comm) launch(ps []pending, group bool) {
	if c.torn {
		c.failPending(ps, c.stoppingErr())
		return
	}
	ops, post, events := c.opsBuf[:0], c.postBuf[:0], c.evBuf[:0]
	live := c.liveBuf[:0]
	c.mu.Lock()
	for _, p := range ps {
		if p.s.err == nil {
			ops = append(ops, p.pre...)
			live = append(live, p)
		}
	}
	c.mu.Unlock()
	defer func() {
		clear(live)
		c.liveBuf = live[:0]
	}()
	if len(live) == 0 {
		return
	}
	for _, p := range live {
		ops = append(ops, p.nccl)
	}
	for _, p := range live {
		post = append(post, p.post...)
		events = append(events, p.s.event)
	}
	c.opsBuf, c.postBuf, c.evBuf = ops, post, events
	c.dev.ncclMu.Lock()
	res, _, err := c.d.launch(c.ctx, c.handle, c.stream, ops, post, events, group || len(live) > 1)
	c.dev.ncclMu.Unlock()
	if err == nil {
		c.lib.launches.Add(1)
	}
	var ne *Error
	fatal := err != nil && (!errors.As(err, &ne) || ne.Result != ResultInvalidArgument && ne.Result != ResultInvalidUsage)
	if err == nil && res == ResultInProgress {
		c.deferred.Add(1)
		c.lib.inProgress.Add(1)
		start := time.Now()
		err = c.settle()
		c.settling.Add(int64(time.Since(start)))
		if err == nil {
			// 2.23-2.25 have not joined the group job yet: join it on
			// this thread before it lets go.
			err = c.ensureReady()
		}
		if err == nil {
			// The copies back and the events wait for the enqueue.
			err = c.d.post(c.ctx, c.stream, post, events)
		}
		fatal = err != nil
	}
	if err != nil && !fatal {
		// NCCL refused the call, but the staging copies before it may be
		// on the stream: the events say when the stream has passed them,
		// and the staging memory waits for them (advance).
		if perr := c.d.post(c.ctx, c.stream, nil, events); perr != nil {
			err, fatal = fmt.Errorf("%w (recording the events after it: %w)", err, perr), true
		}
	}
	if fatal && !errors.Is(err, comm.ErrAborted) && !errors.Is(err, comm.ErrClosed) {
		// The communicator's state is unknown: it is aborted, and these
		// operations fail with the rest.
		err = fmt.Errorf("%w: %w", comm.ErrAborted, err)
	}
	c.mu.Lock()
	req := c.abortReq
	c.mu.Unlock()
	if fatal && req != nil && errors.Is(err, req) {
		// Abort or Close stopped the settle: what the stream completed
		// before these operations keeps its success, as when they take
		// the lock first. (These are not recorded yet: completed stops
		// at them.)
		if done, end, qerr := c.completed(); qerr == nil && end > done {
			c.complete(done, end)
		}
	}
	c.mu.Lock()
	for _, p := range live {
		if err != nil {
			// The staging memory stays the operation's: a fatal failure
			// hands it to teardown, which returns it only once the stream
			// has drained.
			c.failLocked(p.s, c.opError(p.s, err))
		} else {
			p.s.recorded = true
		}
	}
	c.mu.Unlock()
	if fatal {
		c.teardown(err, true)
	}
}

// ensureReady is ncclCommCount, made for its ncclCommEnsureReady: on NCCL
// 2.23 to 2.25 it joins the group job whose result the settle saw, on the
// launching thread. The caller holds the call lock.
func (c *Comm) ensureReady() error {
	c.dev.ncclMu.Lock()
	defer c.dev.ncclMu.Unlock()
	return c.d.ensureReady(c.handle)
}

// failPending fails operations that will not be launched: nothing of
// theirs is on the stream, and their staging memory goes back at once.
func (c *Comm) failPending(ps []pending, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		if p.s.err == nil {
			c.failLocked(p.s, c.opError(p.s, err))
			c.unstage(p.s)
		}
	}
}

// settle polls ncclCommGetAsyncError until a launch that answered
// ncclInProgress has been enqueued: spinning for a few microseconds (the
// common case on a GPU), then sleeping from 1 µs up to a millisecond. It
// gives up when Abort is asked for or Config.Timeout passes. The caller
// holds the call lock.
func (c *Comm) settle() error {
	start := time.Now()
	spin := start.Add(20 * time.Microsecond)
	delay := time.Microsecond
	for {
		st, err := c.asyncError()
		switch {
		case err != nil:
			return err
		case st == ResultSuccess:
			return nil
		case st != ResultInProgress:
			return c.asyncErr(st)
		}
		c.mu.Lock()
		req := c.abortReq
		c.mu.Unlock()
		if req != nil {
			return req
		}
		now := time.Now()
		if now.Sub(start) > c.cfg.Timeout {
			return fmt.Errorf("%w: nccl: rank %d: NCCL still enqueueing (ncclInProgress) after %v (Config.Timeout)", comm.ErrTimeout, c.rank, c.cfg.Timeout)
		}
		if now.Before(spin) {
			continue
		}
		time.Sleep(delay)
		delay = min(2*delay, time.Millisecond)
	}
}

// asyncError is ncclCommGetAsyncError. The caller holds the call lock.
func (c *Comm) asyncError() (Result, error) {
	c.dev.ncclMu.Lock()
	defer c.dev.ncclMu.Unlock()
	return c.d.asyncError(c.handle)
}

// asyncErr describes an asynchronous error of the communicator.
func (c *Comm) asyncErr(st Result) error {
	return &Error{Call: "ncclCommGetAsyncError", Result: st, Text: st.String(), Last: c.d.lastError(c.handle)}
}

// advance completes, in order, the operations whose events have
// completed, after an ncclCommGetAsyncError check made once they had
// (NCCL's kernels exit early on an error, and their events then complete
// over wrong data). The check needs the call lock, which advance does not
// wait for: it completes nothing if another caller holds it.
func (c *Comm) advance() {
	done, end, qerr := c.completed()
	if qerr != nil {
		c.Abort(qerr)
		return
	}
	if end == done || !c.tryLockCalls() {
		return
	}
	c.complete(done, end)
	c.unlockCalls()
}

// completed returns done and how far the operations after it have
// completed on the stream (failed ones included: their events say when
// the stream has passed what of theirs was put on it).
func (c *Comm) completed() (done, end uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	end = c.done
	for last := c.ops.Issued(); end < last && c.stoppingErr() == nil; end++ {
		sl := c.ops.Op(end + 1)
		if !sl.recorded {
			break
		}
		ok, err := c.d.eventQuery(c.ctx, sl.event)
		if err != nil {
			return c.done, c.done, err
		}
		if !ok {
			break
		}
	}
	return c.done, end, nil
}

// complete completes the operations done+1 to end, found complete by
// completed, after an ncclCommGetAsyncError check. The caller holds the
// call lock.
func (c *Comm) complete(done, end uint64) {
	var err error
	if !c.torn {
		var st Result
		st, err = c.asyncError()
		if err == nil && st != ResultSuccess && st != ResultInProgress {
			err = c.asyncErr(st)
		}
	}
	if err != nil {
		// What completed before the error was seen keeps nothing: the
		// error may have cut its kernels short.
		c.teardown(fmt.Errorf("%w: %w", comm.ErrAborted, err), true)
		return
	}
	c.mu.Lock()
	for s := max(c.done, done) + 1; s <= end; s++ {
		sl := c.ops.Op(s)
		c.unstage(sl)
		c.ops.Complete(s, sl.err)
	}
	c.done = max(c.done, end)
	c.mu.Unlock()
}

// teardown is Abort and the destroying half of Close: it refuses new
// work, tears the communicator down (ncclCommAbort when abort is set or
// work is pending, else ncclCommDestroy after deregistering what Source
// registered), waits up to AbortDrain for the stream to drain, and then
// fails every pending operation with reason. What completed before keeps
// its result. The caller holds the call lock; after teardown nothing
// calls into the communicator.
func (c *Comm) teardown(reason error, abort bool) error {
	if c.torn {
		return nil
	}
	c.mu.Lock()
	c.stopping.CompareAndSwap(nil, &reason)
	pending := c.done < c.ops.Issued()
	c.mu.Unlock()
	c.torn = true
	var err error
	if abort || pending {
		// ncclCommAbort releases registrations itself; nothing else is
		// asked of a communicator that may have failed.
		c.dev.ncclMu.Lock()
		err = c.d.abort(c.ctx, c.handle)
		c.dev.ncclMu.Unlock()
	} else {
		c.deregisterAll()
		c.dev.ncclMu.Lock()
		err = c.d.destroy(c.ctx, c.handle)
		c.dev.ncclMu.Unlock()
	}
	c.regMu.Lock()
	c.regDone = true
	c.regMu.Unlock()
	drained := c.drain()
	c.mu.Lock()
	c.undrained = !drained
	last := c.ops.Issued() // nothing is published once stopping is set
	for s := c.done + 1; s <= last; s++ {
		sl := c.ops.Op(s)
		if sl.err == nil {
			sl.err = c.opError(sl, reason)
		}
		if drained {
			c.unstage(sl)
		} else {
			// Quarantined: the stream may still write it.
			for _, b := range sl.stage {
				c.leaked += int64(b.Size())
			}
			for _, b := range sl.pins {
				c.leaked += int64(b.Size())
			}
			sl.stage, sl.pins = nil, nil
		}
		c.ops.Complete(s, sl.err)
	}
	c.done = last
	leaked := c.leaked
	c.mu.Unlock()
	c.noteKernErr(reason)
	if !drained && err == nil {
		err = fmt.Errorf("nccl: rank %d: the stream did not drain within %v after ncclCommAbort; %d bytes of staging memory are left unused, and the communicator's memory is not freed while the stream runs", c.rank, c.abortDrain, leaked)
	}
	return err
}

// streamIdle reports whether the stream has finished its work, asking it
// again once teardown has found that it did not drain: memory the stream
// may write is freed only after this says so. The caller holds c.mu.
func (c *Comm) streamIdle() bool {
	if !c.undrained {
		return true
	}
	ok, err := c.d.streamQuery(c.ctx, c.stream)
	if ok || err != nil {
		c.undrained = false
	}
	return !c.undrained
}

// drain waits up to AbortDrain for the stream to finish its work.
func (c *Comm) drain() bool {
	deadline := time.Now().Add(c.abortDrain)
	for delay := time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		ok, err := c.d.streamQuery(c.ctx, c.stream)
		if ok || err != nil {
			// An error here is a broken context: nothing runs any more.
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay)
	}
}

// deregisterAll deregisters every slab Source registered, before
// ncclCommDestroy; the slabs stay the pool's. The caller holds the call
// lock.
func (c *Comm) deregisterAll() {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.dev.ncclMu.Lock()
	defer c.dev.ncclMu.Unlock()
	for p, h := range c.regs {
		c.d.deregister(c.ctx, c.handle, h)
		delete(c.regs, p)
	}
}

// Polling for parked Waits: from fastPoll, doubling up to fastPollMax
// between polls.
const (
	fastPoll    = 5 * time.Microsecond
	fastPollMax = 200 * time.Microsecond
)

// watchdog polls ncclCommGetAsyncError and the deadlines every
// Config.PollInterval until Close, and the events often while a Wait is
// parked (ringHooks.Parking wakes it): it is what completes an operation
// that a Wait sleeps on.
func (c *Comm) watchdog() {
	defer c.wg.Done()
	t := time.NewTimer(c.cfg.PollInterval)
	defer t.Stop()
	o := backend.Oldest{Dog: comm.Watchdog{StallInterval: c.cfg.StallInterval, Timeout: c.cfg.Timeout, OnStall: c.cfg.OnStall}}
	// what at read of the oldest operation, for its report
	var kind comm.Kind
	var count int
	var dt comm.DType
	at := func(seq uint64) time.Time {
		c.mu.Lock()
		defer c.mu.Unlock()
		sl := c.ops.Op(seq)
		kind, count, dt = sl.kind, sl.count, sl.dtype
		return sl.issued
	}
	slow := time.Now().Add(c.cfg.PollInterval) // the next poll of the asynchronous error and the deadlines
	delay := time.Duration(0)
	for {
		if c.ops.Waiting() > 0 {
			delay = min(max(2*delay, fastPoll), fastPollMax)
		} else {
			delay = max(time.Until(slow), 0)
		}
		t.Reset(delay)
		select {
		case <-c.stop:
			return
		case <-c.wake:
			delay = 0
		case <-t.C:
		}
		c.advance()
		n := time.Now()
		if n.Before(slow) || c.stoppingErr() != nil {
			continue
		}
		slow = n.Add(c.cfg.PollInterval)
		if due, ok := o.Check(c.ops.Issued(), c.ops.Ended, at, n); ok {
			st := comm.Stall{Rank: c.rank, Seq: due.Seq, Kind: kind, Waited: due.Waited, Detail: fmt.Sprintf("%d x %s", count, dt)}
			if due.Report {
				o.Dog.Report(st)
			}
			if due.Expired {
				c.Abort(fmt.Errorf("nccl: %w (Config.Timeout %v)", st.TimeoutError(), c.cfg.Timeout))
				continue
			}
		}
		// An asynchronous error with nothing in flight: look, if nobody
		// else is calling.
		if c.tryLockCalls() {
			var err error
			if !c.torn {
				st, aerr := c.asyncError()
				err = aerr
				if err == nil && st != ResultSuccess && st != ResultInProgress {
					err = c.asyncErr(st)
				}
				if err != nil {
					c.teardown(fmt.Errorf("%w: %w", comm.ErrAborted, err), true)
				}
			}
			c.unlockCalls()
		}
	}
}

// stoppingErr is why the communicator refuses work, nil until Abort,
// Close or a failure.
func (c *Comm) stoppingErr() error {
	if p := c.stopping.Load(); p != nil {
		return *p
	}
	return nil
}

// noteKernErr keeps the first error of stream work for Kernels().Sync.
func (c *Comm) noteKernErr(err error) {
	if err == nil {
		return
	}
	c.kerrMu.Lock()
	if c.kernErr == nil {
		c.kernErr = err
	}
	c.kerrMu.Unlock()
}
