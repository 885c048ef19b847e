package inproc

import (
	"fmt"
	"runtime"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// Spinning: a wait first polls pureSpins times, then yields the processor
// between polls for up to spinTime, then parks on a channel.
const pureSpins = 64

var spinTime = 50 * time.Microsecond

// run is the rank's worker: it executes operations in issue order.
func (c *Comm) run() {
	defer close(c.exited)
	for next := uint64(1); ; next++ {
		_ = c.await(func() bool { return c.issued.Load() >= next || c.stopping.Load() }, nil)
		if c.issued.Load() < next {
			return // stopping, and everything issued has completed
		}
		d := &c.ring[next%ringSize]
		c.current.Store(next)
		c.complete(next, c.execute(d))
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
	var start time.Time
	var watch comm.Watch
	watching := false
	for i := 0; ; i++ {
		if ready() {
			return nil
		}
		if w != nil {
			if err := g.failure(); err != nil {
				return err
			}
		}
		switch {
		case i < pureSpins:
			continue
		case i == pureSpins:
			start = time.Now()
			runtime.Gosched()
			continue
		case i%16 != 0 || time.Since(start) < spinTime:
			runtime.Gosched()
			continue
		}
		var timeout time.Duration
		if w != nil {
			now := time.Now()
			if !watching {
				watch, watching = g.dog.Start(start), true
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
		c.parked.Store(true)
		if ready() || (w != nil && g.failure() != nil) {
			c.parked.Store(false)
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
	}
}

// missing lists the ranks that have not joined operation d of this rank,
// which the rank's worker has issued: for a collective, the ranks that
// have not arrived at it; for a message, the peer while it has not come to
// its end (posted the message, or taken it) and this rank while its worker
// has not reached it.
func (c *Comm) missing(d *desc) []int {
	m := []int{}
	if d.kind != comm.KindSend && d.kind != comm.KindRecv {
		for r, p := range c.g.comms {
			if p.arrived.Load() < d.num {
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
	d := c.ring[id%ringSize]
	c.mu.Unlock()
	if d.seq != id {
		return nil // completed and its slot reused since TestOp
	}
	return c.missing(&d)
}

// collective joins the next collective of the group.
func (c *Comm) collective(d *desc) error {
	g := c.g
	k := d.num
	s := &g.slots[k%slotCount]
	s.d[c.rank] = *d
	c.arrived.Store(k)
	t := g.arrivals.Add(1)
	if n := uint64(g.n); invariants && !(t > (k-1)*n && t <= k*n || g.failure() != nil) {
		violated("rank %d: arrival ticket %d at collective #%d of %d ranks", c.rank, t, k, n)
	}
	if t == k*uint64(g.n) {
		return c.lead(s, k, d)
	}
	return c.follow(s, k, d)
}

// lead runs on the last rank to arrive at collective k: it judges the
// calls and either does the whole operation or opens the gate for shares.
func (c *Comm) lead(s *collSlot, k uint64, d *desc) error {
	g := c.g
	v := g.judge(s, k)
	mode := uint64(modeClaim)
	switch {
	case v != nil:
		mode = modeDone
	case g.parallel(d):
		mode = modeGo
	}
	s.verdict = v
	for {
		cur := g.gate.Load()
		if cur>>2 == k { // a failing rank cancelled the collective
			return c.opErr(d, g.failure())
		}
		if invariants && !(cur>>2 == k-1 && cur&3 != modeClaim) {
			violated("rank %d leads collective #%d but the gate is at #%d mode %d", c.rank, k, cur>>2, cur&3)
		}
		if g.gate.CompareAndSwap(cur, k<<2|mode) {
			break
		}
	}
	switch mode {
	case modeDone:
		g.wakeAll()
		return c.verdictErr(d, v)
	case modeClaim:
		c.runPart(s.d, d, 0, 1)
		g.gate.Store(k<<2 | modeDone)
		g.wakeAll()
		return nil
	}
	g.wakeAll()
	return c.share(s, d)
}

// follow waits for the last rank of collective k to open the gate.
func (c *Comm) follow(s *collSlot, k uint64, d *desc) error {
	g := c.g
	// A gate past k can only be a later collective's cancellation, and
	// other ranks can only have moved past k if k completed (modeDone).
	ready := func() bool {
		v := g.gate.Load()
		return v>>2 > k || v>>2 == k && v&3 != modeClaim
	}
	if err := c.await(ready, d); err != nil {
		// Cancel the collective so that nobody touches this rank's
		// buffers after its Work has failed; if it was claimed first,
		// it finishes soon.
		for {
			cur := g.gate.Load()
			if cur>>2 >= k {
				break
			}
			if g.gate.CompareAndSwap(cur, k<<2|modeCancel) {
				g.wakeAll()
				return c.opErr(d, err)
			}
		}
		_ = c.await(ready, nil)
	}
	v := g.gate.Load()
	if v>>2 > k {
		return c.verdictErr(d, s.verdict)
	}
	switch v & 3 {
	case modeCancel:
		return c.opErr(d, g.failure())
	case modeDone:
		return c.verdictErr(d, s.verdict)
	}
	return c.share(s, d)
}

// share does this rank's part of a parallel collective and waits until
// every rank has done its part. The wait cannot be abandoned: every rank
// past the gate finishes its part without waiting for anything.
func (c *Comm) share(s *collSlot, d *desc) error {
	g := c.g
	c.runPart(s.d, d, c.rank, g.n)
	c.par++
	target := c.par * uint64(g.n)
	f := g.fin.Add(1)
	if invariants && !(f > target-uint64(g.n) && f <= target) {
		violated("rank %d: finish count %d for parallel collective %d of %d ranks", c.rank, f, c.par, g.n)
	}
	if f == target {
		g.wakeAll()
		return nil
	}
	_ = c.await(func() bool { return g.fin.Load() >= target }, nil)
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
			memmove(d.recv, sd.send, d.count*d.dt.Size())
		}
	}
	b.verdict = v
	b.state.Store(k<<2 | boxDone)
	g.wake(p)
	return c.verdictErr(d, v)
}
