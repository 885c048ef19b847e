//go:build mpi && cgo

package mpi

import (
	"context"
	"errors"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/shm"
)

// Staged all-reduces: below directMin bytes, an all-reduce of a
// communicator with a segment (shm.go) stages its input in the segment
// and computes this rank's result from every rank's staged copy (the
// engine's Publish, Judge and FinishStaged), with no MPI call. When the
// communicator has nothing else pending, the issuing goroutine posts the
// call itself, without a hand-off to the owner, and the first of these
// finishes it: the issue, if every peer has posted already (then, unless
// it failed, it is published complete: Ring.PublishDone, with no watchdog
// stamp and no hand-off); a Test or Wait of the Work; or the owner, when a
// later operation of the communicator (or its Close) reaches it. The issue
// finishes it under c.mu before offering it (c.inl); the others claim it
// first (c.inl), so one goroutine at a time takes the engine's steps for
// it.

// directMin is the size from which an all-reduce in shared memory reads
// and writes the ranks' buffers in place (when they lie in shared slabs);
// smaller ones are staged. Read by Open.
var directMin = 16 << 10

// stagedAlone gives a 1-rank world a segment too, so that a
// benchmark can time the staged path's own cost in one process. Read by
// Open; tests only.
var stagedAlone bool

// c.inl: the sequence number of the last all-reduce posted inline, times
// 4, plus its state.
const (
	inlPosted  = 1 // posted; nobody is finishing it
	inlClaimed = 2 // a goroutine is finishing it
)

// waitSlice bounds one sleep of a wait, so that a context cancelled
// without a deadline is seen.
const waitSlice = 100 * time.Millisecond

// staged reports whether c stages d: a collective the engine runs whose
// staged input (every block of a ReduceScatter) is below directMin bytes.
func (c *communicator) staged(d *desc) bool {
	return c.hs != nil && onEngine(d.kind) && d.err == nil && shm.StagedBytes(d.call(0), c.size) < c.directMin
}

// onEngine reports whether the engine runs collectives of kind k (on a
// communicator with a segment): every kind but Send and Recv.
func onEngine(k comm.Kind) bool { return k != kindSend && k != kindRecv }

// call is d as the engine's collective number k.
func (d *desc) call(k uint64) comm.Call {
	return comm.Call{Kind: d.kind, Op: d.op, DType: d.dt, Count: d.count, Root: d.root, Seq: k}
}

// How a staged all-reduce stands after a look at the segment.
type stagedEnd uint8

const (
	stagedPending  stagedEnd = iota // a peer has not posted it
	stagedOK                        // this rank's result is in recv
	stagedMismatch                  // the ranks' calls differ: every rank fails it
	stagedFailed                    // a peer failed: c is unusable
)

// post publishes staged collective d (this rank's input, copied), and
// finishes it if every peer has posted it already (for finishStaged). The
// caller holds what orders c's operations: c.mu with every earlier
// operation complete, or the owner.
func (c *communicator) post(d *desc) (stagedEnd, error) {
	hs := c.hs
	hs.k++
	d.k = hs.k
	hs.target.Store(d.k<<2 | uint64(shm.Called))
	hs.ep.Publish(d.k, d.call(d.k), shm.Staged, d.send, nil)
	hs.seg.Notify()
	return c.poll(d)
}

// poll finishes staged all-reduce d if every rank has posted it.
func (c *communicator) poll(d *desc) (stagedEnd, error) {
	if c.hs.ep.Lagging(d.k, shm.Called, 0) < c.size {
		return stagedPending, nil
	}
	return c.judge(d)
}

// judge finishes staged all-reduce d, which every rank has posted: the
// engine's verdict on the calls, then this rank's result.
func (c *communicator) judge(d *desc) (stagedEnd, error) {
	c.hs.target.Store(0)
	if v := c.hs.ep.Judge(d.k); v != nil {
		return stagedMismatch, c.mismatch(d, v)
	}
	c.hs.ep.FinishStaged(d.k, d.recv)
	return stagedOK, nil
}

// advance finishes inline all-reduce seq if it is posted, unclaimed and
// every rank has posted it; Test calls it (the ring's Advancer).
func (c *communicator) advance(seq uint64) {
	posted := seq<<2 | inlPosted
	if c.inl.Load() != posted || !c.inl.CompareAndSwap(posted, seq<<2|inlClaimed) {
		return
	}
	d := c.ops.Op(seq)
	end, err := c.poll(d)
	if end == stagedPending {
		c.inl.Store(posted)
		c.ops.Notify() // a goroutine may wait for the claim (takeOver)
		return
	}
	c.finishStaged(seq, d, end, err)
}

// idle reports whether every operation of c issued so far is complete.
// The caller holds c.mu.
func (c *communicator) idle() bool {
	n := c.ops.Issued()
	return n == 0 || c.ops.Done(n)
}

// stagedDone counts staged collective d, which the engine finished
// without error: its result, Avg included, is complete.
func (c *communicator) stagedDone(d *desc) {
	if d.kind == kindAllReduce {
		c.stagedOps.Add(1)
	} else {
		c.engineOps.Add(1)
	}
}

// finishStaged completes staged all-reduce seq, which ended as end says,
// with err.
func (c *communicator) finishStaged(seq uint64, d *desc, end stagedEnd, err error) {
	if err != nil {
		// Not on the way to success: the target escapes (an allocation).
		if oe := (*comm.OpError)(nil); errors.As(err, &oe) && oe.Seq == 0 {
			oe.Seq = seq // judged at its issue, before it had its number
		}
	}
	switch end {
	case stagedOK:
		c.stagedDone(d)
	case stagedFailed:
		c.fail(err)
	}
	c.ops.Complete(seq, err)
}

// failStaged is the end of staged all-reduce d after the wait for its
// peers failed with err.
func (c *communicator) failStaged(d *desc, err error) (stagedEnd, error) {
	c.hs.target.Store(0)
	return stagedFailed, c.opErr(d, c.peerFailure(err))
}

// waitInline waits for inline all-reduce seq, finishing it itself when it
// can claim it. It returns done false when seq is not (or no longer) the
// inline all-reduce pending.
func (c *communicator) waitInline(ctx context.Context, seq uint64) (done bool, err error) {
	posted, claimed := seq<<2|inlPosted, seq<<2|inlClaimed
	for first := true; ; first = false {
		// Done rather than Test, whose Advance would poll the peers once
		// more before the wait below does.
		if c.ops.Done(seq) {
			_, err := c.ops.Test(seq)
			return true, err
		}
		// Complete, its slot reused since or its result being written:
		// c.inl may still name it (nothing resets it), and the ring's
		// Wait knows old results.
		if c.ops.Ended(seq) {
			return false, nil
		}
		switch st := c.inl.Load(); {
		case st == posted && c.inl.CompareAndSwap(posted, claimed):
			if err := c.completeStaged(ctx, seq, first); err != nil {
				c.inl.Store(posted)
				c.ops.Notify()
				return true, err
			}
		case st == claimed:
			// Another goroutine finishes it; wait until it has, or has
			// let go.
			err := c.ops.Await(ctx, seq, func() bool { return c.ops.Ended(seq) || c.inl.Load() != claimed })
			if err != nil {
				return true, err
			}
		default:
			return false, nil
		}
	}
}

// completeStaged waits, holding the claim of staged all-reduce seq, until
// every rank has posted it or ctx ends, and finishes it. It returns the
// error of a wait that ctx ended (the all-reduce then stays pending, and
// the claim must be let go).
func (c *communicator) completeStaged(ctx context.Context, seq uint64, spin bool) error {
	d := c.ops.Op(seq)
	deadline, hasDeadline := ctx.Deadline()
	for {
		until := time.Now().Add(waitSlice)
		switch {
		case hasDeadline && deadline.Before(until):
			until = deadline
		case ctx.Done() == nil:
			until = time.Time{} // nothing to notice between slices
		}
		err := c.hs.await(d.k, shm.Called, until, spin)
		spin = false
		if err == nil {
			end, err := c.judge(d)
			c.finishStaged(seq, d, end, err)
			return nil
		}
		if !timedOut(err) {
			end, err := c.failStaged(d, err)
			c.finishStaged(seq, d, end, err)
			return nil
		}
		err = ctx.Err()
		if err == nil && hasDeadline && !time.Now().Before(deadline) {
			err = context.DeadlineExceeded
		}
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				err = cause
			}
			return c.waitError(seq, err, c.laggard())
		}
	}
}

// completeOwned waits for the peers of staged all-reduce seq, which the
// owner holds, without a deadline (the watchdog's bounds it), and
// finishes it.
func (c *communicator) completeOwned(seq uint64, d *desc) {
	c.running.Store(seq)
	err := c.hs.await(d.k, shm.Called, time.Time{}, true)
	c.running.Store(0)
	end := stagedEnd(0)
	if err != nil {
		end, err = c.failStaged(d, err)
	} else {
		end, err = c.judge(d)
	}
	c.finishStaged(seq, d, end, err)
}

// takeOver finishes inline all-reduce seq on the owner, which a later
// operation of c (or its Close) has reached: it claims it when nobody
// has, and otherwise waits for the goroutine that did.
func (e *engine) takeOver(c *communicator, seq uint64) {
	posted, claimed := seq<<2|inlPosted, seq<<2|inlClaimed
	// Ended, not Done: the issuer may reuse the slot of an inline
	// all-reduce as soon as it completes, while the owner waits here.
	for !c.ops.Ended(seq) {
		if c.inl.CompareAndSwap(posted, claimed) {
			c.completeOwned(seq, c.ops.Op(seq))
			return
		}
		_ = c.ops.Await(context.Background(), seq, func() bool { return c.ops.Ended(seq) || c.inl.Load() != claimed })
	}
}

// runStaged runs staged all-reduce seq on the owner: a call issued while
// an earlier operation of c was pending.
func (e *engine) runStaged(c *communicator, seq uint64, d *desc) {
	if end, err := c.post(d); end != stagedPending {
		c.finishStaged(seq, d, end, err)
		return
	}
	c.completeOwned(seq, d)
}

// flagAbort marks every open communicator's segment aborted, with cause,
// so that the peers' waits end at once with an error naming this rank,
// before MPI_Abort ends them.
func (e *engine) flagAbort(cause string) {
	e.mu.Lock()
	open := make([]*communicator, 0, len(e.comms))
	for c := range e.comms {
		open = append(open, c)
	}
	e.mu.Unlock()
	for _, c := range open {
		c.ctlMu.Lock()
		if c.hs != nil {
			c.hs.seg.Abort(c.rank, cause)
		}
		c.ctlMu.Unlock()
	}
}
