package inproc

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/cpu"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
	"github.com/ddpgo/ddpgo/comm/shm"
)

// Comm is one rank's communicator. It implements comm.Communicator and
// comm.Waiter; its methods may be called from any goroutine.
type Comm struct {
	g    *group
	rank int

	rules backend.Rules // what the rank's calls are checked against

	mu     sync.Mutex // serialises issuing
	closed bool
	// numbering at issue, under mu: collectives, and messages per peer
	colls        uint64
	sends, recvs []uint64

	// ops is the rank's ring of operations: descriptors, results,
	// failure log and waiters (package backend)
	ops backend.Ring[desc]

	_       cpu.CacheLinePad
	current atomic.Uint64 // sequence number of the operation the worker runs or ran last
	passed  atomic.Uint64 // the worker is done with every operation up to this one
	watch   atomic.Uint64 // a Wait has parked on this operation: the worker must watch it
	taking  atomic.Uint64 // the collective joined inline that the worker waits in takeOver for
	_       cpu.CacheLinePad
	parked  atomic.Bool // the worker is blocked on wake
	_       cpu.CacheLinePad
	// inl is the last collective the rank joined inline, and who
	// finishes it; inlK is its collective number.
	inl  shm.Claim
	inlK atomic.Uint64
	_    cpu.CacheLinePad
	// waitingFor is the collective whose calls the worker waits for, or 0.
	waitingFor atomic.Uint64
	_          cpu.CacheLinePad

	wake     chan struct{}
	stopping atomic.Bool
	closing  atomic.Bool
	exited   chan struct{}

	// the rank's side of the group's segment (package shm): used by the
	// goroutine that holds the rank's current collective (the worker, or
	// the one that claimed a collective joined inline)
	ep *shm.Endpoint

	timer *time.Timer // owned by the worker goroutine
}

func newComm(g *group, rank int) *Comm {
	c := &Comm{
		g:      g,
		rank:   rank,
		wake:   make(chan struct{}, 1),
		exited: make(chan struct{}),
		sends:  make([]uint64, g.n),
		recvs:  make([]uint64, g.n),
		ep:     g.seg.Endpoint(rank),
	}
	c.timer = time.NewTimer(time.Hour)
	c.timer.Stop()
	c.ops.Init(backend.Config{Backend: "inproc", Rank: rank, Spin: true, Hooks: (*ringHooks)(c)})
	c.rules = backend.Rules{Rank: rank, Size: g.n, HostOnly: true}
	return c
}

// ringHooks is how the rank takes part in its ring's Test and Wait (see
// backend.Config), kept off Comm's method set.
type ringHooks Comm

// Advance finishes operation id if it is a collective the rank joined
// inline and every rank has published its call.
func (h *ringHooks) Advance(id uint64) { (*Comm)(h).tryFinish(id) }

// Parking asks the worker to watch operation id: a collective joined
// inline is finished by the worker once a Wait on it parks.
func (h *ringHooks) Parking(id uint64) {
	c := (*Comm)(h)
	for w := c.watch.Load(); w < id && !c.watch.CompareAndSwap(w, id); w = c.watch.Load() {
	}
	c.g.wake(c.rank)
}

// Failure is the group's failure: once the group has failed every later
// operation of the rank fails.
func (h *ringHooks) Failure() error { return h.g.failure() }

// Rank returns the communicator's rank.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks in the group.
func (c *Comm) Size() int { return c.g.n }

// AllReduce reduces send over all ranks with op into recv (in place when
// recv is send).
func (c *Comm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindAllReduce, op: op, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	call := comm.Call{Kind: d.kind, Op: op, DType: d.dt, Count: d.count}
	d.err = c.rules.Check(&call, &send, &recv).Err(call, c.g.n)
	return c.issue(&d)
}

// Capabilities reports what inproc does natively: everything but device
// memory.
func (c *Comm) Capabilities() comm.Caps {
	return comm.Caps{Backend: "inproc", NativeAvg: true, HalfPrecision: true, MismatchDetection: true, HostMemory: true}
}

// Broadcast copies root's buf into buf on every other rank.
func (c *Comm) Broadcast(buf comm.Buffer, root int) comm.Work {
	d := desc{kind: comm.KindBroadcast, dt: buf.DType, count: buf.Count, root: root, send: buf.Addr, recv: buf.Addr}
	call := comm.Call{Kind: d.kind, DType: d.dt, Count: d.count, Root: root}
	d.err = c.rules.Check(&call, &buf, &buf).Err(call, c.g.n)
	return c.issue(&d)
}

// Reduce reduces send over all ranks with op into recv on root.
func (c *Comm) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	d := desc{kind: comm.KindReduce, op: op, dt: send.DType, count: send.Count, root: root, send: send.Addr}
	if root == c.rank {
		d.recv = recv.Addr
	}
	call := comm.Call{Kind: d.kind, Op: op, DType: d.dt, Count: d.count, Root: root}
	d.err = c.rules.Check(&call, &send, &recv).Err(call, c.g.n)
	return c.issue(&d)
}

// AllGather concatenates every rank's send into recv, in rank order.
func (c *Comm) AllGather(send, recv comm.Buffer) comm.Work {
	d := desc{kind: comm.KindAllGather, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	call := comm.Call{Kind: d.kind, DType: d.dt, Count: d.count}
	d.err = c.rules.Check(&call, &send, &recv).Err(call, c.g.n)
	return c.issue(&d)
}

// ReduceScatter reduces send over all ranks with op and leaves this rank's
// block of the result in recv.
func (c *Comm) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindReduceScatter, op: op, dt: recv.DType, count: recv.Count, send: send.Addr, recv: recv.Addr}
	call := comm.Call{Kind: d.kind, Op: op, DType: d.dt, Count: d.count}
	d.err = c.rules.Check(&call, &send, &recv).Err(call, c.g.n)
	return c.issue(&d)
}

// Send sends buf to rank peer. It completes when peer has received it.
func (c *Comm) Send(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindSend, dt: buf.DType, count: buf.Count, root: peer, send: buf.Addr}
	c.checkMessage(&d, buf)
	return c.issue(&d)
}

// Recv receives into buf from rank peer.
func (c *Comm) Recv(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindRecv, dt: buf.DType, count: buf.Count, root: peer, recv: buf.Addr}
	c.checkMessage(&d, buf)
	return c.issue(&d)
}

// checkMessage checks Send or Recv d of buf. A message with no valid peer
// gets root -1: it is numbered on no pair and fails here alone.
func (c *Comm) checkMessage(d *desc, buf comm.Buffer) {
	call := comm.Call{Kind: d.kind, DType: d.dt, Count: d.count, Root: d.root}
	v := c.rules.Check(&call, &buf, &buf)
	d.err = v.Err(call, c.g.n)
	if v.Reason == backend.BadPeer {
		d.root = -1
	}
}

// Barrier completes once every rank has reached it.
func (c *Comm) Barrier() comm.Work {
	d := desc{kind: comm.KindBarrier}
	return c.issue(&d)
}

// Abort fails every pending and future operation of the whole group with
// an error that wraps comm.ErrAborted and err.
func (c *Comm) Abort(err error) {
	if err == nil {
		c.g.abort(fmt.Errorf("%w by rank %d", comm.ErrAborted, c.rank))
		return
	}
	c.g.abort(fmt.Errorf("%w by rank %d: %w", comm.ErrAborted, c.rank, err))
}

// Close stops the rank's worker. Since the group cannot complete a
// collective without this rank, Close also aborts the group: pending
// operations on every rank fail with errors that wrap comm.ErrAborted and
// comm.ErrClosed. Close is idempotent and returns once the worker has
// exited.
func (c *Comm) Close() error {
	if !c.closing.CompareAndSwap(false, true) {
		<-c.exited
		return nil
	}
	c.g.abort(fmt.Errorf("%w: rank %d: %w", comm.ErrAborted, c.rank, comm.ErrClosed))
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.stopping.Store(true)
	c.g.wake(c.rank)
	<-c.exited
	return nil
}

func (c *Comm) issue(d *desc) comm.Work {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return comm.FailedWork(&comm.OpError{Rank: c.rank, Kind: d.kind, Count: d.count, DType: d.dt, Err: comm.ErrClosed})
	}
	seq := c.ops.Reserve(c)
	if seq > backend.RingSize {
		// The worker must be past the slot's previous operation too: it
		// reads the slots of collectives joined inline, if only to skip
		// them.
		old := seq - backend.RingSize
		for c.passed.Load() < old {
			c.g.wake(c.rank)
			runtime.Gosched()
		}
	}
	d.seq = seq
	switch {
	case d.kind == comm.KindSend && d.root >= 0:
		c.sends[d.root]++
		d.num = c.sends[d.root]
	case d.kind == comm.KindRecv && d.root >= 0:
		c.recvs[d.root]++
		d.num = c.recvs[d.root]
	case d.kind != comm.KindSend && d.kind != comm.KindRecv:
		c.colls++
		d.num = c.colls
		d.small = c.g.small(d)
		d.inline = d.small && c.idle(seq) && c.g.failure() == nil
	}
	op := c.ops.Op(seq)
	*op = *d
	c.ops.Publish(seq)
	if d.inline {
		c.joinInline(op)
		c.mu.Unlock()
		if seq-c.passed.Load() >= backend.RingSize/2 {
			// Let the idle worker skip what was done inline long before
			// the slots are needed again, so that issuing never waits.
			c.g.wake(c.rank)
		}
		return comm.NewWork(c, seq)
	}
	c.mu.Unlock()
	c.g.wake(c.rank)
	return comm.NewWork(c, seq)
}

// idle reports whether operation seq would be the rank's only pending
// one: every earlier operation has completed (operations complete in
// issue order), so the issuing goroutine may join a collective itself.
func (c *Comm) idle(seq uint64) bool {
	return seq == 1 || c.ops.Done(seq-1)
}

// joinInline joins small collective d on the issuing goroutine, which
// saves the hand-offs to and from the worker: the rank publishes its call
// with its input staged and, if every rank has published already, does
// its own part at once. Otherwise its part is done by whichever comes
// first: a Wait or Test of the operation that finds every call published
// (tryFinish), or the rank's worker, which takes the collective over when
// a later operation of the rank waits behind it, a Wait on it parks or the
// group fails, and then watches it as it watches its own waits. c.mu is
// held.
func (c *Comm) joinInline(d *desc) {
	c.inlK.Store(d.num)
	c.inl.Offer(d.seq)
	c.publish(d)
	if c.ep.Lagging(d.num, shm.Called, 0) == c.g.n && c.inl.Take(d.seq) {
		c.ops.Complete(d.seq, c.finishSmall(d, nil))
		c.wakeTaker(d.seq)
	}
}

// tryFinish finishes operation id if it is a collective the rank joined
// inline, every rank has published its call, and nobody has claimed it: a
// bounded amount of work, which Wait and Test may do.
func (c *Comm) tryFinish(id uint64) {
	if !c.inl.Offered(id) {
		return
	}
	if c.ep.Lagging(c.inlK.Load(), shm.Called, 0) != c.g.n || !c.inl.Take(id) {
		return
	}
	// Claimed: the operation stays pending until completed here, so its
	// slot of the ring holds its call.
	c.ops.Complete(id, c.finishSmall(c.ops.Op(id), nil))
	c.wakeTaker(id)
}

// wakeTaker wakes the worker if it may be parked in takeOver waiting for
// collective id, just completed, having lost the claim to finish it: it
// sets taking, then parked, and looks at the slot after each, so this
// cannot pass it by. A worker parked anywhere else is left alone: it
// skips the completed collective when it next wakes, for a later
// operation, a parked Wait, its tick, or the issue that finds it
// RingSize/2 operations behind. (Waking it at every collective joined
// inline cost a goroutine switch each, on the processors the ranks need.)
func (c *Comm) wakeTaker(id uint64) {
	if c.taking.Load() == id {
		c.g.wake(c.rank)
	}
}

// TestOp reports whether operation id has completed, and its error. It
// finishes a collective the rank joined inline if the collective can be.
func (c *Comm) TestOp(id uint64) (bool, error) { return c.ops.Test(id) }

// WaitOp waits until operation id has completed or ctx is done. It spins
// briefly first; a collective joined inline is finished by the first Test
// that finds its peers arrived, or by the worker once the Wait parks.
func (c *Comm) WaitOp(ctx context.Context, id uint64) error { return c.ops.Wait(ctx, id) }

func (c *Comm) opErr(d *desc, err error) error {
	return &comm.OpError{Rank: c.rank, Seq: d.seq, Kind: d.kind, Count: d.count, DType: d.dt, Err: err}
}

var (
	_ comm.Communicator = (*Comm)(nil)
	_ comm.Capable      = (*Comm)(nil)
	_ comm.Progress     = (*Comm)(nil)
	_ comm.Waiter       = (*Comm)(nil)
)
