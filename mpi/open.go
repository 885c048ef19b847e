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
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

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
		if c.blocking && (c.size >= 2 || stagedAlone) && c.hosts == 1 {
			// Every rank must take the same path at every all-reduce:
			// one that opted out opts every rank out.
			want := C.int(1)
			if os.Getenv("DDPGO_MPI_SHM") == "0" {
				want = 0
			}
			if rc := C.ddp_allreduce_int(c.h, &want, 1, 0); rc != C.MPI_SUCCESS {
				return c.openFailed(fmt.Errorf("mpi: world rank %d: agreeing on shared memory: %w", e.worldRank, mpiError(int(rc))))
			}
			if want == 1 {
				// Every rank maps the segment, or none does.
				c.directMin = directMin
				hs, why, err := openHost(c.h, c.rank, c.size)
				if err != nil {
					return c.openFailed(fmt.Errorf("mpi: world rank %d: sharing the segment: %w", e.worldRank, err))
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
		e.lastHosts, e.lastLarge, e.lastShared = c.hosts, large, c.shm
		rtMu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Park at once in Wait: the owner, readied by the issue, then runs on
	// the waiter's processor (see engine.loop).
	c.ops.Init(backend.Config{Backend: "mpi", Rank: c.rank, Hooks: (*ringHooks)(c)})
	c.rules = backend.Rules{Rank: c.rank, Size: c.size, HostOnly: true, MaxCount: math.MaxInt32}
	e.mu.Lock()
	e.comms[c] = struct{}{}
	e.mu.Unlock()
	if o.StallInterval >= 0 || o.Timeout >= 0 {
		c.wdStop, c.wdDone = make(chan struct{}), make(chan struct{})
		go c.watch(time.Now())
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
