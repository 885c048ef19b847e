//go:build mpi && cgo

package mpi

/*
#include "ddpmpi.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// engine is the owner goroutine and what it owns. The owner makes every
// MPI call of the process but two: MPI_Init_thread and MPI_Finalize run on
// the MPI main thread, a goroutine locked to its OS thread for MPI's whole
// life, because the standard asks that the thread which initialised MPI
// be the one that finalizes it. The owner itself is not locked to a
// thread (MPI_THREAD_SERIALIZED allows any thread, one at a time): see the
// package documentation for the measurement behind that.
type engine struct {
	q        chan ref        // operations, close markers and calls, in issue order
	exit     chan struct{}   // closed when the owner goroutine has returned
	main     chan func()     // calls to run on the MPI main thread
	mainExit chan struct{}   // closed when the main thread's goroutine has returned
	stop     bool            // owner-only: return once idle
	pool     *allocator.Pool // scratch of operations whose communicator has none
	poolOnce sync.Once

	provided, worldRank, worldSize, tcpFlags int
	tcpEager                                 int64

	// the last Open's hosts and the algorithm of its large all-reduces
	// ("": Open MPI's choice), for LibraryInfo; under rtMu
	lastHosts                         int
	lastLarge                         string
	lastShared                        bool
	lastHier                          string // the ranks per host of the last hierarchical Open ("": flat)
	lastChunk                         int    // its pipeline chunk
	shmFailure                        string // why an all-reduce could not map a peer's memory, once one could not
	ours, mallocTuned, tcpTuned, f16c bool

	abortCode atomic.Int32 // non-zero: end the job with this code

	// owner-only: the non-blocking requests in flight, by slot
	slots   [C.DDP_MAXREQ]ref
	free    []int32
	hi      int // slots [hi, DDP_MAXREQ) are free
	nactive int
	polls   uint64
	// owner-only: open communicators in blocking mode (at most one)
	blockingComms int

	mu    sync.Mutex
	comms map[*communicator]struct{} // open communicators
}

// ref is an item of the owner's queue: operation seq of communicator c,
// c's close marker (seq 0), a call to run (fn), or, all zero, a wake-up.
type ref struct {
	c   *communicator
	seq uint64
	fn  func()
}

// abortGrace is how long Abort waits for the owner to call MPI_Abort
// itself before calling it from the aborting goroutine (the owner may be
// inside a blocking collective that a stalled peer never joins).
const abortGrace = 200 * time.Millisecond

// abortExit is how long the process waits for MPI_Abort to end it before
// it exits by itself.
const abortExit = 5 * time.Second

// call runs f on the owner and returns its error.
func (e *engine) call(f func() error) error {
	errc := make(chan error, 1)
	select {
	case e.q <- ref{fn: func() { errc <- f() }}:
	case <-e.exit:
		return ErrFinalized
	}
	select {
	case err := <-errc:
		return err
	case <-e.exit:
		return ErrFinalized
	}
}

// loop is the owner goroutine.
func (e *engine) loop() {
	defer close(e.exit)
	for {
		if code := e.abortCode.Load(); code != 0 {
			C.ddp_abort_job(C.int(code))
		}
		if e.stop && e.nactive == 0 {
			return
		}
		if e.nactive < C.DDP_MAXREQ {
			select {
			case r := <-e.q:
				e.take(r)
				continue
			default:
			}
		}
		if e.nactive > 0 {
			e.test()
			continue
		}
		// Park at once: the goroutine that issues next then finds the
		// owner runnable on its own processor and runs it without an
		// operating-system wake-up, and a rank that waits leaves the CPU
		// to its peers on a machine with fewer cores than ranks.
		e.take(<-e.q)
	}
}

// take handles an item of the queue. An operation is started at once if
// its communicator has none in flight, and otherwise when the one in
// flight completes: MPI starts a communicator's non-blocking collectives
// in order but may run them at the same time, and the contract wants
// them run in issue order (stream semantics), as a chain of dependent
// collectives needs.
func (e *engine) take(r ref) {
	c := r.c
	switch {
	case r.fn != nil:
		r.fn()
		return
	case c == nil:
		return // a wake-up
	case r.seq == 0:
		c.closeMarked = true
		// Inline all-reduces were never queued: the owner finishes those
		// still pending before it frees the communicator.
		c.received = max(c.received, c.ops.Issued())
	default:
		c.received = r.seq
	}
	e.pump(c)
}

// pump starts c's next operations while none is in flight, and frees c
// once it is closed and idle.
func (e *engine) pump(c *communicator) {
	for c.posted == 0 && c.started < c.received {
		c.started++
		e.start(c, c.started)
	}
	if c.closeMarked && c.posted == 0 && c.started == c.received {
		e.release(c)
	}
}

// start gives operation seq of c to MPI, or completes it at once when it
// cannot run.
func (e *engine) start(c *communicator, seq uint64) {
	if c.ops.Ended(seq) {
		// Completed already (at its issue, or inline by a Test or Wait):
		// nothing to run, and its slot may hold a later operation, whose
		// descriptor the issuer may be writing.
		return
	}
	d := c.ops.Op(seq)
	switch {
	case d.seq != seq:
		return // an inline all-reduce completed since the check above, its slot reused
	case d.inline:
		e.takeOver(c, seq)
		return
	case d.err != nil:
		c.ops.Complete(seq, c.opErr(d, d.err))
		return
	case c.closing.Load():
		c.ops.Complete(seq, c.opErr(d, fmt.Errorf("%w: closed before MPI was given the operation", errClosed())))
		return
	case c.failed.Load() != nil:
		c.ops.Complete(seq, c.opErr(d, fmt.Errorf("%w: the communicator is unusable after an earlier failure: %w", errAborted(), *c.failed.Load())))
		return
	case c.staged(d):
		e.runStaged(c, seq, d)
		return
	}
	if c.hs != nil && onEngine(d.kind) {
		// In place in the ranks' buffers, where they are all shared.
		c.running.Store(seq)
		taken, err := c.direct(d)
		c.running.Store(0)
		if taken {
			switch {
			case err != nil:
			case d.kind == kindAllReduce:
				c.shmOps.Add(1)
			default:
				c.engineOps.Add(1)
			}
			c.ops.Complete(seq, err)
			return
		}
	}
	send, recv := d.send, d.recv
	if d.kind == kindReduceScatter && d.inplace {
		b, err := e.scratch(c, d.count*dtypeSize(d.dt))
		if err != nil {
			c.ops.Complete(seq, c.opErr(d, err))
			return
		}
		d.scratch = b
		recv = b.Addr()
	}
	blocking := c.blocking && d.kind != kindSend && d.kind != kindRecv
	slot := -1
	if !blocking {
		slot = e.allocSlot()
	}
	inplace := 0
	if d.inplace && d.kind != kindReduceScatter {
		inplace = 1
	}
	c.posted++
	op := C.int(d.op)
	if pairAvg(c, d) {
		op = C.DDP_AVG2
	}
	h := c.h
	if c.hasLarge && blocking && onLarge(c, d) {
		h = c.large
		c.largeOps.Add(1)
	}
	rc := C.ddp_start(h, boolInt(blocking), C.int(max(slot, 0)), C.int(d.kind), op, C.int(d.dt),
		C.int(d.count), C.uintptr_t(uintptr(send)), C.uintptr_t(uintptr(recv)), C.int(d.root), C.int(inplace))
	if blocking || rc != C.MPI_SUCCESS {
		if slot >= 0 {
			e.freeSlot(slot)
		}
		e.finish(c, seq, int(rc), -1)
		return
	}
	e.slots[slot] = ref{c: c, seq: seq}
}

// test progresses the requests in flight and finishes those that
// completed.
func (e *engine) test() {
	n := C.ddp_testsome(C.int(e.hi))
	if rc := C.ddp_test_rc; rc != C.MPI_SUCCESS {
		// MPI could not say which requests completed: fail them all.
		// Their buffers may still be written, so every communicator with
		// one is unusable, and the caller's only safe move is Abort.
		for s := range e.hi {
			if r := e.slots[s]; r.c != nil {
				e.freeSlot(s)
				e.finish(r.c, r.seq, int(rc), -1)
				e.pump(r.c)
			}
		}
		return
	}
	for i := range int(n) {
		s := int(C.ddp_done[i])
		r := e.slots[s]
		e.freeSlot(s)
		e.finish(r.c, r.seq, int(C.ddp_errs[i]), int(C.ddp_got[i]))
		e.pump(r.c)
	}
	e.polls++
	if n > 0 || e.polls%64 == 0 {
		// Let the waiters just woken, and other goroutines, run on this
		// processor: the owner polls without ever blocking while requests
		// are in flight.
		runtime.Gosched()
	}
}

// finish completes operation seq of c after MPI returned rc (and, for a
// receive, got elements).
func (e *engine) finish(c *communicator, seq uint64, rc, got int) {
	d := c.ops.Op(seq)
	c.posted--
	var err error
	switch {
	case rc != C.MPI_SUCCESS:
		err = c.opErr(d, mpiError(rc))
		c.fail(err)
	case d.kind == kindRecv && got != d.count:
		err = c.opErr(d, fmt.Errorf("%w: rank %d received %d elements from rank %d, which posted a receive of %d", errMismatch(), c.rank, got, d.root, d.count))
	default:
		e.after(c, d)
	}
	if d.scratch.Size() > 0 {
		e.putScratch(c, d.scratch)
		d.scratch = allocator.Block{}
	}
	c.ops.Complete(seq, err)
}

// after does what is left once MPI has completed d: Avg's division, and
// the copy of an in-place ReduceScatter's result out of its scratch.
func (e *engine) after(c *communicator, d *desc) {
	out := d.recv
	switch d.kind {
	case kindAllReduce:
	case kindReduce:
		if d.root != c.rank {
			return
		}
		if d.inplace {
			out = d.send
		}
	case kindReduceScatter:
		if d.inplace {
			copyBytes(d.recv, d.scratch.Addr(), d.count*dtypeSize(d.dt))
		}
	default:
		return
	}
	if d.op == opAvg && c.size > 1 && d.count > 0 && !pairAvg(c, d) {
		C.ddp_scale(C.int(d.dt), C.uintptr_t(uintptr(out)), C.int(d.count), C.int(c.size))
	}
}

// opName names a reduction as the C side numbers it (DDP_AVG2 is Avg).
func opName(op C.int) comm.Op {
	if op == C.DDP_AVG2 {
		return opAvg
	}
	return comm.Op(op)
}

// pairAvg reports whether d is an average of floating-point values over
// two ranks, which MPI computes in its reduction pass with an operation
// that averages its two operands (DDP_AVG2), with no pass of its own
// afterwards: a whole read and write of the buffer saved.
func pairAvg(c *communicator, d *desc) bool {
	return d.op == opAvg && c.size == 2 && d.dt.IsFloat()
}

// release frees c's MPI communicator once it has nothing in flight.
func (e *engine) release(c *communicator) {
	if !c.released {
		c.released = true
		if c.counted {
			e.blockingComms--
		}
		if rc := C.ddp_free(&c.h); rc != C.MPI_SUCCESS {
			c.closeErr = fmt.Errorf("mpi: rank %d: MPI_Comm_free: %w", c.rank, mpiError(int(rc)))
		}
		if c.hs != nil {
			c.ctlMu.Lock()
			hs := c.hs
			c.hs = nil
			// The mark outlives this mapping in the peers' ones: a peer
			// that waits for this rank learns why it never comes.
			hs.seg.MarkClosed(c.rank)
			hs.maps.Close()
			hs.seg.Close()
			c.ctlMu.Unlock()
		}
		if c.hasLarge {
			c.hasLarge = false
			if rc := C.ddp_free(&c.large); rc != C.MPI_SUCCESS && c.closeErr == nil {
				c.closeErr = fmt.Errorf("mpi: rank %d: MPI_Comm_free: %w", c.rank, mpiError(int(rc)))
			}
		}
		e.mu.Lock()
		delete(e.comms, c)
		e.mu.Unlock()
		close(c.freed)
	}
}

func (e *engine) allocSlot() int {
	e.nactive++
	if n := len(e.free); n > 0 {
		s := e.free[n-1]
		e.free = e.free[:n-1]
		return int(s)
	}
	e.hi++
	return e.hi - 1
}

func (e *engine) freeSlot(s int) {
	e.slots[s] = ref{}
	e.nactive--
	if s == e.hi-1 {
		e.hi--
		// Drop free slots now at the top, so Testsome scans only [0, hi).
		for e.hi > 0 && e.slots[e.hi-1].c == nil && e.dropFree(e.hi-1) {
			e.hi--
		}
		return
	}
	e.free = append(e.free, int32(s))
}

// dropFree removes s from the free list, reporting whether it was there.
func (e *engine) dropFree(s int) bool {
	for i, f := range e.free {
		if int(f) == s {
			e.free[i] = e.free[len(e.free)-1]
			e.free = e.free[:len(e.free)-1]
			return true
		}
	}
	return false
}

// scratch returns n bytes of pool memory for an operation of c.
func (e *engine) scratch(c *communicator, n int) (allocator.Block, error) {
	p := c.opts.Pool
	if p == nil {
		e.poolOnce.Do(func() {
			p, err := allocator.New(allocator.Options{})
			if err == nil {
				e.pool = p
			}
		})
		if p = e.pool; p == nil {
			return allocator.Block{}, fmt.Errorf("mpi: no scratch pool")
		}
	}
	b, err := p.Get(n)
	if err != nil {
		return b, fmt.Errorf("mpi: scratch for an in-place reduce_scatter: %w", err)
	}
	return b, nil
}

func (e *engine) putScratch(c *communicator, b allocator.Block) {
	p := c.opts.Pool
	if p == nil {
		p = e.pool
	}
	_ = p.Put(b)
}

// abortJob ends the job with MPI_Abort: through the owner thread if it
// answers within abortGrace, else from this thread. It does not return.
// The peers waiting for this rank in shared memory learn the cause first.
func (e *engine) abortJob(code int, cause string) {
	if e.abortCode.CompareAndSwap(0, int32(code)) {
		e.flagAbort(cause)
		// MPI_Abort asks the runtime (mpirun and its daemons) to end the
		// job, and can block for good when the runtime is out of reach:
		// a host whose network is cut. The process then ends itself, and
		// the runtime, seeing a rank gone without MPI_Finalize, ends the
		// others.
		go func() {
			time.Sleep(abortExit)
			fmt.Fprintf(os.Stderr, "mpi: world rank %d: MPI_Abort has not ended the job after %v (is mpirun out of reach?): exiting with code %d\n",
				e.worldRank, abortExit, code)
			os.Exit(code)
		}()
	}
	select {
	case e.q <- ref{}: // wakes a parked owner; a busy one sees abortCode
	default:
	}
	select {
	case <-e.exit:
		// The owner is gone (Finalize); MPI is no more.
		os.Exit(code)
	case <-time.After(abortGrace):
	}
	C.ddp_abort_job(C.int(code))
}

// copyBytes copies n bytes between buffers that do not overlap, in pieces
// the scheduler can preempt between.
func copyBytes(dst, src unsafe.Pointer, n int) {
	const piece = 1 << 20
	for off := 0; off < n; off += piece {
		k := min(piece, n-off)
		copy(unsafe.Slice((*byte)(unsafe.Add(dst, off)), k), unsafe.Slice((*byte)(unsafe.Add(src, off)), k))
	}
}

// onLarge reports whether blocking operation d of c, whose ranks span
// hosts, runs on c.large: an all-reduce of largeMin bytes and more (the
// segmented ring), or a reduce-scatter whose input (every rank's block)
// is (recursive halving).
func onLarge(c *communicator, d *desc) bool {
	switch d.kind {
	case kindAllReduce:
		return d.count*dtypeSize(d.dt) >= largeMin
	case kindReduceScatter:
		return d.count*c.size*dtypeSize(d.dt) >= largeMin
	}
	return false
}
