package inproc

import (
	"fmt"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
	"github.com/ddpgo/ddpgo/comm/shm"
)

// run is the rank's worker: it executes operations in issue order.
func (c *Comm) run() {
	defer close(c.exited)
	busy := false // the last operation was the worker's to run
	for next := uint64(1); ; next++ {
		for !(c.ops.Issued() >= next || c.stopping.Load()) {
			// After running an operation, stay ready for the next one a
			// while; after skipping collectives joined inline, rest at
			// once: the goroutines that issue them need the processor.
			c.rest(backend.Spinner{Brief: !busy}, func() bool { return c.ops.Issued() >= next || c.stopping.Load() })
		}
		if c.ops.Issued() < next {
			return // stopping, and everything issued has completed
		}
		d := c.ops.Op(next)
		if busy = !d.inline; busy {
			c.current.Store(next)
			c.ops.Complete(next, c.execute(d))
		} else {
			c.takeOver(d)
		}
		c.passed.Store(next)
	}
}

// takeOver deals with collective d, which the rank joined inline. A Wait
// or Test of it, or the issuing goroutine when it published last,
// finishes it, so the worker leaves it alone unless it is needed: when a
// later operation of the rank waits behind it, a Wait on it parks, the
// group fails, the rank closes, or it is still pending after a tick (a
// quarter of the stall interval, so that a collective nobody waits for is
// still reported within about one and a half stall intervals). The worker
// then claims it, unless someone has, waits for the other ranks' calls as
// it waits for any peer (stall reports, timeout) and completes it.
func (c *Comm) takeOver(d *desc) {
	done := func() bool { return c.ops.Done(d.seq) }
	needed := func() bool {
		return done() || c.ops.Issued() > d.seq || c.watch.Load() >= d.seq || c.g.failure() != nil || c.stopping.Load()
	}
	for !needed() {
		if c.rest(backend.Spinner{Brief: true}, needed) {
			break // a tick
		}
	}
	if done() {
		return
	}
	if c.inl.Take(d.seq) {
		c.current.Store(d.seq)
		c.ops.Complete(d.seq, c.finishSmall(d, c.awaitPublished(d)))
		return
	}
	// Another goroutine claimed it; it wakes the worker once done.
	c.taking.Store(d.seq)
	_ = c.await(done, nil)
	c.taking.Store(0)
}

// rest waits, paced by sp, until ready() holds or, once parked, a tick
// passes; it reports whether the tick passed. Only the worker rests.
func (c *Comm) rest(sp backend.Spinner, ready func() bool) (ticked bool) {
	for {
		if ready() {
			return false
		}
		if sp.Spin() {
			continue
		}
		c.parked.Store(true)
		if ready() {
			c.parked.Store(false)
			return false
		}
		c.timer.Reset(c.g.tick)
		select {
		case <-c.wake:
		case <-c.timer.C:
			ticked = true
		}
		c.timer.Stop()
		c.parked.Store(false)
		if ticked {
			return true
		}
	}
}

func (c *Comm) execute(d *desc) error {
	if err := c.g.failure(); err != nil {
		return c.opErr(d, err)
	}
	switch d.kind {
	case comm.KindSend:
		return c.send(d)
	case comm.KindRecv:
		return c.recv(d)
	}
	return c.collective(d)
}

// await returns nil once ready() holds. With w == nil it waits as long as
// it takes; otherwise, while waiting for the peers in operation w, it
// reports stalls and gives up when the group fails or when the timeout
// passes (aborting the group), and returns the reason.
func (c *Comm) await(ready func() bool, w *desc) error {
	g := c.g
	var sp backend.Spinner
	var watch comm.Watch
	watching := false
	for {
		if ready() {
			return nil
		}
		if w != nil {
			if err := g.failure(); err != nil {
				return err
			}
		}
		if sp.Spin() {
			continue
		}
		var timeout time.Duration
		if w != nil {
			now := time.Now()
			if !watching {
				watch, watching = g.dog.Start(sp.Started()), true
			}
			if report, expired := watch.Check(now); report || expired {
				s := comm.Stall{Rank: c.rank, Seq: w.seq, Kind: w.kind, Missing: c.missing(w), Waited: watch.Waited(now)}
				if report {
					g.dog.Report(s)
				}
				if expired {
					err := s.TimeoutError()
					g.abort(fmt.Errorf("%w: %w", comm.ErrAborted, err))
					return err
				}
			}
			timeout = max(watch.Next(now), time.Microsecond)
		}
		// A rank that publishes wakes the workers parked for its call
		// only while some are: count this one in before the last look.
		sleeping := c.waitingFor.Load() != 0
		if sleeping {
			g.sleepers.Add(1)
		}
		c.parked.Store(true)
		if ready() || (w != nil && g.failure() != nil) {
			c.parked.Store(false)
			if sleeping {
				g.sleepers.Add(-1)
			}
			continue
		}
		if timeout > 0 {
			c.timer.Reset(timeout)
			select {
			case <-c.wake:
			case <-c.timer.C:
			}
			c.timer.Stop()
		} else {
			<-c.wake
		}
		c.parked.Store(false)
		if sleeping {
			g.sleepers.Add(-1)
		}
	}
}

// missing lists the ranks that have not joined operation d of this rank,
// which the rank's worker has issued: for a collective, the ranks that
// have not published their calls of it; for a message, the peer while it has not come to
// its end (posted the message, or taken it) and this rank while its worker
// has not reached it.
func (c *Comm) missing(d *desc) []int {
	m := []int{}
	if d.kind != comm.KindSend && d.kind != comm.KindRecv {
		for r := range c.g.n {
			if c.g.seg.Published(r) < d.num {
				m = append(m, r)
			}
		}
		return m
	}
	if d.root < 0 {
		return m // an invalid peer: the operation fails at once
	}
	var peerAway bool
	if d.kind == comm.KindSend {
		st := c.g.box(c.rank, d.root).state.Load()
		peerAway = st>>2 < d.num || st == d.num<<2|boxPosted
	} else {
		peerAway = c.g.box(d.root, c.rank).state.Load()>>2 < d.num
	}
	self := c.current.Load() < d.seq
	if self && c.rank < d.root {
		m = append(m, c.rank)
	}
	if peerAway {
		m = append(m, d.root)
	}
	if self && c.rank > d.root {
		m = append(m, c.rank)
	}
	return m
}

// Missing names the ranks that have not yet joined the pending operation
// of w (see comm.Progress): nil if w is not a pending operation of this
// communicator.
func (c *Comm) Missing(w comm.Work) []int {
	if !w.IssuedBy(c) {
		return nil
	}
	id := w.ID()
	if done, _ := c.TestOp(id); done {
		return nil
	}
	c.mu.Lock()
	d := *c.ops.Op(id)
	c.mu.Unlock()
	if d.seq != id {
		return nil // completed and its slot reused since TestOp
	}
	return c.missing(&d)
}

// collective runs the rank's next collective on the worker.
func (c *Comm) collective(d *desc) error {
	c.publish(d)
	if d.small || d.err != nil {
		return c.finishSmall(d, c.awaitPublished(d))
	}
	return c.parallel(d)
}

// publish publishes this rank's call d of collective k = d.num (package
// shm's Publish): the error of an invalid call kept in the group, the
// input of a small collective staged, the buffers of a parallel one
// described; then wakes the workers parked for the call.
func (c *Comm) publish(d *desc) {
	g := c.g
	k := d.num
	switch {
	case d.err != nil:
		g.errs[k%slotCount][c.rank] = d.err
		c.ep.Publish(k, d.call(), shm.Invalid, nil, nil)
	case d.small:
		c.ep.Publish(k, d.call(), shm.Staged, d.send, nil)
	default:
		sd := shm.LocalDesc(d.send, d.recv)
		c.ep.Publish(k, d.call(), shm.Direct, nil, &sd)
	}
	if g.sleepers.Load() > 0 {
		for r, p := range g.comms {
			if p.waitingFor.Load() == k {
				g.wake(r)
			}
		}
	}
}

// awaitPublished waits, as a wait for peers (stall reports, timeout),
// until every rank has published its call of collective d.num.
//
// A wait that fails (the group failed, or this wait timed out) looks at
// the calls once more, and if every rank has published by then the
// collective goes on after all: a peer that saw every call may already
// have completed its part, so failing this rank's would give the ranks
// different verdicts on one collective, depending on whether the failure
// came between this wait's two looks.
func (c *Comm) awaitPublished(d *desc) error {
	g := c.g
	k := d.num
	from := c.ep.Lagging(k, shm.Called, 0)
	if from == g.n {
		return nil
	}
	c.waitingFor.Store(k)
	err := c.await(func() bool {
		from = c.ep.Lagging(k, shm.Called, from)
		if from < g.n && testMissingCall != nil {
			testMissingCall(c)
		}
		return from == g.n
	}, d)
	c.waitingFor.Store(0)
	if err != nil && c.ep.Lagging(k, shm.Called, from) == g.n {
		return nil
	}
	return err
}

// testMissingCall, set by tests only, runs when awaitPublished has found
// a call missing: what happens between that look and the next is what a
// test puts there.
var testMissingCall func(*Comm)

// finishSmall ends small collective d once every rank has published (or
// with err, the failed wait for them): it judges the calls and, if they
// agree, computes this rank's output.
func (c *Comm) finishSmall(d *desc, err error) error {
	if err != nil {
		return c.opErr(d, err)
	}
	if v := c.judge(d.num); v != nil {
		return c.verdictErr(d, v)
	}
	c.ep.FinishStaged(d.num, d.recv)
	return nil
}

// parallel runs parallel collective d: once every rank has published, the
// first to see it opens the gate and every rank takes its share. A rank
// whose wait fails first cancels the collective instead, so that nobody
// writes its buffers after its Work has failed; whichever comes first
// decides for every rank (package shm's Open and Cancel).
func (c *Comm) parallel(d *desc) error {
	g := c.g
	k := d.num
	if err := c.awaitPublished(d); err != nil {
		if cancelled, decided := c.ep.Cancel(k); cancelled {
			if decided {
				g.wakeAll()
			}
			return c.opErr(d, err)
		}
	} else if v := c.judge(k); v != nil {
		return c.verdictErr(d, v)
	}
	open, decided := c.ep.Open(k)
	if !open {
		return c.opErr(d, g.failure())
	}
	if decided {
		g.wakeAll()
	}
	return c.share(d)
}

// share does this rank's part of parallel collective d and waits until
// every rank has done its part. The wait cannot be abandoned: every rank
// past the gate finishes its part without waiting for anything.
func (c *Comm) share(d *desc) error {
	g := c.g
	k := d.num
	c.ep.Share(k, shm.Local)
	from := 0
	done := func() bool {
		from = c.ep.Lagging(k, shm.Shared, from)
		return from == g.n
	}
	if done() {
		g.wakeAll()
		return nil
	}
	_ = c.await(done, nil)
	return nil
}

func (c *Comm) verdictErr(d *desc, v error) error {
	switch {
	case v == nil:
		return nil
	case d.err != nil:
		return c.opErr(d, d.err)
	}
	return c.opErr(d, v)
}

// send posts d in the mailbox to its peer and waits until the peer has
// taken the message.
func (c *Comm) send(d *desc) error {
	if d.root < 0 {
		return c.opErr(d, d.err)
	}
	g := c.g
	p := d.root
	k := d.num
	b := g.box(c.rank, p)
	b.d = *d
	b.state.Store(k<<2 | boxPosted)
	g.wake(p)
	ready := func() bool { return b.state.Load() == k<<2|boxDone }
	if err := c.await(ready, d); err != nil {
		if b.state.CompareAndSwap(k<<2|boxPosted, k<<2|boxCancel) {
			return c.opErr(d, err)
		}
		_ = c.await(ready, nil)
	}
	return c.verdictErr(d, b.verdict)
}

// recv takes the next message from its peer's mailbox and copies it.
func (c *Comm) recv(d *desc) error {
	if d.root < 0 {
		return c.opErr(d, d.err)
	}
	g := c.g
	p := d.root
	k := d.num
	b := g.box(p, c.rank)
	if err := c.await(func() bool { return b.state.Load()>>2 == k }, d); err != nil {
		return c.opErr(d, err)
	}
	if !b.state.CompareAndSwap(k<<2|boxPosted, k<<2|boxTaken) {
		return c.opErr(d, g.failure())
	}
	sd := &b.d
	var v error
	switch {
	case sd.err != nil || d.err != nil:
		v = fmt.Errorf("%w: message %d from rank %d to rank %d: send (seq %d): %v; recv (seq %d): %v", comm.ErrInvalid, k, p, c.rank, sd.seq, sd.err, d.seq, d.err)
	default:
		if v = comm.MessageMismatchError(k, p, c.rank, sd.call(), d.call()); v == nil {
			shm.Move(d.recv, sd.send, d.count*d.dt.Size())
		}
	}
	b.verdict = v
	b.state.Store(k<<2 | boxDone)
	g.wake(p)
	return c.verdictErr(d, v)
}
