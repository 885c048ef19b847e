//go:build mpi && cgo

package mpi

/*
#include "ddpmpi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
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

var epoch = time.Now()

func now() int64 { return int64(time.Since(epoch)) }

// communicator is one rank's handle on a duplicate of MPI_COMM_WORLD.
type communicator struct {
	e          *engine
	h          C.MPI_Comm
	rank, size int
	blocking   bool
	counted    bool // the process's one communicator in blocking mode (not a level of a hierarchy)
	hosts      int  // the hosts the ranks run on
	// level names a level of a hierarchical communicator ("host",
	// "cross-host"), whose ranks are job ranks job[0], job[1]...: its
	// stall reports and errors name the job's ranks. Empty and nil for
	// a communicator over the world.
	level string
	job   []int
	// large, where hasLarge, is a second duplicate of MPI_COMM_WORLD
	// whose all-reduce is the segmented ring, for blocking all-reduces of
	// at least largeMin bytes between hosts (see the package
	// documentation).
	large    C.MPI_Comm
	hasLarge bool
	largeOps atomic.Uint64 // operations run on large, for tests
	// shm: blocking, and every rank on one machine: all-reduces run in
	// shared memory, on the engine (package comm/shm, through hs; see
	// shm.go), staged below directMin bytes and in place in the buffers
	// from HostSource from there.
	shm       bool
	hs        *hostShm
	ctlMu     sync.Mutex // orders closing hs after the goroutines that may touch it at any time (Abort, reports)
	directMin int
	inl       atomic.Uint64 // the inline all-reduce: sequence number<<2 | inlPosted or inlClaimed
	running   atomic.Uint64 // the operation the owner runs in shared memory now (0: none)
	shmOps    atomic.Uint64 // all-reduces run in shared memory in place (direct), for tests
	stagedOps atomic.Uint64 // all-reduces staged in shared memory, for tests
	engineOps atomic.Uint64 // other collectives run in shared memory, staged or direct, for tests
	opts      Options

	mu      sync.Mutex // serialises issuing
	closed  bool
	closing atomic.Bool

	// ops is the ring of operations: descriptors written by the issuer
	// and then read by the owner, results, failure log and waiters
	// (package backend); stamps say when each was issued, and what it is,
	// for stall reports and failed waits.
	ops    backend.Ring[desc]
	stamps [backend.RingSize]stamp
	rules  backend.Rules // the comm contract, host memory, counts that fit MPI's C ints

	// owner-only
	received, started     uint64 // the last operation taken from the queue, and given to MPI (or failed)
	posted                int    // operations given to MPI and not yet finished (0 or 1)
	closeMarked, released bool

	failed atomic.Pointer[error] // the first MPI error, or a peer's failure; the communicator is unusable after it

	freed    chan struct{} // closed once the MPI communicator is freed
	closeErr error         // set before freed is closed

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
	inline  bool   // a staged all-reduce posted by the issuing goroutine
	k       uint64 // its collective number on the segment, once posted there
	err     error  // an argument error: the operation fails without reaching MPI
	scratch allocator.Block
}

// stamp says when the operation in a ring slot was issued, and its kind.
type stamp struct {
	issued atomic.Int64  // ns since epoch
	kind   atomic.Uint32 // comm.Kind
}

// Rank returns this rank's index.
func (c *communicator) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *communicator) Size() int { return c.size }

// Capabilities reports what the MPI backend does natively: host memory;
// Avg in the reduction pass for two ranks (an operation that averages its
// two operands), otherwise, where MPI carries it, as a Sum followed by a
// division; there, 16-bit sums round once per pairwise addition, not once
// per element (all-reduces in shared memory reduce as inproc does).
func (c *communicator) Capabilities() comm.Caps {
	return comm.Caps{Backend: "mpi", HostMemory: true, NativeAvg: c.size == 2}
}

// Blocking reports whether the communicator's collectives are blocking
// MPI calls (see the package documentation).
func (c *communicator) Blocking() bool { return c.blocking }

// AllReduce reduces send over all ranks with op into recv.
func (c *communicator) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindAllReduce, op: op, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	d.err = c.check(comm.Call{Kind: d.kind, Op: op, DType: d.dt, Count: d.count}, send, recv)
	d.inplace = comm.InPlace(send, recv)
	return c.issue(&d)
}

// Broadcast copies root's buf into buf on every other rank.
func (c *communicator) Broadcast(buf comm.Buffer, root int) comm.Work {
	d := desc{kind: comm.KindBroadcast, dt: buf.DType, count: buf.Count, root: root, send: buf.Addr, recv: buf.Addr}
	d.err = c.check(comm.Call{Kind: d.kind, DType: d.dt, Count: d.count, Root: root}, buf, buf)
	return c.issue(&d)
}

// Reduce reduces send over all ranks with op into recv on root.
func (c *communicator) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	d := desc{kind: comm.KindReduce, op: op, dt: send.DType, count: send.Count, root: root, send: send.Addr}
	d.err = c.check(comm.Call{Kind: d.kind, Op: op, DType: d.dt, Count: d.count, Root: root}, send, recv)
	if root == c.rank {
		d.recv = recv.Addr
		d.inplace = comm.InPlace(send, recv)
	}
	return c.issue(&d)
}

// AllGather concatenates every rank's send into recv, in rank order.
func (c *communicator) AllGather(send, recv comm.Buffer) comm.Work {
	d := desc{kind: comm.KindAllGather, dt: send.DType, count: send.Count, send: send.Addr, recv: recv.Addr}
	d.err = c.check(comm.Call{Kind: d.kind, DType: d.dt, Count: d.count}, send, recv)
	d.inplace = send.Count > 0 && backend.OwnBlock(send, recv, c.rank)
	return c.issue(&d)
}

// ReduceScatter reduces send over all ranks with op and leaves this rank's
// block of the result in recv.
func (c *communicator) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	d := desc{kind: comm.KindReduceScatter, op: op, dt: recv.DType, count: recv.Count, send: send.Addr, recv: recv.Addr}
	d.err = c.check(comm.Call{Kind: d.kind, Op: op, DType: d.dt, Count: d.count}, send, recv)
	d.inplace = recv.Count > 0 && backend.OwnBlock(recv, send, c.rank)
	return c.issue(&d)
}

// Send sends buf to rank peer.
func (c *communicator) Send(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindSend, dt: buf.DType, count: buf.Count, root: peer, send: buf.Addr}
	d.err = c.check(comm.Call{Kind: d.kind, DType: d.dt, Count: d.count, Root: peer}, buf, buf)
	return c.issue(&d)
}

// Recv receives into buf from rank peer.
func (c *communicator) Recv(buf comm.Buffer, peer int) comm.Work {
	d := desc{kind: comm.KindRecv, dt: buf.DType, count: buf.Count, root: peer, recv: buf.Addr}
	d.err = c.check(comm.Call{Kind: d.kind, DType: d.dt, Count: d.count, Root: peer}, buf, buf)
	return c.issue(&d)
}

// check returns the error of a call invalid for this rank, or nil: the
// comm contract, host memory only, and counts that fit MPI's C ints.
func (c *communicator) check(call comm.Call, send, recv comm.Buffer) error {
	return c.rules.Check(&call, &send, &recv).Err(call, c.size)
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
	c.e.abortJob(c.opts.abortCode(), err.Error())
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
	// A staged all-reduce issued while nothing else of the communicator
	// is pending is posted here, with no hand-off to the owner (see
	// staged.go); the owner skips it. If the post finishes it (every
	// peer had posted it) and it succeeded, it is published complete
	// (Ring.PublishDone): its number, and no descriptor, no stamp for the
	// watchdog, no completion to wake anyone, a Wait that finds it done.
	// idle comes before failed: an operation that fails sets failed
	// before it completes, so a communicator found idle shows every
	// failure of its operations.
	end, err := stagedPending, error(nil)
	if d.inline = c.staged(d) && c.idle() && c.failed.Load() == nil; d.inline {
		if end, err = c.post(d); end == stagedOK {
			c.stagedDone(d)
			seq := c.ops.Reserve(c) // free: every earlier operation is complete
			c.ops.PublishDone(seq)  // the owner, walking past it, sees it has Ended
			c.mu.Unlock()
			return comm.NewWork(c, seq)
		}
	}
	// The watchdog's timeout bounds Reserve's wait for the slot.
	seq := c.ops.Reserve(c)
	d.seq = seq
	*c.ops.Op(seq) = *d
	s := &c.stamps[seq%backend.RingSize]
	s.issued.Store(now())
	s.kind.Store(uint32(d.kind))
	c.ops.Publish(seq)
	if d.inline {
		// Posted before it is offered: a Test on another goroutine (the
		// watchdog's) may claim and finish it as soon as it is. A post
		// that failed it completes it here, and offers nothing.
		if end != stagedPending {
			c.finishStaged(seq, d, end, err)
		} else {
			c.inl.Store(seq<<2 | inlPosted)
		}
		c.mu.Unlock()
		return comm.NewWork(c, seq)
	}
	c.e.q <- ref{c: c, seq: seq}
	c.mu.Unlock()
	return comm.NewWork(c, seq)
}

// fail makes c unusable after err, the first failure wins.
func (c *communicator) fail(err error) {
	c.failed.CompareAndSwap(nil, &err)
}

// TestOp reports whether operation id has completed, and its error.
func (c *communicator) TestOp(id uint64) (bool, error) { return c.ops.Test(id) }

// WaitOp waits until operation id has completed or ctx is done. A staged
// all-reduce posted inline is finished by the waiter itself.
func (c *communicator) WaitOp(ctx context.Context, id uint64) error {
	if c.inl.Load()>>2 == id {
		if done, err := c.waitInline(ctx, id); done {
			return err
		}
	}
	return c.ops.Wait(ctx, id)
}

// ringHooks is how the communicator takes part in its ring's Test and
// Wait (see backend.Config).
type ringHooks communicator

// Advance finishes an inline all-reduce whose peers have all posted.
func (h *ringHooks) Advance(id uint64) { (*communicator)(h).advance(id) }

// WaitError says how long a Wait waited for operation id, and what it is.
func (h *ringHooks) WaitError(id uint64, cause error) error {
	c := (*communicator)(h)
	ranks, detail := []int(nil), ""
	if c.running.Load() == id {
		ranks, detail = c.missing()
	}
	if ranks == nil {
		detail = "MPI cannot tell which ranks have not joined it: " + mayHaveClosed
	}
	return c.waitError(id, cause, detail)
}

// waitError is the error of a Wait for operation id that cause ended;
// detail, if any, says who it waits for.
func (c *communicator) waitError(id uint64, cause error, detail string) error {
	s := &c.stamps[id%backend.RingSize]
	waited := time.Duration(now() - s.issued.Load())
	if detail != "" {
		detail += ": "
	}
	return fmt.Errorf("mpi: rank %d: waited %v for %s #%d, which is still in flight (its buffers stay in use): %s%w",
		c.rank, waited.Round(time.Millisecond), comm.Kind(s.kind.Load()), id, detail, cause)
}

// watch is the communicator's watchdog: it reports the oldest incomplete
// operation on comm.Watchdog's schedule and ends the job at the timeout.
// MPI cannot say which ranks an operation waits for, so the reports'
// Missing is nil, but for an all-reduce in shared memory (see shmWait). A
// tick that comes far late says that this process did not run (stopped,
// as mpirun's teardown continues a stopped rank before it ends it): the
// reports of a wait that the pause fell in say so. opened is when Open
// started it.
func (c *communicator) watch(opened time.Time) {
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
	o := backend.Oldest{Dog: dog}
	var kind comm.Kind
	test := func(seq uint64) bool { done, _ := c.TestOp(seq); return done }
	at := func(seq uint64) time.Time {
		s := &c.stamps[seq%backend.RingSize]
		kind = comm.Kind(s.kind.Load())
		return epoch.Add(time.Duration(s.issued.Load()))
	}
	var paused pause
	paused.tick(opened, tick) // a goroutine not yet run when the process stopped counts it too
	for {
		select {
		case <-c.wdStop:
			return
		case <-t.C:
		}
		paused.tick(time.Now(), tick)
		due, ok := o.Check(c.ops.Issued(), test, at, time.Now())
		if !ok {
			continue
		}
		low, report, expired, issuedAt := due.Seq, due.Report, due.Expired, due.Issued
		st := comm.Stall{Rank: c.jobRank(c.rank), Seq: low, Kind: kind, Waited: due.Waited}
		if c.running.Load() == low || c.inl.Load()>>2 == low {
			// An all-reduce in shared memory knows who it waits for.
			st.Missing, st.Detail = c.missing()
		}
		if st.Missing == nil {
			st.Detail = mayHaveClosed
		}
		st.Detail = joinClauses(c.levelClause(), st.Detail, paused.since(issuedAt))
		if deadline && expired {
			fmt.Fprintf(os.Stderr, "mpi: %v (Options.Timeout %v): ending the job with MPI_Abort, since MPI cannot cancel the operation\n",
				st.TimeoutError(), dog.Timeout)
			c.e.abortJob(c.opts.abortCode(), st.TimeoutError().Error())
		}
		if stalls && report {
			dog.Report(st)
		}
	}
}

func (c *communicator) opErr(d *desc, err error) error {
	return &comm.OpError{Rank: c.jobRank(c.rank), Seq: d.seq, Kind: d.kind, Count: d.count, DType: d.dt, Err: err}
}

// jobRank is the job's rank of c's rank r: r itself over the world, the
// rank's place in the job on a level of a hierarchy.
func (c *communicator) jobRank(r int) int {
	if c.job == nil {
		return r
	}
	return c.job[r]
}

// levelClause says, in a level's stall reports, which level waits and
// which of the job's ranks it spans; "" over the world.
func (c *communicator) levelClause() string {
	if c.level == "" {
		return ""
	}
	return fmt.Sprintf("in the %s level of a hierarchical communicator, over job ranks %v", c.level, c.job)
}

func dtypeSize(dt comm.DType) int { return dt.Size() }

func errClosed() error   { return comm.ErrClosed }
func errAborted() error  { return comm.ErrAborted }
func errMismatch() error { return comm.ErrMismatch }

var (
	_ comm.Communicator = (*communicator)(nil)
	_ comm.Capable      = (*communicator)(nil)
	_ comm.Waiter       = (*communicator)(nil)
)
