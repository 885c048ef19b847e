//go:build mpi && cgo

package mpi

/*
#include "ddpmpi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
	"github.com/ddpgo/ddpgo/comm/hier"
)

// Open returns this rank's communicator over a duplicate of
// MPI_COMM_WORLD (MPI_Comm_dup), initialising MPI on first use. It is
// collective: every rank of the world calls it at the same point.
//
// A blocking communicator whose ranks span several hosts with more than
// one rank on some host is hierarchical (package comm/hier): Open splits
// the world into a communicator per host (its collectives in shared
// memory) and one per local rank across the hosts, and returns their
// composite, unless a rank set DDPGO_MPI_HIER=0 (see "Several ranks per
// host" in the package documentation).
func Open(o Options) (comm.Communicator, error) {
	if o.AbortCode < 0 || o.AbortCode > 255 {
		return nil, fmt.Errorf("%w: mpi: Options.AbortCode %d: want 0..255", comm.ErrInvalid, o.AbortCode)
	}
	e, err := start()
	if err != nil {
		return nil, err
	}
	c := &communicator{e: e, opts: o, freed: make(chan struct{})}
	var local, cross *communicator
	var hostOf []int
	var chunk int // the hierarchy's pipeline chunk
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
			c.counted = true
		}
		hostOf = make([]int, c.size)
		if err := c.setUp(hostOf); err != nil {
			return c.openFailed(err)
		}
		if !c.blocking || c.hosts < 2 || slices.Max(hostCounts(hostOf)) < 2 {
			return nil
		}
		// Several ranks on some host: the hierarchy, unless a rank opts
		// out (every rank must take the same path).
		want = 1
		if os.Getenv("DDPGO_MPI_HIER") == "0" {
			want = 0
		}
		if rc := C.ddp_allreduce_int(c.h, &want, 1, 0); rc != C.MPI_SUCCESS {
			return c.openFailed(fmt.Errorf("mpi: world rank %d: agreeing on the hierarchy: %w", e.worldRank, mpiError(int(rc))))
		}
		if want == 0 {
			return nil
		}
		// The chunk of the pipelined all-reduce: every rank must cut at
		// the same places, or the levels' collectives differ. A rank
		// whose setting is invalid says so with -1, so that every rank
		// fails Open rather than waiting for it.
		var bad error
		chunk, bad = hierChunk()
		if bad != nil {
			chunk = -1
		}
		lohi := [2]C.int{C.int(chunk), C.int(-chunk)}
		if rc := C.ddp_allreduce_int(c.h, &lohi[0], 2, 0); rc != C.MPI_SUCCESS {
			return c.openFailed(fmt.Errorf("mpi: world rank %d: agreeing on %s: %w", e.worldRank, hierChunkEnv, mpiError(int(rc))))
		}
		switch lo, hi := int(lohi[0]), -int(lohi[1]); {
		case bad != nil:
			return c.openFailed(fmt.Errorf("mpi: world rank %d: %w", e.worldRank, bad))
		case lo < 0:
			return c.openFailed(fmt.Errorf("%w: mpi: world rank %d: %s is invalid on another rank", comm.ErrInvalid, e.worldRank, hierChunkEnv))
		case lo != hi:
			return c.openFailed(fmt.Errorf("%w: mpi: world rank %d: %s differs between ranks: from %d to %d bytes (this rank %d)",
				comm.ErrInvalid, e.worldRank, hierChunkEnv, lo, hi, chunk))
		}
		var err error
		if local, cross, err = c.split(hostOf); err != nil {
			return c.openFailed(err)
		}
		large := ""
		if cross.hasLarge {
			large = fmt.Sprintf("segmented ring (%d KiB segments)", C.DDP_SEGMENT>>10)
		}
		rtMu.Lock()
		e.lastHosts, e.lastLarge, e.lastShared, e.lastHier, e.lastChunk = c.hosts, large, local.shm, layoutName(hostOf), chunk
		rtMu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, x := range []*communicator{c, local, cross} {
		if x != nil {
			x.ready()
		}
	}
	if local == nil {
		return c, nil
	}
	names := make([]string, len(hostOf))
	for r, h := range hostOf {
		names[r] = strconv.Itoa(h)
	}
	var lc, xc comm.Communicator = local, cross
	if wrapLevels != nil {
		lc, xc = wrapLevels(lc, xc)
	}
	hc, err := hier.New(hier.Config{Layout: hier.FromHosts(names), Rank: c.rank, Local: lc, Cross: xc, World: c, ChunkBytes: chunk})
	if err != nil {
		err = fmt.Errorf("mpi: world rank %d: the hierarchy: %w", e.worldRank, err)
		return nil, errors.Join(err, cross.Close(), local.Close(), c.Close())
	}
	return hc, nil
}

// wrapLevels, where a test sets it, stands between a hierarchical
// communicator and its two levels: the fault tests across hosts use it to
// fail a rank at the entry of a chosen phase.
var wrapLevels func(local, cross comm.Communicator) (comm.Communicator, comm.Communicator)

// hostCounts is the number of ranks on each host of hostOf.
func hostCounts(hostOf []int) []int {
	n := make([]int, slices.Max(hostOf)+1)
	for _, h := range hostOf {
		n[h]++
	}
	return n
}

// layoutName says how many ranks each host runs: "2+2", "3+1".
func layoutName(hostOf []int) string {
	var parts []string
	for _, n := range hostCounts(hostOf) {
		parts = append(parts, strconv.Itoa(n))
	}
	return strings.Join(parts, "+")
}

// setUp readies communicator c, whose c.h, rank, size and blocking are
// set: it counts the hosts (and fills hostOf, if not nil, with each rank's
// host), gives a blocking communicator across hosts its segmented ring
// and one on a single host its shared-memory segment. On the owner.
func (c *communicator) setUp(hostOf []int) error {
	e := c.e
	var hosts, can C.int
	var at *C.int
	if hostOf != nil {
		tmp := make([]C.int, c.size)
		at = &tmp[0]
		defer func() {
			for i := range tmp {
				hostOf[i] = int(tmp[i])
			}
		}()
	}
	if rc := C.ddp_hosts(c.h, C.int(c.size), &hosts, &can, at); rc != C.MPI_SUCCESS {
		return fmt.Errorf("mpi: world rank %d: counting the hosts: %w", e.worldRank, mpiError(int(rc)))
	}
	c.hosts = int(hosts)
	if c.blocking && c.size >= 2 && c.hosts >= 2 && can != 0 {
		var made C.int
		if rc := C.ddp_dup_algorithm(c.h, segmentedRing, C.DDP_SEGMENT, recursiveHalving, &c.large, &made); rc != C.MPI_SUCCESS {
			if made != 0 {
				C.ddp_free(&c.large)
			}
			return fmt.Errorf("mpi: world rank %d: MPI_Comm_dup with the segmented ring all-reduce: %w", e.worldRank, mpiError(int(rc)))
		}
		c.hasLarge = made != 0
	}
	if c.blocking && (c.size >= 2 || stagedAlone) && c.hosts == 1 {
		// Every rank must take the same path at every collective: one
		// that opted out opts every rank out.
		want := C.int(1)
		if os.Getenv("DDPGO_MPI_SHM") == "0" {
			want = 0
		}
		if rc := C.ddp_allreduce_int(c.h, &want, 1, 0); rc != C.MPI_SUCCESS {
			return fmt.Errorf("mpi: world rank %d: agreeing on shared memory: %w", e.worldRank, mpiError(int(rc)))
		}
		if want == 1 {
			// Every rank maps the segment, or none does.
			c.directMin = directMin
			hs, why, err := openHost(c.h, c.rank, c.size)
			if err != nil {
				return fmt.Errorf("mpi: world rank %d: sharing the segment: %w", e.worldRank, err)
			}
			if why != "" {
				rtMu.Lock()
				e.shmFailure = why
				rtMu.Unlock()
			}
			c.hs = hs
		}
		c.shm = c.hs != nil
	}
	large := ""
	if c.hasLarge {
		large = fmt.Sprintf("segmented ring (%d KiB segments)", C.DDP_SEGMENT>>10)
	}
	rtMu.Lock()
	e.lastHosts, e.lastLarge, e.lastShared, e.lastHier, e.lastChunk = c.hosts, large, c.shm, "", 0
	rtMu.Unlock()
	return nil
}

// split makes the two levels of c's hierarchy, blocking both: the ranks of
// this rank's host (by host, in rank order), and the ranks of every host
// with this rank's local rank (by local rank, in host order). They are
// the composite's alone, which issues on them one phase at a time in the
// same order on every rank, so they do not count against the one blocking
// communicator of a process (c is it). On the owner; collective over c.
func (c *communicator) split(hostOf []int) (local, cross *communicator, err error) {
	me := hostOf[c.rank]
	localRank := 0
	for r := range c.rank {
		if hostOf[r] == me {
			localRank++
		}
	}
	// The job's ranks of each level, in the level's order (MPI_Comm_split
	// orders by key): the ranks of this host in job order; local rank
	// localRank of every host, in host order.
	var hostRanks, crossRanks []int
	seen := map[int]int{} // ranks seen so far on each host
	for r, h := range hostOf {
		if h == me {
			hostRanks = append(hostRanks, r)
		}
		if seen[h] == localRank {
			crossRanks = append(crossRanks, r)
		}
		seen[h]++
	}
	slices.SortStableFunc(crossRanks, func(a, b int) int { return hostOf[a] - hostOf[b] })
	level := func(color, key int, what string) (*communicator, error) {
		x := &communicator{e: c.e, opts: c.opts, freed: make(chan struct{}), blocking: true, level: what}
		x.job = map[string][]int{"host": hostRanks, "cross-host": crossRanks}[what]
		var r, n C.int
		if rc := C.ddp_split(c.h, C.int(color), C.int(key), &x.h, &r, &n); rc != C.MPI_SUCCESS {
			return nil, fmt.Errorf("mpi: world rank %d: MPI_Comm_split for the %s level: %w", c.e.worldRank, what, mpiError(int(rc)))
		}
		x.rank, x.size = int(r), int(n)
		if x.size != len(x.job) || x.job[x.rank] != c.rank {
			return nil, x.openFailed(fmt.Errorf("mpi: world rank %d: the %s level has rank %d of %d, where the job's hosts put it at %d of %v",
				c.e.worldRank, what, x.rank, x.size, slices.Index(x.job, c.rank), x.job))
		}
		if err := x.setUp(nil); err != nil {
			return nil, x.openFailed(err)
		}
		return x, nil
	}
	if local, err = level(me, c.rank, "host"); err != nil {
		return nil, nil, err
	}
	if cross, err = level(localRank, me, "cross-host"); err != nil {
		c.e.release(local)
		return nil, nil, err
	}
	return local, cross, nil
}

// ready finishes what Open made of c: its ring, its place among the open
// communicators, its watchdog.
func (c *communicator) ready() {
	// Park at once in Wait: the owner, readied by the issue, then runs on
	// the waiter's processor (see engine.loop).
	c.ops.Init(backend.Config{Backend: "mpi", Rank: c.rank, Hooks: (*ringHooks)(c)})
	c.rules = backend.Rules{Rank: c.rank, Size: c.size, HostOnly: true, MaxCount: math.MaxInt32}
	c.e.mu.Lock()
	c.e.comms[c] = struct{}{}
	c.e.mu.Unlock()
	if c.opts.StallInterval >= 0 || c.opts.Timeout >= 0 {
		c.wdStop, c.wdDone = make(chan struct{}), make(chan struct{})
		go c.watch(time.Now())
	}
}

// forcedAllReduce returns the all-reduce algorithm and segment size, and
// the reduce-scatter algorithm, Open MPI would give a communicator created
// now (0: its own choice), for tests: Open sets them only while it makes
// its second communicator.
func forcedAllReduce() (alg, segsize, rsb int, err error) {
	e, err := start()
	if err != nil {
		return 0, 0, 0, err
	}
	err = e.call(func() error {
		var a, s, r C.int
		C.ddp_forced_allreduce(&a, &s, &r)
		alg, segsize, rsb = int(a), int(s), int(r)
		return nil
	})
	return alg, segsize, rsb, err
}

// openFailed frees what Open made of c and returns err; on the owner.
func (c *communicator) openFailed(err error) error {
	c.e.release(c)
	return err
}

// segmentedRing is Open MPI's number for its segmented ring all-reduce
// (coll_tuned_allreduce_algorithm), and largeMin the size from which a
// blocking all-reduce between hosts runs on it, in DDP_SEGMENT pieces.
// recursiveHalving is its number for the recursive-halving
// reduce-scatter (coll_tuned_reduce_scatter_block_algorithm), which a
// blocking reduce-scatter between hosts of largeMin bytes and more (its
// whole input) runs: each rank sends (n-1)/n of its input, where Open
// MPI's own choice between two lab hosts moved the whole input to one
// rank and half of it back.
const (
	segmentedRing    = 5
	recursiveHalving = 3
	largeMin         = 1 << 20
)

// The process's MPI state: one per process, started by the first Open and
// stopped by Finalize.
var (
	rtMu     sync.Mutex
	rt       *engine
	finished bool
)

// start returns the process's engine, starting it on first use.
func start() (*engine, error) {
	rtMu.Lock()
	defer rtMu.Unlock()
	if finished {
		return nil, fmt.Errorf("%w: Open after Finalize", ErrFinalized)
	}
	if rt != nil {
		return rt, nil
	}
	e := &engine{
		q:        make(chan ref, 4096),
		exit:     make(chan struct{}),
		main:     make(chan func()),
		mainExit: make(chan struct{}),
		comms:    map[*communicator]struct{}{},
	}
	errc := make(chan error, 1)
	go e.mainThread(errc)
	if err := <-errc; err != nil {
		<-e.mainExit
		finished = true // MPI cannot be initialised again
		return nil, err
	}
	go e.loop()
	rt = e
	return e, nil
}

// mainThread initialises MPI on a thread of its own, then runs what is
// sent on e.main (MPI_Finalize) and returns when main is closed. It never
// unlocks its thread, which ends with the goroutine.
func (e *engine) mainThread(errc chan<- error) {
	defer close(e.mainExit)
	runtime.LockOSThread()
	var provided, ours, tuned, tcp, tcpFlags, wr, ws C.int
	var tcpEager C.longlong
	if rc := C.ddp_init(&provided, &ours, &tuned, &tcp, &tcpFlags, &tcpEager, &wr, &ws); rc != C.MPI_SUCCESS {
		errc <- fmt.Errorf("mpi: initialising MPI: %w", mpiError(int(rc)))
		return
	}
	e.provided, e.ours, e.worldRank, e.worldSize = int(provided), ours != 0, int(wr), int(ws)
	e.mallocTuned, e.tcpTuned, e.tcpFlags, e.tcpEager = tuned != 0, tcp != 0, int(tcpFlags), int64(tcpEager)
	e.f16c = C.ddp_has_f16c() != 0
	if e.provided < C.MPI_THREAD_SERIALIZED {
		// The owner calls MPI from threads other than the one that
		// initialised it, which MPI_THREAD_FUNNELED and below forbid.
		err := fmt.Errorf("mpi: MPI provides %s; the backend calls MPI from a goroutine of its own and needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE", threadLevel(e.provided))
		if !e.ours {
			err = fmt.Errorf("%w (the host program initialised MPI: ask MPI_Init_thread for one of them)", err)
		}
		errc <- err
		return
	}
	errc <- nil
	for f := range e.main {
		f()
	}
}

// Finalize closes every open communicator, stops the owner goroutine and,
// if the backend initialised MPI, calls MPI_Finalize, which every process
// of an MPI job must call before it exits (mpirun counts an exit without
// it as a failure). After Finalize, Open fails with ErrFinalized. Finalize
// is idempotent; call it once every collective has completed, on every
// path out of main (or TestMain); a program that reaches the backend only
// through launch.Open calls launch.Finalize, which calls this.
func Finalize() error {
	rtMu.Lock()
	e := rt
	rt, finished = nil, true
	rtMu.Unlock()
	if e == nil {
		return nil
	}
	e.mu.Lock()
	open := make([]*communicator, 0, len(e.comms))
	for c := range e.comms {
		open = append(open, c)
	}
	e.mu.Unlock()
	var errs []error
	for _, c := range open {
		errs = append(errs, c.Close())
	}
	_ = e.call(func() error {
		e.stop = true
		return nil
	})
	<-e.exit
	errc := make(chan error, 1)
	e.main <- func() {
		if rc := C.ddp_finalize(boolInt(e.ours)); rc != C.MPI_SUCCESS {
			errc <- fmt.Errorf("mpi: MPI_Finalize: %w", mpiError(int(rc)))
			return
		}
		errc <- nil
	}
	err := <-errc
	close(e.main)
	<-e.mainExit
	if e.pool != nil {
		errs = append(errs, e.pool.Close())
	}
	return errors.Join(append(errs, err)...)
}

// hierChunkEnv names the chunk of a hierarchical communicator's
// all-reduces (comm/hier's Config.ChunkBytes): bytes, or KiB and MiB with
// a K or M suffix; 0, none; unset, defaultHierChunk.
const hierChunkEnv = "DDPGO_MPI_HIER_CHUNK"

// defaultHierChunk is the chunk of a hierarchical all-reduce unless
// hierChunkEnv says otherwise: the fastest of 256 KiB to 4 MiB in the
// network lab (2 hosts x 2 ranks, 1 Gbit/s; docs/design/hierarchy.md).
const defaultHierChunk = 1 << 20

// hierChunk is the chunk hierChunkEnv asks for.
func hierChunk() (int, error) {
	s := os.Getenv(hierChunkEnv)
	if s == "" {
		return defaultHierChunk, nil
	}
	num, unit := s, 1
	switch {
	case strings.HasSuffix(s, "K"):
		num, unit = s[:len(s)-1], 1<<10
	case strings.HasSuffix(s, "M"):
		num, unit = s[:len(s)-1], 1<<20
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > (1<<30)/unit {
		return 0, fmt.Errorf("%w: %s=%q: want bytes from 0 to 1G, or a number of KiB or MiB with a K or M suffix (4M)", comm.ErrInvalid, hierChunkEnv, s)
	}
	return n * unit, nil
}
