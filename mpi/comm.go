//go:build mpi && cgo

package mpi

/*
#include "ddpmpi.h"
*/
import "C"

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// The C side numbers kinds, dtypes and ops as package comm does.
var (
	_ = [1]struct{}{}[int(C.DDP_ALLREDUCE)-int(comm.KindAllReduce)]
	_ = [1]struct{}{}[int(C.DDP_BARRIER)-int(comm.KindBarrier)]
	_ = [1]struct{}{}[int(C.DDP_REDUCESCATTER)-int(comm.KindReduceScatter)]
	_ = [1]struct{}{}[int(C.DDP_F32)-int(comm.Float32)]
	_ = [1]struct{}{}[int(C.DDP_F16)-int(comm.Float16)]
	_ = [1]struct{}{}[int(C.DDP_BF16)-int(comm.BFloat16)]
	_ = [1]struct{}{}[int(C.DDP_U8)-int(comm.Uint8)]
	_ = [1]struct{}{}[int(C.DDP_SUM)-int(comm.Sum)]
	_ = [1]struct{}{}[int(C.DDP_MIN)-int(comm.Min)]
)

const (
	kindAllReduce     = comm.KindAllReduce
	kindReduce        = comm.KindReduce
	kindReduceScatter = comm.KindReduceScatter
	kindSend          = comm.KindSend
	kindRecv          = comm.KindRecv
	opAvg             = comm.Avg
)

// ringSize is the number of operations a communicator may have issued and
// not yet completed; issuing one more waits for the oldest.
const ringSize = 256

// failLogMax bounds the failures a communicator keeps for Waits that come
// after the operation's ring slot has been reused.
const failLogMax = 4096

var epoch = time.Now()

func now() int64 { return int64(time.Since(epoch)) }

// communicator is one rank's handle on a duplicate of MPI_COMM_WORLD.
type communicator struct {
	e          *engine
	h          C.MPI_Comm
	rank, size int
	blocking   bool
	hosts      int // the hosts the ranks run on
	// large, where hasLarge, is a second duplicate of MPI_COMM_WORLD
	// whose all-reduce is the segmented ring, for blocking all-reduces of
	// at least largeMin bytes between hosts (see the package
	// documentation).
	large    C.MPI_Comm
	hasLarge bool
	largeOps atomic.Uint64 // operations run on large, for tests
	// shm: blocking, and every rank on one machine: all-reduces of
	// buffers from HostSource run in shared memory (ddpshm.c).
	shm    bool
	shmOff bool          // owner-only: a rank could not map a peer's memory; MPI runs every all-reduce
	shmOps atomic.Uint64 // all-reduces run in shared memory, for tests
	opts   Options

	mu      sync.Mutex // serialises issuing
	closed  bool
	issued  atomic.Uint64
	closing atomic.Bool

	ring  [ringSize]desc // written by the issuer, then read by the owner
	slots [ringSize]doneSlot

	// owner-only
	received, started     uint64 // the last operation taken from the queue, and given to MPI (or failed)
	posted                int    // operations given to MPI and not yet finished (0 or 1)
	failed                error  // the first MPI error; the communicator is unusable after it
	closeMarked, released bool

	freed    chan struct{} // closed once the MPI communicator is freed
	closeErr error         // set before freed is closed

	// waiters parked in WaitOp
	wmu     sync.Mutex
	nwait   atomic.Int32
	waiters []chan struct{}
	spare   []chan struct{}

	// failed operations, for Waits after their slot has been reused
	fmu       sync.Mutex
	fails     []failure
	forgotten uint64

	wdStop, wdDone chan struct{}
}

// desc is one issued operation.
type desc struct {
	seq     uint64
	kind    comm.Kind
	op      comm.Op
	dt      comm.DType
	count   int // the element count that names the operation (per rank for AllGather and ReduceScatter)
	send    unsafe.Pointer
	recv    unsafe.Pointer
	root    int // root, or peer for Send and Recv
	inplace bool
	err     error // an argument error: the operation fails without reaching MPI
	scratch allocator.Block
}

type doneSlot struct {
	// done is the sequence number of the last operation completed in this
	// slot; while the slot is rewritten for operation s it is s|writing.
	done   atomic.Uint64
	err    atomic.Pointer[error]
	issued atomic.Int64  // when the slot's current operation was issued (ns since epoch)
	kind   atomic.Uint32 // its kind, for stall reports
}

const writing = 1 << 63

type failure struct {
	seq uint64
	err error
}

// Open returns this rank's communicator over a duplicate of
// MPI_COMM_WORLD (MPI_Comm_dup), initialising MPI on first use. It is
// collective: every rank of the world calls it at the same point.
func Open(o Options) (comm.Communicator, error) {
	if o.AbortCode < 0 || o.AbortCode > 255 {
		return nil, fmt.Errorf("%w: mpi: Options.AbortCode %d: want 0..255", comm.ErrInvalid, o.AbortCode)
	}
	e, err := start()
	if err != nil {
		return nil, err
	}
	c := &communicator{e: e, opts: o, freed: make(chan struct{})}
	err = e.call(func() error {
		var r, n C.int
		if rc := C.ddp_dup(&c.h, &r, &n); rc != C.MPI_SUCCESS {
			return fmt.Errorf("mpi: world rank %d: MPI_Comm_dup: %w", e.worldRank, mpiError(int(rc)))
		}
		c.rank, c.size = int(r), int(n)
		// Blocking collectives of two communicators deadlock when ranks
		// interleave them differently, so a process runs at most one
		// communicator in blocking mode; the ranks agree by taking the
		// minimum of their wishes, since blocking and non-blocking
		// collectives do not match in MPI.
		want := C.int(0)
		if o.Blocking && e.blockingComms == 0 {
			want = 1
		}
		if rc := C.ddp_allreduce_int(c.h, &want, 1, 0); rc != C.MPI_SUCCESS {
			C.ddp_free(&c.h)
			return fmt.Errorf("mpi: world rank %d: agreeing on the progress mode: %w", e.worldRank, mpiError(int(rc)))
		}
		c.blocking = want == 1
		if c.blocking {
			e.blockingComms++
		}
		var hosts, can C.int
		if rc := C.ddp_hosts(c.h, n, &hosts, &can); rc != C.MPI_SUCCESS {
			return c.openFailed(fmt.Errorf("mpi: world rank %d: counting the hosts: %w", e.worldRank, mpiError(int(rc))))
		}
		c.hosts = int(hosts)
		if c.blocking && c.size >= 2 && c.hosts >= 2 && can != 0 {
			var made C.int
			if rc := C.ddp_dup_algorithm(c.h, segmentedRing, C.DDP_SEGMENT, &c.large, &made); rc != C.MPI_SUCCESS {
				if made != 0 {
					C.ddp_free(&c.large)
				}
				return c.openFailed(fmt.Errorf("mpi: world rank %d: MPI_Comm_dup with the segmented ring all-reduce: %w", e.worldRank, mpiError(int(rc))))
			}
			c.hasLarge = made != 0
		}
		if c.blocking && c.size >= 2 && c.hosts == 1 {
			// Every rank must take the same path at every all-reduce:
			// one that opted out opts every rank out.
			want := C.int(1)
			if os.Getenv("DDPGO_MPI_SHM") == "0" || C.ddp_shm_prepare(n) != 0 {
				want = 0
			}
			if rc := C.ddp_allreduce_int(c.h, &want, 1, 0); rc != C.MPI_SUCCESS {
				return c.openFailed(fmt.Errorf("mpi: world rank %d: agreeing on shared memory: %w", e.worldRank, mpiError(int(rc))))
			}
			c.shm = want == 1
		}
		large := ""
		if c.hasLarge {
			large = fmt.Sprintf("segmented ring (%d KiB segments)", C.DDP_SEGMENT>>10)
		}
		rtMu.Lock()
		e.lastHosts, e.lastLarge, e.lastShared = c.hosts, large, c.shm
		rtMu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.comms[c] = struct{}{}
	e.mu.Unlock()
	if o.StallInterval >= 0 || o.Timeout >= 0 {
		c.wdStop, c.wdDone = make(chan struct{}), make(chan struct{})
		go c.watch()
	}
	return c, nil
}

// forcedAllReduce returns the all-reduce algorithm and segment size Open
// MPI would give a communicator created now (0: its own choice), for
// tests: Open sets them only while it makes its second communicator.
func forcedAllReduce() (alg, segsize int, err error) {
	e, err := start()
	if err != nil {
		return 0, 0, err
	}
	err = e.call(func() error {
		var a, s C.int
		C.ddp_forced_allreduce(&a, &s)
		alg, segsize = int(a), int(s)
		return nil
	})
	return alg, segsize, err
}

// openFailed frees what Open made of c and returns err; on the owner.
func (c *communicator) openFailed(err error) error {
	C.ddp_free(&c.h)
	if c.blocking {
		c.e.blockingComms--
	}
	return err
}

// segmentedRing is Open MPI's number for its segmented ring all-reduce
// (coll_tuned_allreduce_algorithm), and largeMin the size from which a
// blocking all-reduce between hosts runs on it, in DDP_SEGMENT pieces.
const (
	segmentedRing = 5
	largeMin      = 1 << 20
)

// Rank returns this rank's index.
func (c *communicator) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *communicator) Size() int { return c.size }

// Capabilities reports what the MPI backend does natively: host memory;
// Avg in the reduction pass for two ranks (an operation that averages its
// two operands), otherwise as a Sum followed by a division; 16-bit sums
// round once per pairwise addition, not once per element.
func (c *communicator) Capabilities() comm.Caps {
	return comm.Caps{Backend: "mpi", HostMemory: true, NativeAvg: c.size == 2}
}

// Blocking reports whether the communicator's collectives are blocking
// MPI calls (see the package documentation).
func (c *communicator) Blocking() bool { return c.blocking }

// AllReduce reduces send over all ranks with op into recv.
func (c *communicator) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindAllReduce, op: op, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	d.err = firstErr(checkBuf("send", send), checkBuf("recv", recv), checkOp(op))
	if d.err == nil {
		switch {
		case recv.Count != send.Count || recv.DType != send.DType:
			d.err = fmt.Errorf("%w: all_reduce: recv is %d x %s, send is %d x %s", comm.ErrInvalid, recv.Count, recv.DType, send.Count, send.DType)
		case comm.Overlap(send, recv):
			d.err = overlapErr("all_reduce", send, recv)
		}
		d.inplace = comm.InPlace(send, recv)
	}
	return c.issue(&d)
}

// Broadcast copies root's buf into buf on every other rank.
func (c *communicator) Broadcast(buf comm.Buffer, root int) comm.Work {
	d := desc{kind: comm.KindBroadcast, dt: buf.DType, count: buf.Count, root: root, send: buf.Addr, recv: buf.Addr}
	d.err = firstErr(checkBuf("buf", buf), c.checkRank("root", root))
	return c.issue(&d)
}

// Reduce reduces send over all ranks with op into recv on root.
func (c *communicator) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	d := desc{kind: comm.KindReduce, op: op, dt: send.DType, count: send.Count, root: root, send: send.Addr}
	d.err = firstErr(checkBuf("send", send), checkOp(op), c.checkRank("root", root))
	if d.err == nil && root == c.rank {
		d.recv = recv.Addr
		d.err = checkBuf("recv", recv)
		switch {
		case d.err != nil:
		case recv.Count != send.Count || recv.DType != send.DType:
			d.err = fmt.Errorf("%w: reduce on root %d: recv is %d x %s, send is %d x %s", comm.ErrInvalid, root, recv.Count, recv.DType, send.Count, send.DType)
		case comm.Overlap(send, recv):
			d.err = overlapErr("reduce", send, recv)
		}
		d.inplace = comm.InPlace(send, recv)
	}
	return c.issue(&d)
}

// AllGather concatenates every rank's send into recv, in rank order.
func (c *communicator) AllGather(send, recv comm.Buffer) comm.Work {
	d := desc{kind: comm.KindAllGather, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	d.err = firstErr(checkBuf("send", send), checkBuf("recv", recv))
	if d.err == nil {
		if recv.Count != c.size*send.Count || recv.DType != send.DType {
			d.err = fmt.Errorf("%w: all_gather over %d ranks: recv is %d x %s, want %d x %s", comm.ErrInvalid, c.size, recv.Count, recv.DType, c.size*send.Count, send.DType)
		} else if send.Count > 0 {
			own := recv.Slice(c.rank*send.Count, send.Count)
			d.inplace = comm.InPlace(send, own)
			if !d.inplace && comm.Overlap(send, recv) || comm.InPlace(send, recv) && c.rank != 0 {
				d.err = fmt.Errorf("%w: all_gather: send [%p, +%d B) overlaps recv [%p, +%d B) other than as rank %d's block", comm.ErrInvalid, send.Addr, send.Bytes(), recv.Addr, recv.Bytes(), c.rank)
			}
		}
	}
	return c.issue(&d)
}

// ReduceScatter reduces send over all ranks with op and leaves this rank's
// block of the result in recv.
func (c *communicator) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindReduceScatter, op: op, dt: recv.DType, count: recv.Count, send: send.Addr, recv: recv.Addr}
	d.err = firstErr(checkBuf("send", send), checkBuf("recv", recv), checkOp(op))
	if d.err == nil {
		if send.Count != c.size*recv.Count || recv.DType != send.DType {
			d.err = fmt.Errorf("%w: reduce_scatter over %d ranks: send is %d x %s, want %d x %s", comm.ErrInvalid, c.size, send.Count, send.DType, c.size*recv.Count, recv.DType)
		} else if recv.Count > 0 {
			own := send.Slice(c.rank*recv.Count, recv.Count)
			d.inplace = comm.InPlace(recv, own)
			if !d.inplace && comm.Overlap(send, recv) || comm.InPlace(send, recv) && c.rank != 0 {
				d.err = fmt.Errorf("%w: reduce_scatter: recv [%p, +%d B) overlaps send [%p, +%d B) other than as rank %d's block", comm.ErrInvalid, recv.Addr, recv.Bytes(), send.Addr, send.Bytes(), c.rank)
			}
		}
	}
	return c.issue(&d)
}

// Send sends buf to rank peer.
func (c *communicator) Send(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindSend, dt: buf.DType, count: buf.Count, root: peer, send: buf.Addr}
	d.err = firstErr(checkBuf("buf", buf), c.checkPeer(peer))
	return c.issue(&d)
}

// Recv receives into buf from rank peer.
func (c *communicator) Recv(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindRecv, dt: buf.DType, count: buf.Count, root: peer, recv: buf.Addr}
	d.err = firstErr(checkBuf("buf", buf), c.checkPeer(peer))
	return c.issue(&d)
}

// Barrier completes once every rank has reached it.
func (c *communicator) Barrier() comm.Work {
	d := desc{kind: comm.KindBarrier}
	return c.issue(&d)
}

// Abort ends the whole job with MPI_Abort, after writing err and this
// rank's identity to standard error. It does not return. MPI can neither
// cancel a posted operation nor stop writing its buffers, so ending the
// process is the only way to keep Abort's promise that no buffer is
// written afterwards.
func (c *communicator) Abort(err error) {
	fmt.Fprintf(os.Stderr, "mpi: rank %d of %d (world rank %d) aborts the job: %v\n", c.rank, c.size, c.e.worldRank, err)
	c.e.abortJob(c.opts.abortCode())
}

// Close fails the operations MPI has not been given yet with
// comm.ErrClosed, waits for those it has (they cannot be cancelled; the
// communicator's Timeout bounds the wait), frees the MPI communicator and
// stops the watchdog. Close is idempotent.
func (c *communicator) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.closing.Store(true)
		select {
		case c.e.q <- ref{c: c}:
		case <-c.e.exit:
			close(c.freed)
		}
	}
	c.mu.Unlock()
	<-c.freed
	if c.wdStop != nil {
		select {
		case <-c.wdStop:
		default:
			close(c.wdStop)
		}
		<-c.wdDone
	}
	return c.closeErr
}

func (c *communicator) issue(d *desc) comm.Work {
	if d.count > math.MaxInt32 && d.err == nil {
		d.err = fmt.Errorf("%w: %s of %d elements: MPI counts are C ints, at most %d", comm.ErrInvalid, d.kind, d.count, math.MaxInt32)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return comm.FailedWork(&comm.OpError{Rank: c.rank, Kind: d.kind, Count: d.count, DType: d.dt, Err: comm.ErrClosed})
	}
	seq := c.issued.Load() + 1
	if seq > ringSize {
		// The slot's previous operation must be complete before reuse;
		// the watchdog's timeout bounds this wait.
		_ = c.WaitOp(context.Background(), seq-ringSize)
	}
	d.seq = seq
	c.ring[seq%ringSize] = *d
	s := &c.slots[seq%ringSize]
	s.issued.Store(now())
	s.kind.Store(uint32(d.kind))
	c.issued.Store(seq)
	c.e.q <- ref{c: c, seq: seq}
	c.mu.Unlock()
	return comm.NewWork(c, seq)
}

// TestOp reports whether operation id has completed, and its error.
func (c *communicator) TestOp(id uint64) (bool, error) {
	if id == 0 || id > c.issued.Load() {
		return true, fmt.Errorf("%w: mpi: rank %d has issued no operation #%d", comm.ErrInvalid, c.rank, id)
	}
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
	return true, c.oldResult(id)
}

// oldResult returns the result of operation id, whose ring slot has been
// reused since it completed.
func (c *communicator) oldResult(id uint64) error {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	i, found := slices.BinarySearchFunc(c.fails, id, func(f failure, id uint64) int { return cmp.Compare(f.seq, id) })
	switch {
	case found:
		return c.fails[i].err
	case id <= c.forgotten:
		return fmt.Errorf("%w: mpi: rank %d: operation #%d completed more than %d failures ago; its result is no longer kept", comm.ErrInvalid, c.rank, id, failLogMax/2)
	}
	return nil
}

// WaitOp waits until operation id has completed or ctx is done.
func (c *communicator) WaitOp(ctx context.Context, id uint64) error {
	if done, err := c.TestOp(id); done {
		return err
	}
	// Park without spinning: the owner, just readied by the issue, then
	// runs on this processor at once (see engine.loop).
	ch := c.addWaiter()
	defer c.dropWaiter(ch)
	done := ctx.Done()
	for {
		if ok, err := c.TestOp(id); ok {
			return err
		}
		if done == nil {
			<-ch
			continue
		}
		select {
		case <-ch:
		case <-done:
			s := &c.slots[id%ringSize]
			waited := time.Duration(now() - s.issued.Load())
			return fmt.Errorf("mpi: rank %d: waited %v for %s #%d, which is still in flight (its buffers stay in use): %w",
				c.rank, waited.Round(time.Millisecond), comm.Kind(s.kind.Load()), id, context.Cause(ctx))
		}
	}
}

// complete records the result of operation seq and wakes its waiters. It
// runs on the owner goroutine.
func (c *communicator) complete(seq uint64, err error) {
	s := &c.slots[seq%ringSize]
	s.done.Store(seq | writing)
	if err != nil {
		e := err
		s.err.Store(&e)
		c.logFailure(seq, err)
	} else {
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

func (c *communicator) logFailure(seq uint64, err error) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	if len(c.fails) == failLogMax {
		c.forgotten = c.fails[failLogMax/2-1].seq
		c.fails = c.fails[:copy(c.fails, c.fails[failLogMax/2:])]
	}
	c.fails = append(c.fails, failure{seq, err})
}

func (c *communicator) addWaiter() chan struct{} {
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

func (c *communicator) dropWaiter(ch chan struct{}) {
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

// watch is the communicator's watchdog: it reports the oldest incomplete
// operation on comm.Watchdog's schedule and ends the job at the timeout.
// MPI cannot say which ranks an operation waits for, so the reports'
// Missing is nil.
func (c *communicator) watch() {
	defer close(c.wdDone)
	dog, stalls, deadline := c.opts.watchdog()
	tick := time.Second
	if stalls {
		tick = min(tick, max(dog.StallInterval/4, time.Millisecond))
	}
	if deadline {
		tick = min(tick, max(dog.Timeout/4, time.Millisecond))
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	low, watched := uint64(1), uint64(0)
	var w comm.Watch
	for {
		select {
		case <-c.wdStop:
			return
		case <-t.C:
		}
		issued := c.issued.Load()
		for low <= issued {
			if done, _ := c.TestOp(low); !done {
				break
			}
			low++
		}
		if low > issued {
			continue
		}
		s := &c.slots[low%ringSize]
		at, kind := s.issued.Load(), comm.Kind(s.kind.Load())
		if done, _ := c.TestOp(low); done {
			continue
		}
		if watched != low {
			watched, w = low, dog.Start(epoch.Add(time.Duration(at)))
		}
		n := time.Now()
		report, expired := w.Check(n)
		st := comm.Stall{Rank: c.rank, Seq: low, Kind: kind, Waited: w.Waited(n)}
		if deadline && expired {
			fmt.Fprintf(os.Stderr, "mpi: %v (Options.Timeout %v): ending the job with MPI_Abort, since MPI cannot cancel the operation\n",
				st.TimeoutError(), dog.Timeout)
			c.e.abortJob(c.opts.abortCode())
		}
		if stalls && report {
			dog.Report(st)
		}
	}
}

func (c *communicator) opErr(d *desc, err error) error {
	return &comm.OpError{Rank: c.rank, Seq: d.seq, Kind: d.kind, Count: d.count, DType: d.dt, Err: err}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func checkBuf(name string, b comm.Buffer) error {
	switch {
	case !b.DType.Valid():
		return fmt.Errorf("%w: %s has dtype %s", comm.ErrInvalid, name, b.DType)
	case b.Loc != comm.Host:
		return fmt.Errorf("%w: %s is device memory; the mpi backend carries host buffers only", comm.ErrInvalid, name)
	case b.Count < 0:
		return fmt.Errorf("%w: %s has count %d", comm.ErrInvalid, name, b.Count)
	case b.Count > 0 && b.Addr == nil:
		return fmt.Errorf("%w: %s has count %d and a nil address", comm.ErrInvalid, name, b.Count)
	case b.Count > math.MaxInt32:
		return fmt.Errorf("%w: %s has %d elements; MPI counts are C ints, at most %d", comm.ErrInvalid, name, b.Count, math.MaxInt32)
	}
	return nil
}

func checkOp(op comm.Op) error {
	if !op.Valid() {
		return fmt.Errorf("%w: reduction op %s", comm.ErrInvalid, op)
	}
	return nil
}

func overlapErr(op string, send, recv comm.Buffer) error {
	return fmt.Errorf("%w: %s: send [%p, +%d B) and recv [%p, +%d B) overlap without being the same buffer", comm.ErrInvalid, op, send.Addr, send.Bytes(), recv.Addr, recv.Bytes())
}

func (c *communicator) checkRank(name string, r int) error {
	if r < 0 || r >= c.size {
		return fmt.Errorf("%w: %s %d out of range for %d ranks", comm.ErrInvalid, name, r, c.size)
	}
	return nil
}

func (c *communicator) checkPeer(p int) error {
	if err := c.checkRank("peer", p); err != nil {
		return err
	}
	if p == c.rank {
		return fmt.Errorf("%w: peer %d is the rank itself", comm.ErrInvalid, p)
	}
	return nil
}

func dtypeSize(dt comm.DType) int { return dt.Size() }

func errClosed() error   { return comm.ErrClosed }
func errAborted() error  { return comm.ErrAborted }
func errMismatch() error { return comm.ErrMismatch }

var (
	_ comm.Communicator = (*communicator)(nil)
	_ comm.Capable      = (*communicator)(nil)
)
