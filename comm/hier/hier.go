package hier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// Config is what New composes one rank's communicator from.
type Config struct {
	// Layout places every rank of the job; Rank is this rank's global rank.
	Layout Layout
	Rank   int
	// Local is this rank's communicator over the ranks of its host: size
	// L_h, its rank the local rank.
	Local comm.Communicator
	// Cross is this rank's communicator over local rank j (this rank's
	// local rank) of every host that has one: its ranks are those hosts in
	// increasing host order.
	Cross comm.Communicator
	// World, if not nil, is a communicator over the whole job with the
	// global numbering. It carries the Sends and Recvs between ranks that
	// share neither host nor local rank, which the two levels cannot
	// reach; without it those fail with comm.ErrInvalid.
	World comm.Communicator
	// Pool provides the scratch memory that Reduce (on ranks other than
	// the root), AllGather and ReduceScatter work in. It must hold memory
	// both levels carry. Nil makes a private pool that Close releases,
	// over Local's HostSource (comm.HostSourceOf) where it has one, else
	// over host memory.
	Pool *allocator.Pool
	// ChunkBytes, if positive, cuts an AllReduce of more than twice as
	// many bytes into chunks of ChunkBytes, so that one chunk crosses the
	// hosts while the host reduces the next and spreads the one before.
	// Zero never cuts: whether the overlap pays depends on the network
	// and the hosts, and is for a run across hosts to tell.
	ChunkBytes int
}

// Comm is one rank's communicator over the whole job, composed of its
// host's and its cross group's (see the package documentation). It
// implements comm.Communicator and comm.Capable; Close closes the
// communicators it was made of.
type Comm struct {
	t           *topo
	rank        int
	host, local int // this rank's place
	lv          [3]level
	pool        *allocator.Pool
	ownPool     bool
	chunk       int       // Config.ChunkBytes
	pend        []pending // the worker's inner operations in flight
	rules       backend.Rules

	mu     sync.Mutex // orders the issues
	closed bool       // under mu: the queue is closed

	closeOnce sync.Once
	closeErr  error // Close's result
	ops       backend.Ring[op]
	queue     chan uint64 // published operations, for the worker
	exited    chan struct{}

	failed  atomic.Pointer[error] // the first failure: Abort, Close or a level's
	abortMu sync.Mutex            // serialises the aborts of the levels
	aborted bool                  // under abortMu: the levels have been aborted
}

// The levels, indexes of Comm.lv.
const (
	lvLocal = iota
	lvCross
	lvWorld
)

// level is one of the communicators a Comm is made of.
type level struct {
	name string
	c    comm.Communicator // nil for a World not given
}

// op is the descriptor of one operation: the call, its buffers, and the
// argument error when the call is invalid.
type op struct {
	call       comm.Call
	send, recv comm.Buffer
	err        error
}

// New returns rank cfg.Rank's communicator over the job that cfg.Layout
// describes. It checks that each level's size and rank are those the
// layout gives this rank (an error wrapping comm.ErrInvalid that names
// both otherwise) and that both levels carry host memory. From then on
// the Comm owns the levels: Close closes them, and a failure on one
// aborts the others.
func New(cfg Config) (*Comm, error) {
	t, err := newTopo(cfg.Layout)
	if err != nil {
		return nil, err
	}
	if cfg.Rank < 0 || cfg.Rank >= len(t.places) {
		return nil, fmt.Errorf("%w: hier: rank %d out of range for a layout of %d ranks", comm.ErrInvalid, cfg.Rank, len(t.places))
	}
	p := t.places[cfg.Rank]
	c := &Comm{t: t, rank: cfg.Rank, host: p.Host, local: p.Local, pool: cfg.Pool}
	c.lv[lvLocal] = level{"local", cfg.Local}
	c.lv[lvCross] = level{"cross", cfg.Cross}
	c.lv[lvWorld] = level{"world", cfg.World}
	want := [3][2]int{
		{p.Local, t.size[p.Host]},
		{t.crossRank(p.Host, p.Local), t.crossSize(p.Local)},
		{cfg.Rank, len(t.places)},
	}
	for i, lv := range c.lv {
		if lv.c == nil {
			if i == lvWorld {
				continue
			}
			return nil, fmt.Errorf("%w: hier: rank %d: no %s communicator", comm.ErrInvalid, cfg.Rank, lv.name)
		}
		if r, n := lv.c.Rank(), lv.c.Size(); r != want[i][0] || n != want[i][1] {
			return nil, fmt.Errorf("%w: hier: rank %d (host %d, local rank %d): the %s communicator is rank %d of %d; the layout wants rank %d of %d",
				comm.ErrInvalid, cfg.Rank, p.Host, p.Local, lv.name, r, n, want[i][0], want[i][1])
		}
		if !comm.CapsOf(lv.c).HostMemory {
			return nil, fmt.Errorf("%w: hier: rank %d: the %s communicator (%s) does not carry host memory", comm.ErrInvalid, cfg.Rank, lv.name, comm.CapsOf(lv.c).Backend)
		}
	}
	if c.pool == nil {
		// Memory of the host level's own source where it has one (the
		// shared memory its collectives run on in place), so that the
		// scratch buffers' phases take the same path as the user's.
		if c.pool, err = allocator.New(allocator.Options{Source: comm.HostSourceOf(cfg.Local)}); err != nil {
			return nil, fmt.Errorf("hier: rank %d: a pool for scratch buffers: %w", cfg.Rank, err)
		}
		c.ownPool = true
	}
	c.chunk = cfg.ChunkBytes
	c.rules = backend.Rules{Rank: cfg.Rank, Size: len(t.places), HostOnly: true}
	c.queue = make(chan uint64, backend.RingSize)
	c.exited = make(chan struct{})
	c.ops.Init(backend.Config{Backend: "hier", Rank: cfg.Rank, Hooks: (*hooks)(c)})
	go c.run()
	return c, nil
}

// hooks keeps the ring's hook off Comm's API.
type hooks Comm

// Failure makes the ring Sticky: once the Comm has failed, every later
// operation fails.
func (h *hooks) Failure() error { return (*Comm)(h).failure() }

func (c *Comm) failure() error {
	if p := c.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// ChunkBytes returns the Config.ChunkBytes the Comm cuts its
// all-reduces by (0: none).
func (c *Comm) ChunkBytes() int { return c.chunk }

// Rank returns this rank's global rank.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks of the job.
func (c *Comm) Size() int { return len(c.t.places) }

// Capabilities reports host memory; Avg is a Sum divided at the end and
// half-precision sums round once per level, so neither is native, and
// mismatches are caught only as far as the levels catch them (wrap the
// Comm with comm/checked to have them named).
func (c *Comm) Capabilities() comm.Caps {
	return comm.Caps{Backend: "hier", HostMemory: true}
}

// HostSource returns the host source the local level prefers (package
// mpi's shared memory), so that buckets come from memory the host's ranks
// reduce in place; nil if it has none.
func (c *Comm) HostSource() allocator.Source { return comm.HostSourceOf(c.lv[lvLocal].c) }

// AllReduce reduces send over every rank into recv: reduce-scatter inside
// the host, all-reduce of each shard across hosts, all-gather inside the
// host.
func (c *Comm) AllReduce(send, recv comm.Buffer, o comm.Op) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindAllReduce, Op: o, Count: send.Count}, send, recv)
}

// Broadcast copies root's buf to every rank: inside root's host, then
// shard by shard across hosts, then inside every other host.
func (c *Comm) Broadcast(buf comm.Buffer, root int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindBroadcast, Root: root, Count: buf.Count}, buf, buf)
}

// Reduce reduces send over every rank into root's recv: as AllReduce, but
// each shard is reduced across hosts to root's host only, where root
// collects the shards.
func (c *Comm) Reduce(send, recv comm.Buffer, o comm.Op, root int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindReduce, Op: o, Root: root, Count: send.Count}, send, recv)
}

// AllGather concatenates every rank's send into recv, in global rank
// order: gathered across hosts by each local rank, then inside the host
// (on uneven hosts: inside the host, then between the hosts' local ranks
// 0, then inside the host again).
func (c *Comm) AllGather(send, recv comm.Buffer) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindAllGather, Count: send.Count}, send, recv)
}

// ReduceScatter reduces send over every rank and leaves block Rank in
// recv: reduce-scattered inside the host, then across hosts by each local
// rank (on uneven hosts: an AllReduce into scratch memory, of which the
// rank keeps its block).
func (c *Comm) ReduceScatter(send, recv comm.Buffer, o comm.Op) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindReduceScatter, Op: o, Count: recv.Count}, send, recv)
}

// Send sends buf to peer over the level the two ranks share: their host's,
// their cross group, or else Config.World.
func (c *Comm) Send(buf comm.Buffer, peer int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindSend, Root: peer, Count: buf.Count}, buf, buf)
}

// Recv receives buf from peer, over the level Send takes.
func (c *Comm) Recv(buf comm.Buffer, peer int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindRecv, Root: peer, Count: buf.Count}, buf, buf)
}

// Barrier completes once every rank has reached it: a barrier inside each
// host, one between the hosts' local ranks 0, and one more inside each
// host.
func (c *Comm) Barrier() comm.Work {
	return c.issue(comm.Call{Kind: comm.KindBarrier}, comm.Buffer{}, comm.Buffer{})
}

// issue checks the call, gives it the next sequence number and hands it
// to the worker. An invalid call is issued too and fails in its turn, so
// that sequence numbers stay those of the rank's calls.
func (c *Comm) issue(call comm.Call, send, recv comm.Buffer) comm.Work {
	call.DType = send.DType
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return comm.FailedWork(&comm.OpError{Rank: c.rank, Kind: call.Kind, Count: call.Count, DType: call.DType, Err: fmt.Errorf("hier: rank %d: %w", c.rank, comm.ErrClosed)})
	}
	seq := c.ops.Reserve(c)
	call.Seq = seq
	d := c.ops.Op(seq)
	*d = op{call: call, send: send, recv: recv}
	d.err = c.rules.Check(&d.call, &d.send, &d.recv).Err(call, c.Size())
	if d.err == nil && (call.Kind == comm.KindSend || call.Kind == comm.KindRecv) {
		if lv, _ := c.route(call.Root); c.lv[lv].c == nil {
			p := c.t.places[call.Root]
			d.err = fmt.Errorf("%w: %s: rank %d (host %d, local rank %d) and peer %d (host %d, local rank %d) share neither host nor local rank, and no World communicator was given",
				comm.ErrInvalid, call.Kind, c.rank, c.host, c.local, call.Root, p.Host, p.Local)
		}
	}
	c.ops.Publish(seq)
	c.queue <- seq
	return comm.NewWork(c, seq)
}

// TestOp and WaitOp make Comm the comm.Waiter behind its Works.
func (c *Comm) TestOp(id uint64) (bool, error) { return c.ops.Test(id) }

// WaitOp waits for operation id until ctx is done.
func (c *Comm) WaitOp(ctx context.Context, id uint64) error { return c.ops.Wait(ctx, id) }

// run is the worker: it runs the rank's operations one at a time, in
// issue order, each phase after the one before has completed, so every
// rank issues the same inner collectives in the same order on each level.
func (c *Comm) run() {
	defer close(c.exited)
	for seq := range c.queue {
		d := c.ops.Op(seq)
		err := d.err
		if err == nil {
			err = c.failure()
		}
		if err == nil {
			err = c.execute(d)
		}
		if err != nil {
			err = &comm.OpError{Rank: c.rank, Seq: seq, Kind: d.call.Kind, Count: d.call.Count, DType: d.call.DType, Err: err}
		}
		c.ops.Complete(seq, err)
	}
}

// inner waits for w, an operation issued on level lv, and returns nil or,
// when it failed, the error that fails the Comm (see fail).
func (c *Comm) inner(lv int, what comm.Kind, w comm.Work) error {
	if err := w.Wait(context.Background()); err != nil {
		return c.fail(lv, what, err)
	}
	return nil
}

// fail records the failure of an operation on level lv, unless the Comm
// has failed already, aborts every level with it, and returns the
// operation's error wrapping err. The levels' collectives are out of step
// once one of them has failed on some ranks, so the Comm cannot go on; the
// abort fails the peers that wait for this rank on the other levels
// instead of leaving them to their deadlines.
func (c *Comm) fail(lv int, what comm.Kind, err error) error {
	e := fmt.Errorf("hier: rank %d (host %d, local rank %d): %s level: %s: %w", c.rank, c.host, c.local, c.lv[lv].name, what, err)
	c.failed.CompareAndSwap(nil, &e)
	c.abortLevels(c.failure())
	return e
}

// abortLevels aborts every level with err, once.
func (c *Comm) abortLevels(err error) {
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	if c.aborted {
		return
	}
	c.aborted = true
	for _, lv := range c.lv {
		if lv.c != nil {
			lv.c.Abort(err)
		}
	}
}

// halted returns the Comm's failure, checked before each phase: an
// operation stops between phases once the Comm has failed.
func (c *Comm) halted() error { return c.failure() }

// Abort fails every pending and later operation of this rank with an
// error that wraps comm.ErrAborted and err, by aborting both levels (and
// World): the operation under way fails when its phase's inner operation
// fails, within the bound of that level's Abort, and the later ones at
// once. Whether the peers learn of it is up to the levels: an inproc or
// shared-memory level fails its peers, which then abort their own other
// levels, so the failure spreads to the whole job.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = errors.New("no cause given")
	}
	e := fmt.Errorf("hier: rank %d: %w: %w", c.rank, comm.ErrAborted, err)
	c.failed.CompareAndSwap(nil, &e)
	c.abortLevels(c.failure())
}

// Close fails the pending operations with comm.ErrClosed, unless the Comm
// had failed before, closes the levels, waits for the worker and releases
// a private pool. The levels are closed first, so that a Close never waits
// behind an issue that waits for a free slot of the ring. It is
// idempotent; it returns the levels' and the pool's errors, joined.
func (c *Comm) Close() error {
	c.closeOnce.Do(func() {
		e := fmt.Errorf("hier: rank %d: %w", c.rank, comm.ErrClosed)
		c.failed.CompareAndSwap(nil, &e)
		var errs []error
		for _, lv := range c.lv {
			if lv.c != nil {
				if err := lv.c.Close(); err != nil {
					errs = append(errs, fmt.Errorf("hier: rank %d: closing the %s communicator: %w", c.rank, lv.name, err))
				}
			}
		}
		c.mu.Lock()
		c.closed = true
		close(c.queue)
		c.mu.Unlock()
		<-c.exited
		if c.ownPool {
			if err := c.pool.Close(); err != nil {
				errs = append(errs, fmt.Errorf("hier: rank %d: closing the scratch pool: %w", c.rank, err))
			}
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}
