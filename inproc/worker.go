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

// waitFor describes what an abortable wait is waiting for, for stall
// reports and timeouts.
type waitFor struct {
	d    *desc
	coll uint64 // collective number, or 0 for a message from or to d.root
}

// await returns nil once ready() holds. With w == nil it waits as long as
// it takes; otherwise it gives up when the group fails or when the timeout
// passes (aborting the group), and returns the reason.
func (c *Comm) await(ready func() bool, w *waitFor) error {
	g := c.g
	var start, report, deadline time.Time
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
			if deadline.IsZero() {
				report = start.Add(g.opts.StallInterval)
				deadline = start.Add(g.opts.Timeout)
			}
			// A stall that is due is reported even when the deadline has
			// passed too (a late wake-up), so a timeout is always preceded
			// by a report when the stall interval is the shorter.
			if !now.Before(report) {
				g.reportStall(Stall{Rank: c.rank, Seq: w.d.seq, Kind: w.d.kind, Missing: c.missing(w), Waited: now.Sub(start)})
				for !now.Before(report) {
					report = report.Add(g.opts.StallInterval)
				}
			}
			if !now.Before(deadline) {
				err := fmt.Errorf("%w after %v: rank %d waited in %s #%d for rank(s) %v", comm.ErrTimeout, now.Sub(start).Round(time.Millisecond), c.rank, w.d.kind, w.d.seq, c.missing(w))
				g.abort(fmt.Errorf("%w: %w", comm.ErrAborted, err))
				return err
			}
			next := report
			if deadline.Before(next) {
				next = deadline
			}
			timeout = max(next.Sub(now), time.Microsecond)
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

// missing lists the ranks that have not joined what w waits for.
func (c *Comm) missing(w *waitFor) []int {
	if w.coll == 0 {
		return []int{w.d.root}
	}
	var m []int
	for r, p := range c.g.comms {
		if p.arrived.Load() < w.coll {
			m = append(m, r)
		}
	}
	return m
}

// collective joins the next collective of the group.
func (c *Comm) collective(d *desc) error {
	g := c.g
	c.coll++
	k := c.coll
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
	if err := c.await(ready, &waitFor{d: d, coll: k}); err != nil {
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
	c.sent[p]++
	k := c.sent[p]
	b := g.box(c.rank, p)
	b.d = *d
	b.state.Store(k<<2 | boxPosted)
	g.wake(p)
	ready := func() bool { return b.state.Load() == k<<2|boxDone }
	if err := c.await(ready, &waitFor{d: d}); err != nil {
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
	c.recvd[p]++
	k := c.recvd[p]
	b := g.box(p, c.rank)
	if err := c.await(func() bool { return b.state.Load()>>2 == k }, &waitFor{d: d}); err != nil {
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
	case sd.count != d.count || sd.dt != d.dt:
		v = fmt.Errorf("%w: message %d from rank %d to rank %d: rank %d sends %d x %s (seq %d), rank %d receives %d x %s (seq %d)", comm.ErrMismatch, k, p, c.rank, p, sd.count, sd.dt, sd.seq, c.rank, d.count, d.dt, d.seq)
	default:
		memmove(d.recv, sd.send, d.count*d.dt.Size())
	}
	b.verdict = v
	b.state.Store(k<<2 | boxDone)
	g.wake(p)
	return c.verdictErr(d, v)
}
