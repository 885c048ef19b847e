package nccl

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// Every call into NCCL for a communicator, and every call that puts work
// on its stream, is made holding the communicator's call lock (callMu),
// on an OS thread locked for the duration (lockCalls); calls into NCCL
// also hold the device's NCCL lock. NCCL's rules make this the design:
//
//   - Calls into one communicator must never overlap (NCCL's thread-safety
//     rule), and calls to independent communicators of one device must not
//     run in parallel either. From 2.26 on ncclCommGetAsyncError completes
//     the communicator's group job (it joins a thread; from 2.27 it also
//     frees it), so even that call may not race another.
//   - On a non-blocking communicator a launch may answer ncclInProgress
//     (from 2.22 on, nearly every group that holds a communicator of more
//     than one rank does): NCCL's group job then enqueues from its own
//     thread, and until ncclCommGetAsyncError reports ncclSuccess no CUDA work may
//     go on the communicator's stream and no call may use the
//     communicator (2.22 to 2.25 fail it with ncclInvalidArgument). The
//     launching call settles it before it lets go of the lock, polling
//     ncclCommGetAsyncError (as PyTorch's ProcessGroupNCCL does after
//     each non-blocking call), so a Download or a kernel issued after a
//     collective runs after it, and a group is launched as one group.
//   - From 2.14 to 2.26 the job of a non-blocking group lives in the
//     launching thread's storage (ncclGroupJobMain is __thread in
//     src/group.cc): a second group launched from the same OS thread
//     before the first is complete overwrites it. The thread is locked
//     from the launch until the job is complete, so no other goroutine's
//     launch can land on it in between, and no job outlives the call.
//
// Settling waits for NCCL's enqueue, not for the collective: the host
// returns once the kernels are on the stream. It ends early, failing the
// launch, when Abort is asked for or Config.Timeout passes (a peer that
// never joins can keep the first collective's connection setup in
// progress).

// lockCalls takes the call lock on a locked OS thread.
func (c *Comm) lockCalls() {
	c.callMu.Lock()
	runtime.LockOSThread()
}

func (c *Comm) unlockCalls() {
	runtime.UnlockOSThread()
	c.callMu.Unlock()
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
	if err == nil && res == ResultInProgress {
		c.deferred.Add(1)
		c.lib.inProgress.Add(1)
		if err = c.settle(); err == nil {
			// The copies back and the events wait for the enqueue.
			err = c.d.post(c.ctx, c.stream, post, events)
		}
		if err != nil {
			err = fmt.Errorf("%w: %w", comm.ErrAborted, err)
		}
	}
	var ne *Error
	fatal := err != nil && (!errors.As(err, &ne) || ne.Result != ResultInvalidArgument && ne.Result != ResultInvalidUsage)
	if fatal && !errors.Is(err, comm.ErrAborted) {
		// The communicator's state is unknown: it is aborted, and these
		// operations fail with the rest.
		err = fmt.Errorf("%w: %w", comm.ErrAborted, err)
	}
	c.mu.Lock()
	for _, p := range live {
		if err != nil {
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

// failPending fails operations that will not be launched.
func (c *Comm) failPending(ps []pending, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		if p.s.err == nil {
			c.failLocked(p.s, c.opError(p.s, err))
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
// over wrong data). The check needs the call lock: with wait false,
// advance does not wait for it, and completes nothing if another holds it.
func (c *Comm) advance(wait bool) {
	c.mu.Lock()
	end := c.done
	var qerr error
	for end < c.seq && c.stopping == nil {
		sl := c.slot(end + 1)
		if !sl.recorded {
			break
		}
		if sl.err == nil {
			ok, err := c.d.eventQuery(c.ctx, sl.event)
			if err != nil {
				qerr = err
				break
			}
			if !ok {
				break
			}
		}
		end++
	}
	done := c.done
	c.mu.Unlock()
	if qerr != nil {
		c.Abort(qerr)
		return
	}
	if end == done {
		return
	}
	if wait {
		c.lockCalls()
	} else if c.callMu.TryLock() {
		runtime.LockOSThread()
	} else {
		return
	}
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
		c.unlockCalls()
		return
	}
	c.mu.Lock()
	for s := max(c.done, done) + 1; s <= end; s++ {
		c.unstage(c.slot(s))
	}
	c.done = max(c.done, end)
	c.mu.Unlock()
	c.unlockCalls()
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
	if c.stopping == nil {
		c.stopping = reason
	}
	pending := c.done < c.seq
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
	for s := c.done + 1; s <= c.seq; s++ {
		sl := c.slot(s)
		if sl.err == nil {
			sl.err = c.opError(sl, reason)
		}
		c.errs[s] = sl.err
		if drained {
			c.unstage(sl)
		} else {
			for _, b := range sl.stage {
				c.leaked += int64(b.Size())
			}
			for _, b := range sl.pins {
				c.leaked += int64(b.Size())
			}
			sl.stage, sl.pins = nil, nil
		}
	}
	c.done = c.seq
	leaked := c.leaked
	c.mu.Unlock()
	c.noteKernErr(reason)
	if !drained && err == nil {
		err = fmt.Errorf("nccl: rank %d: the stream did not drain within %v after ncclCommAbort; %d bytes of staging memory are left unused", c.rank, AbortDrain, leaked)
	}
	return err
}

// drain waits up to AbortDrain for the stream to finish its work.
func (c *Comm) drain() bool {
	deadline := time.Now().Add(AbortDrain)
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

// watchdog polls ncclCommGetAsyncError and the deadlines every
// Config.PollInterval until Close.
func (c *Comm) watchdog() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.PollInterval)
	defer t.Stop()
	dog := comm.Watchdog{StallInterval: c.cfg.StallInterval, Timeout: c.cfg.Timeout, OnStall: c.cfg.OnStall}
	var watched uint64
	var w comm.Watch
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.advance(false)
		c.mu.Lock()
		if c.stopping != nil {
			c.mu.Unlock()
			continue
		}
		var stall *comm.Stall
		var report, expired bool
		if c.done < c.seq {
			oldest := c.slot(c.done + 1)
			if watched != oldest.seq {
				watched, w = oldest.seq, dog.Start(oldest.issued)
			}
			n := time.Now()
			report, expired = w.Check(n)
			if report || expired {
				stall = &comm.Stall{Rank: c.rank, Seq: oldest.seq, Kind: oldest.kind, Waited: w.Waited(n),
					Detail: fmt.Sprintf("%d x %s", oldest.count, oldest.dtype)}
			}
		}
		c.mu.Unlock()
		if report {
			dog.Report(*stall)
		}
		if expired {
			c.Abort(fmt.Errorf("nccl: %w (Config.Timeout %v)", stall.TimeoutError(), c.cfg.Timeout))
			continue
		}
		// An asynchronous error with nothing in flight: look, if nobody
		// else is calling.
		if c.callMu.TryLock() {
			runtime.LockOSThread()
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

// stoppingErr is why the communicator refuses work.
func (c *Comm) stoppingErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopping
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
