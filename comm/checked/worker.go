package checked

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// run is the rank's worker: it takes the rank's operations in issue order
// (a group's together, once it has ended), has the ranks exchange their
// fingerprints, and launches the calls that agree.
func (c *Comm) run() {
	defer close(c.exited)
	for next := uint64(1); ; next++ {
		c.await(func() bool { return c.ops.Issued() >= next || c.stopping.Load() })
		if c.ops.Issued() < next {
			return // stopping, and everything issued is judged
		}
		last := next
		if g := c.ops.Op(next).group; g != 0 {
			c.await(func() bool { return c.ended.Load() >= g || c.failed.Load() != nil })
			for last < c.ops.Issued() && c.ops.Op(last+1).group == g {
				last++
			}
		}
		c.runBatch(next, last)
		next = last
	}
}

// await returns once ready() holds: it polls, then yields, then parks
// until signalled.
// One spinner paces the whole wait: once woken, the worker polls a few
// more times and parks again, rather than spinning anew while its peers
// need the processor.
func (c *Comm) await(ready func() bool) {
	var sp backend.Spinner
	for !ready() {
		if sp.Spin() {
			continue
		}
		c.parked.Store(true)
		if !ready() {
			<-c.wake
		}
		c.parked.Store(false)
	}
}

// Areas of the fingerprint block for a batch of k operations: record i is
// operation i's own fingerprint; records k+i*size... receive every rank's
// fingerprint of operation i (the peer's, first, for a message).
func (c *Comm) records(first, n int) comm.Buffer {
	b := comm.Buffer{Addr: unsafe.Add(c.blk.Addr(), first*recBytes), Count: n * words, DType: comm.Int64, Loc: comm.Host}
	if !c.pool.Host() {
		b.Loc, b.Device = comm.Device, c.device
	}
	return b
}

// runBatch checks and launches operations first..last, which are one
// group of the backend when they were issued in one.
func (c *Comm) runBatch(first, last uint64) {
	k := int(last - first + 1)
	if err := c.failure(); err != nil {
		for seq := first; seq <= last; seq++ {
			c.finish(seq, err)
		}
		return
	}
	if err := c.grow(k); err != nil {
		for seq := first; seq <= last; seq++ {
			c.finish(seq, err)
		}
		return
	}
	grouped := c.ops.Op(first).group != 0
	n := c.size
	recv := func(i, r int) int { return k + i*n + r }

	// Publish the fingerprints and start the exchanges.
	for i := range k {
		o := c.ops.Op(first + uint64(i))
		encode(c.stage[i*recBytes:], &o.fp)
	}
	c.kern.Upload(c.records(0, k), c.stage[:k*recBytes])
	if grouped {
		comm.GroupStart(c.inner)
	}
	for i := range k {
		o := c.ops.Op(first + uint64(i))
		mine, theirs := c.records(i, 1), c.records(recv(i, 0), 1)
		c.xn[i] = 0
		switch o.fp.call.Kind {
		case comm.KindSend, comm.KindRecv:
			p := o.fp.call.Root
			if o.fp.inv.Reason == backend.BadPeer {
				continue // no peer to compare with: it fails here alone
			}
			// The sender speaks first, so that a backend whose sends wait
			// for the receiver (inproc) pairs the two exchanges.
			if o.fp.call.Kind == comm.KindSend {
				c.xw[2*i], c.xw[2*i+1] = c.inner.Send(mine, p), c.inner.Recv(theirs, p)
			} else {
				c.xw[2*i], c.xw[2*i+1] = c.inner.Recv(theirs, p), c.inner.Send(mine, p)
			}
			c.xn[i] = 2
		default:
			c.xw[2*i] = c.inner.AllGather(mine, c.records(recv(i, 0), n))
			c.xn[i] = 1
		}
	}
	var groupErr error
	if grouped {
		groupErr = comm.GroupEnd(c.inner)
	}

	// Wait for every exchange, under the watchdog.
	var failed []error // made on the first failure only
	for i := range k {
		seq := first + uint64(i)
		o := c.ops.Op(seq)
		var err error
		for j := range int(c.xn[i]) {
			w := c.xw[2*i+j]
			c.xmu.Lock()
			c.xseq, c.xwork = seq, w
			c.xmu.Unlock()
			e := c.dog.Wait(context.Background(), c.inner, w, comm.Stall{Rank: c.rank, Seq: seq, Kind: o.fp.call.Kind, Detail: "the ranks exchange fingerprints of this call before it runs"})
			if e != nil && errors.Is(e, comm.ErrTimeout) {
				if done, _ := w.Test(); !done {
					// The watchdog's timeout: the group cannot go on. After
					// the backend's Abort every exchange completes, within
					// its bound, and the block is the worker's again.
					c.fail(fmt.Errorf("%w: %w", comm.ErrAborted, e))
					c.inner.Abort(e)
					c.drain(k)
				}
			}
			if err == nil {
				err = e
			}
		}
		if err != nil {
			if failed == nil {
				failed = make([]error, k)
			}
			failed[i] = err
		}
	}
	c.xmu.Lock()
	c.xseq, c.xwork = 0, comm.Work{}
	c.xmu.Unlock()
	if groupErr != nil && failed == nil {
		failed = make([]error, k)
	}
	c.kern.Download(c.stage[k*recBytes:(k+k*n)*recBytes], c.records(k, k*n))

	// Judge every call from every rank's fingerprint, and launch those
	// that agree.
	if grouped {
		comm.GroupStart(c.inner)
	}
	for i := range k {
		seq := first + uint64(i)
		o := c.ops.Op(seq)
		var err error
		switch {
		case failed != nil && failed[i] != nil:
			err = failed[i]
		case groupErr != nil:
			err = groupErr
		default:
			err = c.verdict(o, i, k)
		}
		if err != nil {
			c.finish(seq, err)
			continue
		}
		if o.fp.call.Kind == comm.KindBarrier {
			c.finish(seq, nil)
			continue
		}
		c.launched(seq, c.launch(o))
	}
	if grouped {
		if err := comm.GroupEnd(c.inner); err != nil {
			// The launched operations' Works carry what the backend makes
			// of it; abort so that none of them waits for a launch that
			// will not come.
			c.inner.Abort(err)
		}
	}
}

// drain waits for every exchange of the batch after an Abort.
func (c *Comm) drain(k int) {
	for i := range k {
		for _, w := range c.xw[2*i : 2*i+int(c.xn[i])] {
			_ = w.Wait(context.Background())
		}
	}
}

// verdict judges operation o, the i-th of a batch of k, from the
// fingerprints received.
func (c *Comm) verdict(o *op, i, k int) error {
	n := c.size
	at := func(r int) []byte { return c.stage[(k+i*n+r)*recBytes:] }
	call := o.fp.call
	switch call.Kind {
	case comm.KindSend, comm.KindRecv:
		if o.fp.inv.Reason == backend.BadPeer {
			return fmt.Errorf("%w: %s: %s", comm.ErrInvalid, call, o.fp.invalidText(n))
		}
		peer := decode(at(0))
		if call.Kind == comm.KindSend {
			return messageVerdict(c.rank, call.Root, &o.fp, &peer, n)
		}
		return messageVerdict(call.Root, c.rank, &peer, &o.fp, n)
	}
	fps := c.fps[:n]
	for r := range n {
		fps[r] = decode(at(r))
	}
	return collectiveVerdict(o.fp.num, fps)
}

// launch issues o on the wrapped backend.
func (c *Comm) launch(o *op) comm.Work {
	call := o.fp.call
	switch call.Kind {
	case comm.KindAllReduce:
		return c.inner.AllReduce(o.send, o.recv, call.Op)
	case comm.KindBroadcast:
		return c.inner.Broadcast(o.send, call.Root)
	case comm.KindReduce:
		return c.inner.Reduce(o.send, o.recv, call.Op, call.Root)
	case comm.KindAllGather:
		return c.inner.AllGather(o.send, o.recv)
	case comm.KindReduceScatter:
		return c.inner.ReduceScatter(o.send, o.recv, call.Op)
	case comm.KindSend:
		return c.inner.Send(o.send, call.Root)
	case comm.KindRecv:
		return c.inner.Recv(o.send, call.Root)
	}
	panic(fmt.Sprintf("checked: launch of %s", call.Kind))
}

// finish completes operation seq here, with err (nil for success).
func (c *Comm) finish(seq uint64, err error) {
	c.smu.Lock()
	s := &c.runs[seq%backend.RingSize]
	if err != nil {
		err = c.opErr(s, err)
	}
	s.stage = done
	c.smu.Unlock()
	c.ops.Complete(seq, err)
}

// launched records that operation seq runs on the backend as w.
func (c *Comm) launched(seq uint64, w comm.Work) {
	c.smu.Lock()
	s := &c.runs[seq%backend.RingSize]
	s.stage, s.inner = launched, w
	c.smu.Unlock()
	c.ops.Notify()
}
