package checked

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// EnvVar is the environment variable that asks for the wrapper, as
// TORCH_DISTRIBUTED_DEBUG=DETAIL asks PyTorch for its ProcessGroupWrapper.
const EnvVar = "DDPGO_DISTRIBUTED_DEBUG"

// Requested reports whether the environment asks for the wrapper:
// DDPGO_DISTRIBUTED_DEBUG=DETAIL (any case). A launcher calls Wrap when it
// is set; nothing wraps a communicator otherwise.
func Requested() bool { return strings.EqualFold(os.Getenv(EnvVar), "DETAIL") }

// Options configures Wrap. The zero value is usable for a backend that
// carries host memory.
type Options struct {
	// Pool provides the memory of the fingerprints, which the wrapped
	// backend carries like any buffer. Nil makes a small private host pool
	// that Close releases; a backend without host memory (Caps.HostMemory
	// false) needs a pool of its memory, and then supplies the kernels
	// (comm.KernelSource) that copy fingerprints in and out of it.
	Pool *allocator.Pool
	// Watchdog watches each fingerprint exchange: a rank whose peers do
	// not come reports the stall (naming them when the backend is a
	// comm.Progress) and, after its Timeout, aborts the wrapped
	// communicator with comm.ErrTimeout. The zero value gives comm's
	// defaults.
	Watchdog comm.Watchdog
	// Device is the device ordinal of a device Pool's memory.
	Device int
}

// Comm is one rank's checked communicator (see the package
// documentation). Wrap returns it, extended with the wrapped backend's
// comm.Grouper and comm.KernelSource where it has them.
type Comm struct {
	inner      comm.Communicator
	rank, size int
	dog        comm.Watchdog
	kern       comm.Kernels
	pool       *allocator.Pool
	ownPool    bool

	// ops is the rank's ring: each operation's call and buffers, its
	// result once complete, the failure log and the waiters (package
	// backend)
	ops backend.Ring[op]

	// issuing, under mu
	mu           sync.Mutex
	closed       bool
	colls        uint64   // collectives issued
	sends, recvs []uint64 // messages issued, per peer
	depth        int      // open GroupStarts
	groups       uint64   // outermost groups started
	inGroup      int      // operations issued in the open group

	ended  atomic.Uint64 // outermost groups ended
	failed atomic.Pointer[error]

	// where each operation stands, under smu
	smu  sync.Mutex
	runs [backend.RingSize]run

	// the worker's parking
	wake     chan struct{}
	parked   atomic.Bool
	stopping atomic.Bool
	closing  atomic.Bool
	exited   chan struct{}

	// the exchange in progress, for Missing, under xmu
	xmu   sync.Mutex
	xseq  uint64
	xwork comm.Work

	// owned by the worker
	blk    allocator.Block // fingerprints: batch sends, then batch*size receives
	batch  int             // operations the block holds
	stage  []byte          // host copy of the block's records
	fps    []fingerprint
	xw     []comm.Work // exchange works of a batch, two per operation
	xn     []uint8     // how many of its two each operation uses
	device int         // the pool's device ordinal, for a device pool
}

// op is one issued operation.
type op struct {
	fp         fingerprint // the call, its number, and whether it is valid
	send, recv comm.Buffer
	group      uint64 // the outermost group it was issued in, or 0
}

// run is where the operation whose sequence number is seq stands.
type run struct {
	seq   uint64
	call  comm.Call
	stage uint8
	inner comm.Work // the backend's, once launched
}

// Stages of an operation.
const (
	queued   = iota // issued; fingerprints not yet judged
	launched        // running on the backend: inner has the result, which the first Test or Wait to see it records
	done            // failed or completed here: the ring has the result
)

// Wrap returns c checked: before each collective the ranks exchange a
// fingerprint of their calls through c itself, and a disagreement fails
// the collective on every rank with comm.ErrMismatch without running it.
// The result reports c's Caps with MismatchDetection set, and is a
// comm.Grouper and a comm.KernelSource where c is. It owns c: its Close
// closes c. Wrap fails with comm.ErrInvalid when c carries no host memory
// and Options.Pool is missing or not c's memory.
func Wrap(c comm.Communicator, o Options) (comm.Communicator, error) {
	w, err := newComm(c, o)
	if err != nil {
		return nil, err
	}
	_, groups := c.(comm.Grouper)
	_, kernels := c.(comm.KernelSource)
	switch {
	case groups && kernels:
		return withBoth{w}, nil
	case groups:
		return withGroups{w}, nil
	case kernels:
		return withKernels{w}, nil
	}
	return w, nil
}

func newComm(c comm.Communicator, o Options) (*Comm, error) {
	if err := o.Watchdog.Validate(); err != nil {
		return nil, fmt.Errorf("checked: Options: %w", err)
	}
	w := &Comm{
		inner:  c,
		rank:   c.Rank(),
		size:   c.Size(),
		dog:    o.Watchdog.WithDefaults(),
		pool:   o.Pool,
		device: o.Device,
		sends:  make([]uint64, c.Size()),
		recvs:  make([]uint64, c.Size()),
		wake:   make(chan struct{}, 1),
		exited: make(chan struct{}),
		kern:   comm.HostKernels(),
	}
	w.ops.Init(backend.Config{Backend: "checked", Rank: w.rank, Spin: true, Hooks: (*ringHooks)(w)})
	caps := comm.CapsOf(c)
	if w.pool == nil {
		if !caps.HostMemory {
			return nil, fmt.Errorf("%w: checked: backend %q carries no host memory: Options.Pool must give the fingerprints memory it carries", comm.ErrInvalid, caps.Backend)
		}
		p, err := allocator.New(allocator.Options{Limit: 4 << 20, SlabSize: 256 << 10})
		if err != nil {
			return nil, fmt.Errorf("checked: fingerprint pool: %w", err)
		}
		w.pool, w.ownPool = p, true
	}
	if !w.pool.Host() {
		ks, ok := c.(comm.KernelSource)
		if !ok || !caps.DeviceMemory {
			return nil, fmt.Errorf("%w: checked: Options.Pool is device memory but backend %q does not carry it with kernels of its own", comm.ErrInvalid, caps.Backend)
		}
		w.kern = ks.Kernels()
	} else if !caps.HostMemory {
		return nil, fmt.Errorf("%w: checked: Options.Pool is host memory, which backend %q does not carry", comm.ErrInvalid, caps.Backend)
	}
	if err := w.grow(1); err != nil {
		w.release()
		return nil, err
	}
	go w.run()
	return w, nil
}

// grow makes the fingerprint block hold batches of k operations.
func (c *Comm) grow(k int) error {
	if k <= c.batch {
		return nil
	}
	b, err := c.pool.Get(k * (1 + c.size) * recBytes)
	if err != nil {
		return fmt.Errorf("checked: rank %d: fingerprint memory for %d operations: %w", c.rank, k, err)
	}
	if c.blk.Size() > 0 {
		_ = c.pool.Put(c.blk)
	}
	c.blk, c.batch = b, k
	c.stage = make([]byte, b.Size())
	c.fps = make([]fingerprint, k*(1+c.size))
	c.xw = make([]comm.Work, 2*k)
	c.xn = make([]uint8, k)
	return nil
}

// release gives the fingerprint memory back.
func (c *Comm) release() {
	if c.blk.Size() > 0 {
		_ = c.pool.Put(c.blk)
		c.blk = allocator.Block{}
	}
	if c.ownPool {
		_ = c.pool.Close()
	}
}

// Unwrap returns the wrapped communicator.
func (c *Comm) Unwrap() comm.Communicator { return c.inner }

// Rank returns the rank.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.size }

// Capabilities reports the wrapped backend's Caps with MismatchDetection
// set.
func (c *Comm) Capabilities() comm.Caps {
	caps := comm.CapsOf(c.inner)
	caps.MismatchDetection = true
	return caps
}

// AllReduce issues a checked AllReduce.
func (c *Comm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindAllReduce, Op: op, DType: send.DType, Count: send.Count}, send, recv)
}

// Broadcast issues a checked Broadcast.
func (c *Comm) Broadcast(buf comm.Buffer, root int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindBroadcast, DType: buf.DType, Count: buf.Count, Root: root}, buf, buf)
}

// Reduce issues a checked Reduce.
func (c *Comm) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindReduce, Op: op, DType: send.DType, Count: send.Count, Root: root}, send, recv)
}

// AllGather issues a checked AllGather.
func (c *Comm) AllGather(send, recv comm.Buffer) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindAllGather, DType: send.DType, Count: send.Count}, send, recv)
}

// ReduceScatter issues a checked ReduceScatter.
func (c *Comm) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindReduceScatter, Op: op, DType: recv.DType, Count: recv.Count}, send, recv)
}

// Send issues a checked Send: the two ends compare their calls first.
func (c *Comm) Send(buf comm.Buffer, peer int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindSend, DType: buf.DType, Count: buf.Count, Root: peer}, buf, buf)
}

// Recv issues a checked Recv.
func (c *Comm) Recv(buf comm.Buffer, peer int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindRecv, DType: buf.DType, Count: buf.Count, Root: peer}, buf, buf)
}

// Barrier issues a checked Barrier. The fingerprint exchange is itself a
// barrier (no rank receives every fingerprint before every rank has sent
// its own), so a matching Barrier needs nothing more.
func (c *Comm) Barrier() comm.Work {
	return c.issue(comm.Call{Kind: comm.KindBarrier}, comm.Buffer{}, comm.Buffer{})
}

// Abort fails every pending and future operation of this rank and aborts
// the wrapped communicator with err. Pending operations complete within
// the backend's bound for its own Abort.
func (c *Comm) Abort(err error) {
	if err == nil {
		c.fail(fmt.Errorf("%w by rank %d", comm.ErrAborted, c.rank))
	} else {
		c.fail(fmt.Errorf("%w by rank %d: %w", comm.ErrAborted, c.rank, err))
	}
	c.inner.Abort(err)
}

// Close closes the wrapped communicator, fails pending operations with
// comm.ErrClosed, stops the rank's worker and releases the fingerprint
// memory. It is idempotent and returns the wrapped Close's error.
func (c *Comm) Close() error {
	if !c.closing.CompareAndSwap(false, true) {
		<-c.exited
		return nil
	}
	c.fail(fmt.Errorf("checked: rank %d: %w", c.rank, comm.ErrClosed))
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	err := c.inner.Close() // completes the exchange the worker may wait for
	c.stopping.Store(true)
	c.signal()
	<-c.exited
	c.release()
	return err
}

// fail records the rank's first failure and wakes the worker.
func (c *Comm) fail(err error) {
	if c.failed.CompareAndSwap(nil, &err) {
		c.signal()
	}
}

func (c *Comm) failure() error {
	if p := c.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// signal wakes the worker if it is parked.
func (c *Comm) signal() {
	if c.parked.Load() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (c *Comm) issue(call comm.Call, send, recv comm.Buffer) comm.Work {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return comm.FailedWork(&comm.OpError{Rank: c.rank, Kind: call.Kind, Count: call.Count, DType: call.DType, Err: comm.ErrClosed})
	}
	if c.depth > 0 && c.inGroup == backend.RingSize {
		// A group's operations are judged once it ends: waiting here for
		// the slot of the group's first would wait forever.
		c.mu.Unlock()
		return comm.FailedWork(&comm.OpError{Rank: c.rank, Kind: call.Kind, Count: call.Count, DType: call.DType,
			Err: fmt.Errorf("%w: checked: a group holds at most %d operations", comm.ErrInvalid, backend.RingSize)})
	}
	seq := c.ops.Reserve(c)
	call.Seq = seq
	o := c.ops.Op(seq)
	*o = op{fp: fingerprint{ok: true, call: call}, send: send, recv: recv}
	o.check(c.rank, c.size)
	switch {
	case call.Kind == comm.KindSend && o.fp.inv.Reason != backend.BadPeer:
		c.sends[call.Root]++
		o.fp.num = c.sends[call.Root]
	case call.Kind == comm.KindRecv && o.fp.inv.Reason != backend.BadPeer:
		c.recvs[call.Root]++
		o.fp.num = c.recvs[call.Root]
	case call.Kind != comm.KindSend && call.Kind != comm.KindRecv:
		c.colls++
		o.fp.num = c.colls
	}
	if c.depth > 0 {
		o.group = c.groups
		c.inGroup++
	}
	c.smu.Lock()
	c.runs[seq%backend.RingSize] = run{seq: seq, call: o.fp.call, stage: queued}
	c.smu.Unlock()
	c.ops.Publish(seq)
	c.mu.Unlock()
	c.signal()
	return comm.NewWork(c, seq)
}

// GroupStart opens a group on the wrapped backend's behalf: the
// operations issued until the matching GroupEnd are checked together and
// launched together, in one group of the backend.
func (c *Comm) groupStart() {
	c.mu.Lock()
	c.depth++
	if c.depth == 1 {
		c.groups++
		c.inGroup = 0
	}
	c.mu.Unlock()
}

func (c *Comm) groupEnd() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth == 0 {
		return fmt.Errorf("%w: checked: rank %d: GroupEnd without GroupStart", comm.ErrInvalid, c.rank)
	}
	c.depth--
	if c.depth == 0 {
		c.ended.Store(c.groups)
		c.signal()
	}
	return nil
}

// TestOp reports whether operation id has completed, and its error.
func (c *Comm) TestOp(id uint64) (bool, error) { return c.ops.Test(id) }

// WaitOp waits until operation id has completed or ctx is done: until the
// worker has judged it, and then, once launched, for the backend's Work.
func (c *Comm) WaitOp(ctx context.Context, id uint64) error {
	if done, err := c.ops.Test(id); done {
		return err
	}
	if err := c.ops.Await(ctx, id, func() bool { return c.judged(id) }); err != nil {
		return err
	}
	s := c.standing(id)
	if s.seq == id && s.stage == launched {
		err := s.inner.Wait(ctx)
		if ctx.Err() != nil {
			if ok, _ := s.inner.Test(); !ok {
				return fmt.Errorf("checked: rank %d: waiting for operation #%d: %w", c.rank, id, err)
			}
		}
		if err = c.opErr(&s, err); c.ops.Complete(id, err) {
			return err
		}
	}
	// Completed by another goroutine, which may still be writing the
	// result.
	return c.ops.Wait(ctx, id)
}

// standing returns where operation id stands (a later operation's run once
// its slot has been reused).
func (c *Comm) standing(id uint64) run {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.runs[id%backend.RingSize]
}

// judged reports whether the worker is done with operation id: launched
// on the backend, completed here, or long gone.
func (c *Comm) judged(id uint64) bool {
	s := c.standing(id)
	return s.seq != id || s.stage != queued
}

// ringHooks is how the rank takes part in its ring's Test (see
// backend.Config), kept off Comm's method set.
type ringHooks Comm

// Advance records the result of operation id if it runs on the backend
// and the backend's Work has completed.
func (h *ringHooks) Advance(id uint64) {
	c := (*Comm)(h)
	s := c.standing(id)
	if s.seq != id || s.stage != launched {
		return
	}
	if ok, err := s.inner.Test(); ok {
		c.ops.Complete(id, c.opErr(&s, err))
	}
}

// opErr turns the backend's error of a launched operation into this
// wrapper's: the rank's own sequence number, not the backend's, which
// counts the fingerprint exchanges too.
func (c *Comm) opErr(s *run, err error) error {
	if err == nil {
		return nil
	}
	var oe *comm.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &comm.OpError{Rank: c.rank, Seq: s.seq, Kind: s.call.Kind, Count: s.call.Count, DType: s.call.DType, Err: err}
}

// Missing names the ranks the pending operation of w waits for (see
// comm.Progress): while the ranks exchange fingerprints, those that have
// not joined the exchange; once launched, what the wrapped backend says.
// It returns nil when the backend cannot tell, or when the operation waits
// behind an earlier one of this rank.
func (c *Comm) Missing(w comm.Work) []int {
	if !w.IssuedBy(c) {
		return nil
	}
	id := w.ID()
	if done, _ := c.ops.Test(id); done {
		return nil
	}
	s := c.standing(id)
	switch {
	case s.seq != id || s.stage == done:
		return nil
	case s.stage == launched:
		return comm.MissingRanks(c.inner, s.inner)
	}
	c.xmu.Lock()
	xseq, xw := c.xseq, c.xwork
	c.xmu.Unlock()
	if xseq != id {
		return nil
	}
	return comm.MissingRanks(c.inner, xw)
}

// The wrapper with the optional interfaces of the wrapped backend.
type (
	withGroups  struct{ *Comm }
	withKernels struct{ *Comm }
	withBoth    struct{ *Comm }
)

// GroupStart opens a group; see comm.Grouper.
func (w withGroups) GroupStart() { w.groupStart() }

// GroupEnd closes a group; the outermost launches its operations.
func (w withGroups) GroupEnd() error { return w.groupEnd() }

// Kernels returns the wrapped backend's kernels.
func (w withKernels) Kernels() comm.Kernels { return w.inner.(comm.KernelSource).Kernels() }

// GroupStart opens a group; see comm.Grouper.
func (w withBoth) GroupStart() { w.groupStart() }

// GroupEnd closes a group; the outermost launches its operations.
func (w withBoth) GroupEnd() error { return w.groupEnd() }

// Kernels returns the wrapped backend's kernels.
func (w withBoth) Kernels() comm.Kernels { return w.inner.(comm.KernelSource).Kernels() }

var (
	_ comm.Communicator = (*Comm)(nil)
	_ comm.Capable      = (*Comm)(nil)
	_ comm.Progress     = (*Comm)(nil)
	_ comm.Waiter       = (*Comm)(nil)
	_ comm.Grouper      = withGroups{}
	_ comm.KernelSource = withKernels{}
	_ comm.Grouper      = withBoth{}
	_ comm.KernelSource = withBoth{}
)
