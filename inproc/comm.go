package inproc

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/ddpgo/ddpgo/comm"
)

// ringSize is the number of operations a rank may have issued and not yet
// completed; issuing one more waits for the oldest.
const ringSize = 256

// chunkBytes is the block size of the reduction loops: small enough that a
// block of every input stays in L1 while it is reduced and copied out.
const chunkBytes = 8 << 10

// Comm is one rank's communicator. It implements comm.Communicator and
// comm.Waiter; its methods may be called from any goroutine.
type Comm struct {
	g    *group
	rank int

	mu     sync.Mutex // serialises issuing
	closed bool
	// numbering at issue, under mu: collectives, and messages per peer
	colls        uint64
	sends, recvs []uint64

	_       cpu.CacheLinePad
	issued  atomic.Uint64 // sequence number of the last issued operation
	_       cpu.CacheLinePad
	arrived atomic.Uint64 // number of the last collective this rank published its call of
	current atomic.Uint64 // sequence number of the operation the worker runs or ran last
	passed  atomic.Uint64 // the worker is done with every operation up to this one
	watch   atomic.Uint64 // a Wait has parked on this operation: the worker must watch it
	_       cpu.CacheLinePad
	parked  atomic.Bool // the worker is blocked on wake
	_       cpu.CacheLinePad
	// inl is the sequence number of the last collective the rank joined
	// inline, with inlClaimed set once a goroutine has taken on finishing
	// it; inlK is its collective number.
	inl  atomic.Uint64
	inlK atomic.Uint64
	_    cpu.CacheLinePad
	// waitingFor is the collective whose calls the worker waits for, or 0.
	waitingFor atomic.Uint64
	_          cpu.CacheLinePad

	wake     chan struct{}
	stopping atomic.Bool
	closing  atomic.Bool
	exited   chan struct{}

	ring  [ringSize]desc
	slots [ringSize]doneSlot

	// waiters parked in WaitOp
	wmu     sync.Mutex
	nwait   atomic.Int32
	waiters []chan struct{}
	spare   []chan struct{}

	// failed operations, for Waits after their slot has been reused
	fmu       sync.Mutex
	fails     []failure // in sequence order
	forgotten uint64    // fails up to this sequence number were dropped
	failFrom  uint64    // the first failure after the group failed; every later operation failed too

	// owned by the worker goroutine
	par        uint64 // parallel collectives joined
	timer      *time.Timer
	srcs, dsts []unsafe.Pointer
	ptrs       []unsafe.Pointer
	views      [][]byte // reinterpreted as [][]T by the kernels
	tmp        unsafe.Pointer
	tmpMem     []byte

	// headers and staging buffers of small collectives (see small.go):
	// the headers made with the group, the buffers on first use, before
	// the rank first publishes a call that needs them
	hdr      [2]*header
	stage    [2]unsafe.Pointer
	stageMem []byte
}

type doneSlot struct {
	// done is the sequence number of the last operation completed in this
	// slot; while the slot is being rewritten for operation s it is
	// s|writing, so a reader never pairs one operation's number with the
	// next one's error.
	done atomic.Uint64
	err  atomic.Pointer[error]
}

// writing marks a doneSlot whose result is being rewritten.
const writing = 1 << 63

// failure is a failed operation, kept for Waits that come after its ring
// slot has been reused.
type failure struct {
	seq uint64
	err error
}

// failLogMax bounds the failures a rank keeps; beyond it the older half is
// forgotten.
const failLogMax = 4096

func newComm(g *group, rank int) *Comm {
	c := &Comm{
		g:      g,
		rank:   rank,
		wake:   make(chan struct{}, 1),
		exited: make(chan struct{}),
		sends:  make([]uint64, g.n),
		recvs:  make([]uint64, g.n),
		srcs:   make([]unsafe.Pointer, g.n),
		dsts:   make([]unsafe.Pointer, g.n),
		ptrs:   make([]unsafe.Pointer, g.n),
		views:  make([][]byte, g.n),
		tmpMem: make([]byte, chunkBytes+64),
	}
	off := (64 - int(uintptr(unsafe.Pointer(&c.tmpMem[0]))%64)) % 64
	c.tmp = unsafe.Pointer(&c.tmpMem[off])
	c.timer = time.NewTimer(time.Hour)
	c.timer.Stop()
	return c
}

// Rank returns the communicator's rank.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks in the group.
func (c *Comm) Size() int { return c.g.n }

// AllReduce reduces send over all ranks with op into recv (in place when
// recv is send).
func (c *Comm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindAllReduce, op: op, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	d.err = checkBuf("send", send)
	if d.err == nil {
		d.err = checkBuf("recv", recv)
	}
	if d.err == nil {
		d.err = checkOp(op)
	}
	if d.err == nil {
		d.err = checkPair("all_reduce", send, recv)
	}
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
	d.err = checkBuf("buf", buf)
	if d.err == nil {
		d.err = c.checkRank("root", root)
	}
	return c.issue(&d)
}

// Reduce reduces send over all ranks with op into recv on root.
func (c *Comm) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	d := desc{kind: comm.KindReduce, op: op, dt: send.DType, count: send.Count, root: root, send: send.Addr}
	d.err = checkBuf("send", send)
	if d.err == nil {
		d.err = checkOp(op)
	}
	if d.err == nil {
		d.err = c.checkRank("root", root)
	}
	if d.err == nil && root == c.rank {
		d.recv = recv.Addr
		d.err = checkBuf("recv", recv)
		if d.err == nil && (recv.Count != send.Count || recv.DType != send.DType) {
			d.err = fmt.Errorf("%w: reduce on root %d: recv is %d x %s, send is %d x %s", comm.ErrInvalid, root, recv.Count, recv.DType, send.Count, send.DType)
		}
	}
	return c.issue(&d)
}

// AllGather concatenates every rank's send into recv, in rank order.
func (c *Comm) AllGather(send, recv comm.Buffer) comm.Work {
	d := desc{kind: comm.KindAllGather, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	d.err = checkBuf("send", send)
	if d.err == nil {
		d.err = checkBuf("recv", recv)
	}
	if d.err == nil && (recv.Count != c.g.n*send.Count || recv.DType != send.DType) {
		d.err = fmt.Errorf("%w: all_gather over %d ranks: recv is %d x %s, want %d x %s", comm.ErrInvalid, c.g.n, recv.Count, recv.DType, c.g.n*send.Count, send.DType)
	}
	return c.issue(&d)
}

// ReduceScatter reduces send over all ranks with op and leaves this rank's
// block of the result in recv.
func (c *Comm) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindReduceScatter, op: op, dt: recv.DType, count: recv.Count, send: send.Addr, recv: recv.Addr}
	d.err = checkBuf("send", send)
	if d.err == nil {
		d.err = checkBuf("recv", recv)
	}
	if d.err == nil {
		d.err = checkOp(op)
	}
	if d.err == nil && (send.Count != c.g.n*recv.Count || recv.DType != send.DType) {
		d.err = fmt.Errorf("%w: reduce_scatter over %d ranks: send is %d x %s, want %d x %s", comm.ErrInvalid, c.g.n, send.Count, send.DType, c.g.n*recv.Count, recv.DType)
	}
	return c.issue(&d)
}

// Send sends buf to rank peer. It completes when peer has received it.
func (c *Comm) Send(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindSend, dt: buf.DType, count: buf.Count, root: peer, send: buf.Addr}
	d.err = checkBuf("buf", buf)
	if err := c.checkPeer(peer); err != nil {
		d.err, d.root = err, -1
	}
	return c.issue(&d)
}

// Recv receives into buf from rank peer.
func (c *Comm) Recv(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindRecv, dt: buf.DType, count: buf.Count, root: peer, recv: buf.Addr}
	d.err = checkBuf("buf", buf)
	if err := c.checkPeer(peer); err != nil {
		d.err, d.root = err, -1
	}
	return c.issue(&d)
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
	seq := c.issued.Load() + 1
	if seq > ringSize {
		// The slot's previous operation must be complete before it is
		// reused, and the worker past it: the worker reads the slots of
		// collectives joined inline too, if only to skip them.
		old := seq - ringSize
		_ = c.WaitOp(context.Background(), old)
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
	c.ring[seq%ringSize] = *d
	c.issued.Store(seq)
	if d.inline {
		c.joinInline(&c.ring[seq%ringSize])
		c.mu.Unlock()
		if seq-c.passed.Load() >= ringSize/2 {
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

// inlClaimed marks Comm.inl once a goroutine has taken on finishing the
// collective: the issuing goroutine when it publishes last, a Wait or
// Test that finds every call published, or the rank's worker (see
// takeOver).
const inlClaimed = 1 << 63

// idle reports whether operation seq would be the rank's only pending
// one: every earlier operation has completed (operations complete in
// issue order), so the issuing goroutine may join a collective itself.
func (c *Comm) idle(seq uint64) bool {
	return seq == 1 || c.slots[(seq-1)%ringSize].done.Load() == seq-1
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
	c.inl.Store(d.seq)
	c.publish(d)
	if c.g.published(d.num, 0) == c.g.n && c.inl.CompareAndSwap(d.seq, d.seq|inlClaimed) {
		c.complete(d.seq, c.finishSmall(d, nil))
		// The worker may be parked in takeOver, having lost the claim.
		c.g.wake(c.rank)
	}
}

// tryFinish finishes operation id if it is a collective the rank joined
// inline, every rank has published its call, and nobody has claimed it: a
// bounded amount of work, which Wait and Test may do.
func (c *Comm) tryFinish(id uint64) {
	if c.inl.Load() != id {
		return
	}
	if c.g.published(c.inlK.Load(), 0) != c.g.n || !c.inl.CompareAndSwap(id, id|inlClaimed) {
		return
	}
	// Claimed: the operation stays pending until completed here, so its
	// slot of the ring holds its call.
	c.complete(id, c.finishSmall(&c.ring[id%ringSize], nil))
	// The worker may be parked in takeOver, having lost the claim: it
	// parks only after setting parked and looking at the slot once more,
	// so this wake cannot pass it by.
	c.g.wake(c.rank)
}

// TestOp reports whether operation id has completed, and its error. It
// finishes a collective the rank joined inline if the collective can be.
func (c *Comm) TestOp(id uint64) (bool, error) {
	if id == 0 || id > c.issued.Load() {
		return true, fmt.Errorf("%w: inproc: rank %d has issued no operation #%d", comm.ErrInvalid, c.rank, id)
	}
	c.tryFinish(id)
	s := &c.slots[id%ringSize]
	done := s.done.Load()
	switch {
	case done&^writing < id || done == id|writing:
		return false, nil
	case done == id:
		ep := s.err.Load()
		if s.done.Load() == id {
			if ep == nil {
				return true, nil
			}
			return true, *ep
		}
	}
	// The slot has been reused since operation id completed.
	return true, c.oldResult(id)
}

// oldResult returns the result of operation id, completed long enough ago
// that its ring slot has been reused.
func (c *Comm) oldResult(id uint64) error {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	i, found := slices.BinarySearchFunc(c.fails, id, func(f failure, id uint64) int { return cmp.Compare(f.seq, id) })
	switch {
	case found:
		return c.fails[i].err
	case c.failFrom != 0 && id > c.failFrom:
		return fmt.Errorf("inproc: rank %d: operation #%d: %w", c.rank, id, c.g.failure())
	case id <= c.forgotten:
		return fmt.Errorf("%w: inproc: rank %d: operation #%d completed more than %d failures ago; its result is no longer kept", comm.ErrInvalid, c.rank, id, failLogMax/2)
	}
	return nil
}

// WaitOp waits until operation id has completed or ctx is done.
func (c *Comm) WaitOp(ctx context.Context, id uint64) error {
	if done, err := c.TestOp(id); done {
		return err
	}
	// TestOp finishes a collective joined inline once its peers have
	// arrived.
	for sp := (spinner{}); ; {
		if done, err := c.TestOp(id); done {
			return err
		}
		if !sp.spin() {
			break
		}
	}
	ch := c.addWaiter()
	defer c.dropWaiter(ch)
	// A collective joined inline is watched by the worker once asked to.
	for w := c.watch.Load(); w < id && !c.watch.CompareAndSwap(w, id); w = c.watch.Load() {
	}
	c.g.wake(c.rank)
	for {
		if done, err := c.TestOp(id); done {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("inproc: rank %d: waiting for operation #%d: %w", c.rank, id, context.Cause(ctx))
		}
	}
}

// complete records the result of operation seq and wakes its waiters.
func (c *Comm) complete(seq uint64, err error) {
	s := &c.slots[seq%ringSize]
	s.done.Store(seq | writing)
	if err != nil {
		e := err // a heap copy only on failure
		s.err.Store(&e)
		c.logFailure(seq, err)
	} else if s.err.Load() != nil { // an atomic pointer store is not free
		s.err.Store(nil)
	}
	s.done.Store(seq)
	if c.nwait.Load() > 0 {
		c.wmu.Lock()
		for _, ch := range c.waiters {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		c.wmu.Unlock()
	}
}

// logFailure keeps the error of operation seq for Waits that come after
// its slot has been reused. Once the group has failed every later
// operation fails with the group's error, so those need no entry.
func (c *Comm) logFailure(seq uint64, err error) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	if c.failFrom != 0 {
		return
	}
	if len(c.fails) == failLogMax {
		c.forgotten = c.fails[failLogMax/2-1].seq
		c.fails = c.fails[:copy(c.fails, c.fails[failLogMax/2:])]
	}
	c.fails = append(c.fails, failure{seq, err})
	if c.g.failure() != nil {
		c.failFrom = seq
	}
}

func (c *Comm) addWaiter() chan struct{} {
	c.wmu.Lock()
	var ch chan struct{}
	if n := len(c.spare); n > 0 {
		ch = c.spare[n-1]
		c.spare = c.spare[:n-1]
	} else {
		ch = make(chan struct{}, 1)
	}
	c.waiters = append(c.waiters, ch)
	c.nwait.Add(1)
	c.wmu.Unlock()
	return ch
}

func (c *Comm) dropWaiter(ch chan struct{}) {
	c.wmu.Lock()
	for i, w := range c.waiters {
		if w == ch {
			last := len(c.waiters) - 1
			c.waiters[i] = c.waiters[last]
			c.waiters[last] = nil
			c.waiters = c.waiters[:last]
			break
		}
	}
	select {
	case <-ch:
	default:
	}
	c.spare = append(c.spare, ch)
	c.nwait.Add(-1)
	c.wmu.Unlock()
}

func (c *Comm) opErr(d *desc, err error) error {
	return &comm.OpError{Rank: c.rank, Seq: d.seq, Kind: d.kind, Count: d.count, DType: d.dt, Err: err}
}

func checkBuf(name string, b comm.Buffer) error {
	switch {
	case !b.DType.Valid():
		return fmt.Errorf("%w: %s has dtype %s", comm.ErrInvalid, name, b.DType)
	case b.Loc != comm.Host:
		return fmt.Errorf("%w: %s is device memory; inproc carries host buffers only", comm.ErrInvalid, name)
	case b.Count < 0:
		return fmt.Errorf("%w: %s has count %d", comm.ErrInvalid, name, b.Count)
	case b.Count > 0 && b.Addr == nil:
		return fmt.Errorf("%w: %s has count %d and a nil address", comm.ErrInvalid, name, b.Count)
	}
	return nil
}

// checkPair checks an out-of-place pair: the same count and dtype, and
// either the same buffer or no overlap.
func checkPair(op string, send, recv comm.Buffer) error {
	switch {
	case recv.Count != send.Count || recv.DType != send.DType:
		return fmt.Errorf("%w: %s: recv is %d x %s, send is %d x %s", comm.ErrInvalid, op, recv.Count, recv.DType, send.Count, send.DType)
	case comm.Overlap(send, recv):
		return fmt.Errorf("%w: %s: send [%p, +%d B) and recv [%p, +%d B) overlap without being the same buffer", comm.ErrInvalid, op, send.Addr, send.Bytes(), recv.Addr, recv.Bytes())
	}
	return nil
}

func checkOp(op comm.Op) error {
	if !op.Valid() {
		return fmt.Errorf("%w: reduction op %s", comm.ErrInvalid, op)
	}
	return nil
}

func (c *Comm) checkRank(name string, r int) error {
	if r < 0 || r >= c.g.n {
		return fmt.Errorf("%w: %s %d out of range for %d ranks", comm.ErrInvalid, name, r, c.g.n)
	}
	return nil
}

func (c *Comm) checkPeer(p int) error {
	if err := c.checkRank("peer", p); err != nil {
		return err
	}
	if p == c.rank {
		return fmt.Errorf("%w: peer %d is the rank itself", comm.ErrInvalid, p)
	}
	return nil
}

var (
	_ comm.Communicator = (*Comm)(nil)
	_ comm.Capable      = (*Comm)(nil)
	_ comm.Progress     = (*Comm)(nil)
)
