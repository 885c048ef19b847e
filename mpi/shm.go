//go:build mpi && cgo

package mpi

/*
#include <stdlib.h>
#include "ddpmpi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/shm"
)

// The ranks of a communicator that all run on one machine share memory
// through package comm/shm, the engine inproc runs on too: a segment in a
// memfd that rank 0 creates at Open and the others map through /proc,
// with every rank's header, descriptors and staging buffers; and the
// slabs of the process's shared-memory source (HostSource), which the
// peers map when an all-reduce first meets them. This file is the
// adapter: how the segment is made and shared over MPI at Open, how a
// rank waits (shm.Futex: spin, yield, then sleep on the segment's futex
// word, watching the process waited for), and what the engine's errors
// say in this package's words. staged.go runs the staged all-reduces;
// the owner runs the direct ones (direct, below).

// hostSlabs is the process's shared memory: the HostSource of every
// communicator with a segment.
var hostSlabs shm.Slabs

// hostShm is a communicator's share of the engine.
type hostShm struct {
	seg   *shm.Segment
	ep    *shm.Endpoint
	wait  shm.Futex
	procs []shm.Ident // every rank's process
	// k is the last collective this rank published on seg: written by
	// whoever posts the next all-reduce, which the ring orders after the
	// completion of the one before.
	k uint64
	// owner-only: the peers' slabs mapped here, and whether a rank could
	// not map a peer's buffers (every direct all-reduce then goes to MPI,
	// on every rank alike)
	maps   shm.PeerMaps
	broken bool
	// what this rank waits for, k<<2|phase, from a collective's
	// publication to its end (0: none), and the rank the last wait waited
	// for: for reports from other goroutines
	target atomic.Uint64
	lag    atomic.Int64
}

// streamMin is the Layout.StreamMin of the segments Open makes (0: the
// engine's default); tests and the sweep set it.
var streamMin int

// Test hooks, set through export_test.go.
var (
	failMaps  atomic.Bool  // every mapping of a peer's buffers fails
	exitAfter atomic.Int32 // exit (code 3) in the next direct all-reduce once every rank has reached this phase
)

// openHost makes the segment of a communicator h of size ranks, this one
// rank, all on this machine: rank 0 creates it and broadcasts where it
// lies, the others map it, and every rank learns every rank's process.
// Collective over h, on the owner. It returns nil and why on every rank
// when some rank could not map it; an error only when MPI fails.
func openHost(h C.MPI_Comm, rank, size int) (*hostShm, string, error) {
	l := shm.Layout{Ranks: size, Stage: max(directMin, 64), StreamMin: streamMin}
	var seg *shm.Segment
	// where the segment lies: pid, fd, inode, size, boot id, and 1 if rank
	// 0 made it
	where, free := cInt64s(6)
	defer free()
	why := ""
	if rank == 0 {
		s, f, err := shm.Create(l)
		if err == nil {
			seg = s
			copy(where, []int64{int64(f.Pid), int64(f.Fd), int64(f.Ino), int64(f.Size), int64(f.Boot), 1})
		} else {
			why = fmt.Sprintf("rank 0 could not create the segment: %v", err)
		}
	}
	if rc := C.ddp_start(h, 1, 0, C.int(comm.KindBroadcast), 0, C.int(comm.Int64), C.int(len(where)),
		C.uintptr_t(uintptr(unsafe.Pointer(&where[0]))), C.uintptr_t(uintptr(unsafe.Pointer(&where[0]))), 0, 0); rc != C.MPI_SUCCESS {
		closeSeg(seg)
		return nil, "", fmt.Errorf("broadcasting the segment: %w", mpiError(int(rc)))
	}
	if where[5] == 0 {
		if why == "" {
			why = "rank 0 could not create the segment"
		}
	} else if rank != 0 {
		f := shm.File{Pid: int32(where[0]), Fd: int32(where[1]), Ino: uint64(where[2]), Size: uint64(where[3]), Boot: uint64(where[4])}
		s, err := shm.Open(f, l)
		if err != nil {
			why = fmt.Sprintf("rank %d could not map the segment: %v", rank, err)
		}
		seg = s
	}
	// Every rank's process, and whether it mapped the segment.
	me := shm.Self()
	ok := int64(0)
	if seg != nil {
		ok = 1
	}
	mine, free1 := cInt64s(3)
	defer free1()
	all, free2 := cInt64s(3 * size)
	defer free2()
	copy(mine, []int64{int64(me.Pid), int64(me.Start), ok})
	rc := C.ddp_start(h, 1, 0, C.int(comm.KindAllGather), 0, C.int(comm.Int64), C.int(len(mine)),
		C.uintptr_t(uintptr(unsafe.Pointer(&mine[0]))), C.uintptr_t(uintptr(unsafe.Pointer(&all[0]))), 0, 0)
	if rc != C.MPI_SUCCESS {
		closeSeg(seg)
		return nil, "", fmt.Errorf("gathering the ranks' processes: %w", mpiError(int(rc)))
	}
	procs := make([]shm.Ident, size)
	for r := range size {
		procs[r] = shm.Ident{Pid: int32(all[3*r]), Start: uint64(all[3*r+1])}
		if all[3*r+2] == 0 && why == "" {
			why = fmt.Sprintf("rank %d could not map the segment", r)
		}
	}
	if rank == 0 && seg != nil {
		// Every rank has mapped it (or given up): the file has done its part.
		seg.CloseFile()
	}
	if why != "" {
		closeSeg(seg)
		return nil, why, nil
	}
	spin, yield := waitFor(size)
	hs := &hostShm{seg: seg, ep: seg.Endpoint(rank), procs: procs, wait: shm.Futex{Spin: spin, Yield: yield}}
	hs.lag.Store(-1)
	return hs, "", nil
}

// cInt64s returns n int64s of C memory, for MPI calls that take their
// buffers as addresses: Go memory (a slice the compiler may place on the
// goroutine's stack) can move before the call reads it, when the call's
// own Go wrapper grows the stack.
func cInt64s(n int) ([]int64, func()) {
	p := C.calloc(C.size_t(n), 8)
	if p == nil {
		panic(fmt.Sprintf("mpi: %d bytes of C memory", 8*n))
	}
	return unsafe.Slice((*int64)(p), n), func() { C.free(p) }
}

func closeSeg(s *shm.Segment) {
	if s != nil {
		s.Close()
	}
}

// waitFor is how a wait of the segment polls before it sleeps on the
// futex. Where the ranks fit the machine's online processors, it spins
// for 50 us, long enough to cover a peer that runs (and CPU-bound
// neighbours do not change that: the peer still runs whenever this rank
// does). Where the ranks outnumber them, the rank waited for may need this
// one's processor, which spinning starves, and sleeping at once costs a
// futex wake-up for every rank; so the wait calls sched_yield between
// looks for up to 200 us, which hands the processor to a runnable peer at
// once. Both durations were measured in docs/lab/small-messages.md.
// DDPGO_MPI_SPIN and DDPGO_MPI_YIELD (durations) override the two.
func waitFor(ranks int) (spin, yield time.Duration) {
	// The machine's, not this process's (runtime.NumCPU): mpirun binds
	// each of 2 ranks to a core of its own, and a rank that counted only
	// its own core would sleep in every wait.
	if ranks > onlineCPUs() {
		yield = 200 * time.Microsecond
	} else {
		spin = 50 * time.Microsecond
	}
	return envDuration("DDPGO_MPI_SPIN", spin), envDuration("DDPGO_MPI_YIELD", yield)
}

// onlineCPUs is the number of the machine's online processors, from
// /sys/devices/system/cpu/online ("0-3,6"); runtime.NumCPU where that
// cannot be read.
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if isRange {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || z < a {
			return runtime.NumCPU()
		}
		n += z - a + 1
	}
	return max(n, 1)
}

// envDuration is the duration in environment variable name, or def when it
// is unset or not a duration of zero or more.
func envDuration(name string, def time.Duration) time.Duration {
	if s := os.Getenv(name); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d >= 0 {
			return d
		}
	}
	return def
}

// await waits until every rank has reached phase ph of collective k, the
// deadline passes (zero: none) or a peer fails; spin false skips the
// polling phases (a wait that already polled). The error is the
// engine's: *shm.PeerError or *shm.AbortError.
func (hs *hostShm) await(k uint64, ph shm.Phase, deadline time.Time, spin bool) error {
	f := hs.wait
	if !spin {
		f.Spin, f.Yield = 0, 0
	}
	hs.target.Store(k<<2 | uint64(ph))
	lag, err := f.Wait(hs.ep, k, ph, deadline, hs.procs)
	if lag < len(hs.procs) {
		hs.lag.Store(int64(lag))
	}
	if err != nil && !timedOut(err) && hs.ep.Lagging(k, ph, 0) == len(hs.procs) {
		// The rank waited for reached the phase and then closed, or a
		// rank aborted, between the wait's looks: the phase is reached,
		// as its peers saw, and this rank must not fail what they complete.
		return nil
	}
	return err
}

// timedOut reports whether err is the end of a wait at its deadline.
func timedOut(err error) bool {
	var pe *shm.PeerError
	return errors.As(err, &pe) && pe.Timeout
}

// peerFailure says, in this package's words, why a wait of the segment
// failed: the rank it waited for has exited or closed its communicator,
// or a rank has aborted the job.
func (c *communicator) peerFailure(err error) error {
	var ae *shm.AbortError
	var pe *shm.PeerError
	switch {
	case errors.As(err, &ae):
		return fmt.Errorf("%w: rank %d aborted the job: %s", errAborted(), c.jobRank(ae.Rank), ae.Cause)
	case errors.As(err, &pe) && pe.Closed:
		return fmt.Errorf("%w: rank %d (process %d) has closed its communicator", errAborted(), c.jobRank(pe.Rank), pe.Proc.Pid)
	case errors.As(err, &pe) && pe.State == shm.Gone:
		return fmt.Errorf("%w: rank %d (process %d) has exited", errAborted(), c.jobRank(pe.Rank), pe.Proc.Pid)
	case errors.As(err, &pe):
		// The engine numbers the ranks of this communicator; a level of
		// a hierarchy names the job's.
		job := *pe
		job.Rank = c.jobRank(pe.Rank)
		err = &job
	}
	return fmt.Errorf("mpi: rank %d: the shared-memory wait failed: %w", c.jobRank(c.rank), err)
}

// mismatch is the error of all-reduce d, which the ranks disagree on: the
// engine's verdict, told as this rank's call against the first rank's
// that differs (every rank fails it; the communicator stays usable).
func (c *communicator) mismatch(d *desc, verdict error) error {
	if d.kind != kindAllReduce {
		return c.opErr(d, verdict)
	}
	seg := c.hs.seg
	mine := seg.Call(c.rank, d.k)
	for r := range c.size {
		if p := seg.Call(r, d.k); !p.Matches(mine) {
			return c.opErr(d, fmt.Errorf("%w: rank %d all-reduces %d elements of %s (%s), rank %d %d of %s (%s)",
				errMismatch(), c.jobRank(c.rank), d.count, d.dt, d.op, c.jobRank(r), p.Count, p.DType, p.Op))
		}
	}
	return c.opErr(d, verdict) // the same calls by different paths
}

// peer is rank r of c's segment, and the state of its process.
func (c *communicator) peer(r int) peer {
	hs := c.hs
	p := peer{rank: c.jobRank(r), pid: int(hs.procs[r].Pid)}
	switch {
	case hs.seg.Closed(r):
		p.state = rankClosed
	default:
		switch hs.procs[r].State() {
		case shm.Stopped:
			p.state = rankStopped
		case shm.Gone:
			p.state = rankExited
		}
	}
	return p
}

// laggard says which rank the last wait of the segment waited for, and in
// what state its process is.
func (c *communicator) laggard() string {
	r := int(c.hs.lag.Load())
	if r < 0 {
		return ""
	}
	_, detail := shmWait(c.jobRank(c.rank), []peer{c.peer(r)}, nil)
	return detail
}

// missing says for whom this rank waits in the shared-memory all-reduce
// it now waits for (see shmWait); nil ranks if it waits for none.
func (c *communicator) missing() ([]int, string) {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	hs := c.hs
	if hs == nil {
		return nil, ""
	}
	t := hs.target.Load()
	if t == 0 {
		return nil, ""
	}
	k, ph := t>>2, shm.Phase(t&3)
	var missing, others []peer
	next := hs.ep.Lagging(k, ph, 0)
	for r := range c.size {
		switch {
		case r == next:
			missing = append(missing, c.peer(r))
			next = hs.ep.Lagging(k, ph, r+1)
		case r != c.rank:
			others = append(others, c.peer(r))
		}
	}
	return shmWait(c.jobRank(c.rank), missing, others)
}

// directBytes are the sizes of d's send and recv buffers on every rank
// (recv 0 where d has none: a Reduce off its root).
func (c *communicator) directBytes(d *desc) (send, recv int) {
	b := d.count * dtypeSize(d.dt)
	switch d.kind {
	case comm.KindAllGather:
		return b, c.size * b
	case comm.KindReduceScatter:
		return c.size * b, b
	}
	return b, b
}

// direct runs blocking collective d of c on the owner in place in the
// ranks' buffers, through the engine's direct path, where every rank's
// buffers lie in the slabs of its HostSource and every rank could map its
// peers'. It reports whether it did (and the result): if not, every rank
// leaves the call to MPI alike, and after a rank could not map a peer's
// slabs, every later one too. A peer's failure fails c.
func (c *communicator) direct(d *desc) (taken bool, err error) {
	hs := c.hs
	sendBytes, recvBytes := c.directBytes(d)
	recvMine := recvBytes
	if d.recv == nil {
		recvMine = 0
	}
	dsc, _ := hostSlabs.Describe(d.send, sendBytes, d.recv, recvMine)
	hs.k++
	d.k = hs.k
	k := d.k
	hs.target.Store(k<<2 | uint64(shm.Called))
	defer hs.target.Store(0)
	hs.ep.Publish(k, d.call(k), shm.Direct, nil, &dsc)
	hs.seg.Notify()
	failed := func(err error) (bool, error) {
		err = c.opErr(d, c.peerFailure(err))
		c.fail(err)
		return true, err
	}
	if err := hs.await(k, shm.Called, time.Time{}, true); err != nil {
		return failed(err)
	}
	if v := hs.ep.Judge(k); v != nil {
		return true, c.mismatch(d, v)
	}
	if hs.broken {
		// Judged as every call is, so that ranks that disagree fail alike;
		// then MPI carries it.
		return false, nil
	}
	for r := range c.size {
		if !hs.seg.Desc(r, k).Described() {
			return false, nil // some rank's buffers are other memory: this call goes to MPI
		}
	}
	hs.maps.Begin(c.size, c.rank)
	ok := true
	for r := range c.size {
		if r == c.rank {
			continue
		}
		var err error
		if failMaps.Load() {
			err = errors.New("mapping disabled by a test")
		} else {
			err = hs.maps.Attach(r, hs.seg.Desc(r, k), sendBytes, recvBytes)
		}
		if err != nil {
			ok = false
			rtMu.Lock()
			if c.e.shmFailure == "" {
				c.e.shmFailure = fmt.Sprintf("rank %d could not map rank %d's memory: %v", c.rank, r, err)
			}
			rtMu.Unlock()
			break
		}
	}
	hs.ep.Agree(k, ok)
	hs.seg.Notify()
	if err := hs.await(k, shm.Agreed, time.Time{}, true); err != nil {
		// A peer aborted or is gone: nobody writes this rank's buffers
		// unless a rank that saw every agreement opened the collective
		// first, and then this rank must do its part before it fails.
		if cancelled, _ := hs.ep.Cancel(k); cancelled {
			return failed(err)
		}
		hs.ep.Share(k, &hs.maps)
		hs.seg.Notify()
		hs.await(k, shm.Shared, time.Time{}, false)
		return failed(err)
	}
	if !hs.ep.Agreement(k) {
		hs.broken = true
		return false, nil
	}
	if exitAfter.Load() == int32(shm.Agreed) {
		os.Exit(3) // a test: every rank has mapped, none has reduced
	}
	if open, _ := hs.ep.Open(k); !open {
		// A rank whose wait failed cancelled it: nobody shares.
		return failed(fmt.Errorf("a peer's wait failed: cancelled"))
	}
	hs.ep.Share(k, &hs.maps)
	hs.seg.Notify()
	if err := hs.await(k, shm.Shared, time.Time{}, true); err != nil {
		return failed(err)
	}
	return true, nil
}

// HostSource returns the source of memory that c's all-reduces read and
// write in place, where c is in blocking mode and its ranks all run on one
// machine; nil elsewhere, where it would gain nothing.
func (c *communicator) HostSource() allocator.Source {
	if !c.shm {
		return nil
	}
	return &hostSlabs
}

// sharedMapped is the number of peers' slabs mapped by the communicators
// of this process; on the owner (for tests).
func sharedMapped() (n int) {
	e, err := start()
	if err != nil {
		return 0
	}
	e.call(func() error {
		e.mu.Lock()
		defer e.mu.Unlock()
		for c := range e.comms {
			if c.hs != nil {
				n += c.hs.maps.Mapped()
			}
		}
		return nil
	})
	return n
}

// failMapping makes this process's mappings of peers' memory fail (or
// work again), for tests.
func failMapping(on bool) { failMaps.Store(on) }

// setNTMin sets the size of a rank's slice from which a two-rank
// out-of-place all-reduce in shared memory streams its outputs past the
// cache, for communicators opened afterwards, and returns the previous
// one; for tests and the sweep.
func setNTMin(n int) int {
	old := streamMin
	if old == 0 {
		old = shm.DefaultStreamMin
	}
	streamMin = max(n, 1) // Layout's 0 is the default
	return old
}

// exitMidCall makes this process exit (code 3) in the middle of its next
// direct all-reduce, once every rank has mapped its peers' buffers and
// none has reduced (ph 2), for tests.
func exitMidCall(ph int) { exitAfter.Store(int32(ph)) }
