//go:build mpi && cgo

package mpi

/*
#include <stdlib.h>
#include <unistd.h>
#include "ddpmpi.h"

// ddp_ctl_post with the segment's address as an integer: cgo checks every
// pointer argument of every call (about 3% of a 1-rank staged all-reduce).
static int ddp_ctl_post_u(uintptr_t x, int op, int dt, int esize, int count, uintptr_t send, uintptr_t recv) {
	return ddp_ctl_post((ddp_ctl *)x, op, dt, esize, count, send, recv);
}
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// Staged all-reduces: below directMin bytes, an all-reduce of a
// communicator with a control segment (ddpctl.c) copies its input into the
// segment and computes this rank's result from every rank's staged copy,
// with no MPI call. When the communicator has nothing else pending, the
// issuing goroutine posts the call itself, without a hand-off to the
// owner, and the first of these finishes it: the issue, if every peer has
// posted already (then, unless it failed, it is published complete:
// Ring.PublishDone, with no watchdog stamp and no hand-off); a Test or
// Wait of the Work; or the owner, when a later operation of the
// communicator (or its Close) reaches it. The issue finishes it under
// c.mu before offering it (c.inl); the others claim it first (c.inl), so
// one goroutine at a time touches the segment's state for it.

// directMin is the size from which an all-reduce in shared memory reads
// and writes the ranks' buffers in place (when they lie in shared slabs);
// smaller ones are staged. Read by Open.
var directMin = 16 << 10

// stagedAlone gives a 1-rank world a control segment too, so that a
// benchmark can time the staged path's own cost in one process. Read by
// Open; tests only.
var stagedAlone bool

// c.inl: the sequence number of the last all-reduce posted inline, times
// 4, plus its state.
const (
	inlPosted  = 1 // posted; nobody is finishing it
	inlClaimed = 2 // a goroutine is finishing it
)

// waitSlice bounds one sleep of a Wait in C, so that a context cancelled
// without a deadline is seen.
const waitSlice = 100 * time.Millisecond

// waitFor is how a wait of a control segment polls before it sleeps on
// the futex. Where the ranks fit the machine's online processors, it spins
// for 50 us, long enough to cover a peer that runs (and CPU-bound
// neighbours do not change that: the peer still runs whenever this rank
// does). Where the ranks outnumber them, the rank waited for may need this
// one's processor: spinning, even for 1 us, doubled a 4 KiB all-reduce of 3
// ranks on 2 cores, and sleeping at once cost 40 us an all-reduce, a
// futex wake-up for every rank; so the wait calls sched_yield between
// looks for up to 200 us, which hands the processor to a runnable peer at
// once (7 us; docs/small-messages.md). DDPGO_MPI_SPIN and DDPGO_MPI_YIELD
// (durations) override the two.
func waitFor(ranks int) (spin, yield time.Duration) {
	// The machine's, not this process's (runtime.NumCPU): mpirun binds
	// each of 2 ranks to a core of its own, and a rank that counted only
	// its own core slept in every wait, 40-100 us a 4 KiB all-reduce
	// instead of 1.5.
	if ranks > int(C.sysconf(C._SC_NPROCESSORS_ONLN)) {
		yield = 200 * time.Microsecond
	} else {
		spin = 50 * time.Microsecond
	}
	return envDuration("DDPGO_MPI_SPIN", spin), envDuration("DDPGO_MPI_YIELD", yield)
}

// envDuration is the duration in environment variable name, or def when it
// is unset or not a duration of zero or more.
func envDuration(name string, def time.Duration) time.Duration {
	if s := os.Getenv(name); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d >= 0 {
			return d
		}
	}
	return def
}

// staged reports whether d is an all-reduce that c stages.
func (c *communicator) staged(d *desc) bool {
	return c.ctl != nil && d.kind == kindAllReduce && d.err == nil && d.count*dtypeSize(d.dt) < c.directMin
}

// ctlOp is d's reduction as the C side takes it.
func ctlOp(c *communicator, d *desc) C.int {
	if pairAvg(c, d) {
		return C.DDP_AVG2
	}
	return C.int(d.op)
}

// post publishes staged all-reduce d (this rank's input, copied), and
// finishes it if every peer has posted it already: it returns C's result
// then (for finishStaged), C.DDP_PENDING otherwise. The caller holds what
// orders c's operations: c.mu with every earlier operation complete, or
// the owner.
func (c *communicator) post(d *desc) C.int {
	send := d.send
	if d.inplace {
		send = d.recv
	}
	return C.ddp_ctl_post_u(C.uintptr_t(uintptr(unsafe.Pointer(c.ctl))), ctlOp(c, d), C.int(d.dt), C.int(dtypeSize(d.dt)), C.int(d.count), C.uintptr_t(uintptr(send)),
		C.uintptr_t(uintptr(d.recv)))
}

// advance finishes inline all-reduce seq if it is posted, unclaimed and
// every rank has posted it; Test calls it (the ring's Advancer).
func (c *communicator) advance(seq uint64) {
	posted := seq<<2 | inlPosted
	if c.inl.Load() != posted || !c.inl.CompareAndSwap(posted, seq<<2|inlClaimed) {
		return
	}
	d := c.ops.Op(seq)
	rc := C.ddp_ctl_poll(c.ctl, C.uintptr_t(uintptr(d.recv)))
	if rc == C.DDP_PENDING {
		c.inl.Store(posted)
		c.ops.Notify() // a goroutine may wait for the claim (takeOver)
		return
	}
	c.finishStaged(seq, d, rc)
}

// idle reports whether every operation of c issued so far is complete.
// The caller holds c.mu.
func (c *communicator) idle() bool {
	n := c.ops.Issued()
	return n == 0 || c.ops.Done(n)
}

// stagedDone does what is left of staged all-reduce d once C has finished
// it without error.
func (c *communicator) stagedDone(d *desc) {
	c.e.after(c, d)
	c.stagedOps.Add(1)
}

// finishStaged completes staged all-reduce seq, which C finished with rc.
func (c *communicator) finishStaged(seq uint64, d *desc, rc C.int) {
	var err error
	switch rc {
	case C.MPI_SUCCESS:
		c.stagedDone(d)
	case C.DDP_ERR_MISMATCH:
		err = c.mismatch(d)
	default:
		err = c.opErr(d, c.peerFailure(rc))
		c.fail(err)
	}
	c.ops.Complete(seq, err)
}

// mismatch is the error of all-reduce d, which the ranks disagree on
// (every rank fails it; the communicator stays usable).
func (c *communicator) mismatch(d *desc) error {
	p := c.ctl.peer
	op := ctlOp(c, d)
	return c.opErr(d, fmt.Errorf("%w: rank %d all-reduces %d elements of %s (%s), rank %d %d of %s (%s)",
		errMismatch(), c.rank, d.count, d.dt, opName(op), int(p[0]), int(p[1]), comm.DType(p[2]), opName(C.int(p[3]))))
}

// peerFailure says why a wait of the control segment failed: the rank it
// waited for has exited, has closed its communicator, or has aborted the
// job.
func (c *communicator) peerFailure(rc C.int) error {
	r := int(c.ctl.lag)
	pid := int(C.ddp_ctl_pid(c.ctl, c.ctl.lag))
	if rc == C.DDP_PEER_ABORTED {
		return fmt.Errorf("%w: rank %d aborted the job: %s", errAborted(), r, C.GoString(C.ddp_ctl_abort_cause(c.ctl)))
	}
	if rc == C.DDP_PEER_GONE {
		return fmt.Errorf("%w: rank %d (process %d) has exited", errAborted(), r, pid)
	}
	if rc == C.DDP_PEER_CLOSED {
		return fmt.Errorf("%w: rank %d (process %d) has closed its communicator", errAborted(), r, pid)
	}
	return fmt.Errorf("mpi: rank %d: the control segment's wait failed (%d)", c.rank, int(rc))
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
		slice := waitSlice
		if hasDeadline {
			slice = min(slice, max(time.Until(deadline), 0))
		}
		rc := C.ddp_ctl_complete(c.ctl, C.uintptr_t(uintptr(d.recv)), C.longlong(slice), boolInt(spin))
		spin = false
		if rc != C.DDP_WAIT_TIMEOUT {
			c.finishStaged(seq, d, rc)
			return nil
		}
		err := ctx.Err()
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

// laggard says which rank the last wait of the control segment waited
// for, and in what state its process is.
func (c *communicator) laggard() string {
	_, detail := shmWait(c.rank, []peer{c.peer(int(c.ctl.lag), c.ctl.lag_state)}, nil)
	return detail
}

// peer is rank r of c's control segment, in state st (DDP_PEER_*).
func (c *communicator) peer(r int, st C.int) peer {
	p := peer{rank: r, pid: int(C.ddp_ctl_pid(c.ctl, C.int(r)))}
	switch st {
	case C.DDP_PEER_STOPPED:
		p.state = rankStopped
	case C.DDP_PEER_GONE:
		p.state = rankExited
	case C.DDP_PEER_CLOSED:
		p.state = rankClosed
	}
	return p
}

// missing says for whom this rank waits in the shared-memory all-reduce
// it now waits for (see shmWait); nil ranks if it waits for none.
func (c *communicator) missing() ([]int, string) {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	if c.ctl == nil {
		return nil, ""
	}
	var ranks, states [64]C.int
	n := int(C.ddp_ctl_missing(c.ctl, &ranks[0], C.int(len(ranks)), &states[0]))
	if n < 0 {
		return nil, ""
	}
	var missing, others []peer
	for r, i := 0, 0; r < c.size; r++ {
		switch {
		case i < n && int(ranks[i]) == r:
			missing = append(missing, c.peer(r, states[i]))
			i++
		case r != c.rank:
			others = append(others, c.peer(r, C.ddp_ctl_state(c.ctl, C.int(r))))
		}
	}
	return shmWait(c.rank, missing, others)
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
			d := c.ops.Op(seq)
			c.running.Store(seq)
			rc := C.ddp_ctl_complete(c.ctl, C.uintptr_t(uintptr(d.recv)), -1, 1)
			c.running.Store(0)
			c.finishStaged(seq, d, rc)
			return
		}
		_ = c.ops.Await(context.Background(), seq, func() bool { return c.ops.Ended(seq) || c.inl.Load() != claimed })
	}
}

// runStaged runs staged all-reduce seq on the owner: a call issued while
// an earlier operation of c was pending.
func (e *engine) runStaged(c *communicator, seq uint64, d *desc) {
	rc := c.post(d)
	if rc == C.DDP_PENDING {
		c.running.Store(seq)
		rc = C.ddp_ctl_complete(c.ctl, C.uintptr_t(uintptr(d.recv)), -1, 1)
		c.running.Store(0)
	}
	c.finishStaged(seq, d, rc)
}

// flagAbort marks every open communicator's control segment aborted, with
// cause, so that the peers' waits end at once with an error naming this
// rank, before MPI_Abort ends them.
func (e *engine) flagAbort(cause string) {
	e.mu.Lock()
	open := make([]*communicator, 0, len(e.comms))
	for c := range e.comms {
		open = append(open, c)
	}
	e.mu.Unlock()
	cs := C.CString(cause)
	defer C.free(unsafe.Pointer(cs))
	for _, c := range open {
		c.ctlMu.Lock()
		if c.ctl != nil {
			C.ddp_ctl_abort(c.ctl, cs)
		}
		c.ctlMu.Unlock()
	}
}

// ctlSleeps is the number of waits of c's control segment that slept, for
// tests.
func (c *communicator) ctlSleeps() uint64 {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	if c.ctl == nil {
		return 0
	}
	return uint64(c.ctl.sleeps)
}
