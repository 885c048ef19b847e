//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/hier"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/mpi"
)

// hierFaultEnv makes TestHierarchyFault a rank of a fault job over
// hosts of their own, which scripts/netfaults.sh runs on the network
// lab: "FAULT:PHASE:DIR", FAULT one of kill, stop or exit, PHASE host or
// net, DIR a folder the ranks share for their notes to each other.
const hierFaultEnv = "DDPGO_MPI_TEST_HIER_FAULT"

// TestHierarchyFault is a rank of a fault job on the hierarchical path:
// the ranks all-reduce once, then the last rank fails at the entry of the
// chosen phase of the second all-reduce, as it issues its first
// collective on that level: the host's (host: shared memory, where the
// host reduces into its shards) or the cross-host one (net: over MPI,
// where each shard crosses the hosts). It fails as FAULT says: killed
// (SIGKILL), stopped (SIGSTOP), or its process exits (status 0, without
// ending MPI). The fault is raised by the level itself, not timed, so it
// falls in the same phase on every run.
//
// The other ranks wait for the all-reduce, with stall reports every
// second, and write "CHILD: rank R: waited D: ERR" when their wait ends:
// at faultDeadline after a stop, which nothing else ends; after a kill or
// an exit, long before their deadline (five times as long), since the
// runtime or the host's level sees the process end. A rank whose wait ended at its deadline writes a note
// in DIR; rank 0, once every surviving rank's note is there, aborts the
// job, which so ends after every rank has said why it failed. A wait
// that ends otherwise (the victim's exit seen in shared memory) has
// failed the communicator, which has aborted the job itself. The job's
// output is for netfaults.sh to judge; this side only fails the job
// where the all-reduce completes, or does not run hierarchically.
func TestHierarchyFault(t *testing.T) {
	spec := os.Getenv(hierFaultEnv)
	if spec == "" {
		t.Skip("a rank of the hierarchical fault jobs of scripts/netfaults.sh")
	}
	f := strings.SplitN(spec, ":", 3)
	if len(f) != 3 || (f[0] != "kill" && f[0] != "stop" && f[0] != "exit") || (f[1] != "host" && f[1] != "net") {
		t.Fatalf("%s=%q: want FAULT:PHASE:DIR, FAULT kill, stop or exit, PHASE host or net", hierFaultEnv, spec)
	}
	fault, phase, dir := f[0], f[1], f[2]
	rank, err1 := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_RANK"))
	size, err2 := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_SIZE"))
	if err := errors.Join(err1, err2); err != nil {
		t.Fatalf("not a rank of an mpirun job: %v", err)
	}
	victim := size - 1
	// Open MPI's runtime ends the other ranks when one dies or aborts the
	// job; they hold off its SIGTERM, so that they may say what their
	// waits saw before its SIGKILL.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM)
	var armed atomic.Bool
	if rank == victim {
		old := mpi.SetWrapLevels(func(local, cross comm.Communicator) (comm.Communicator, comm.Communicator) {
			if phase == "host" {
				return &faulty{Communicator: local, armed: &armed, fault: fault, rank: rank, phase: phase}, cross
			}
			return local, &faulty{Communicator: cross, armed: &armed, fault: fault, rank: rank, phase: phase}
		})
		defer mpi.SetWrapLevels(old)
	}
	deadline := faultDeadline
	if fault != "stop" {
		deadline = 5 * faultDeadline
	}
	c := open(t, mpi.Options{
		Blocking:      true,
		StallInterval: time.Second,
		// A backstop only: rank 0 aborts the job before.
		Timeout: deadline + 2*faultDeadline,
		OnStall: func(s comm.Stall) { fmt.Printf("CHILD: rank %d: stall: %s\n", rank, s) },
	})
	if _, ok := c.(*hier.Comm); !ok || mpi.LibraryInfo().Hierarchy == "" {
		t.Fatalf("rank %d: the communicator is a %T, Info.Hierarchy %q: not hierarchical", rank, c, mpi.LibraryInfo().Hierarchy)
	}
	// An odd count: the last shard is longer than the others.
	b := alloc(t, 1001, comm.Float32)
	v := b.AsFloat32()
	fill := func() {
		for k := range v {
			v[k] = float32(rank + 1)
		}
	}
	fill()
	testutil.MustWaitAll(t, c.AllReduce(b, b, comm.Sum))
	if want := float32(size * (size + 1) / 2); v[0] != want || v[len(v)-1] != want {
		t.Fatalf("rank %d: the first all-reduce gave %v ... %v; want %v", rank, v[0], v[len(v)-1], want)
	}
	fill()
	armed.Store(rank == victim)
	w := c.AllReduce(b, b, comm.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	t0 := time.Now()
	err := w.Wait(ctx)
	fmt.Printf("CHILD: rank %d: waited %v: %v\n", rank, time.Since(t0).Round(time.Millisecond), err)
	if rank == victim {
		// Continued by the runtime as it ends the job, a stopped victim
		// may complete its all-reduce, every rank having joined it.
		os.Exit(1)
	}
	if err == nil {
		fmt.Printf("CHILD: rank %d: the all-reduce completed without rank %d\n", rank, victim)
		os.Exit(1) // no MPI_Finalize: a peer is gone
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		// The communicator has failed and aborted the job; its runtime
		// ends this process.
		_ = w.Wait(context.Background())
		os.Exit(1)
	}
	writeNote(t, dir, rank)
	if rank == 0 {
		for r := 1; r < victim; r++ {
			waitNote(dir, r)
		}
		c.Abort(fmt.Errorf("CHILD: every surviving rank's wait ended at its %v deadline", deadline))
	}
	// The abort (or, failing it, Options.Timeout) ends the job.
	_ = w.Wait(context.Background())
	os.Exit(1)
}

// faulty is the victim's level in TestHierarchyFault: once armed, the
// first collective issued on it fails the rank, before it reaches the
// level.
type faulty struct {
	comm.Communicator
	armed *atomic.Bool
	fault string
	rank  int
	phase string
}

func (f *faulty) enter() {
	if !f.armed.CompareAndSwap(true, false) {
		return
	}
	fmt.Printf("CHILD: rank %d (process %d): %s at the entry of the %s phase\n", f.rank, os.Getpid(), f.fault, f.phase)
	// The signals go to this thread (tgkill), which so stops or dies
	// before it issues the collective.
	self := func(sig syscall.Signal) { syscall.Tgkill(os.Getpid(), syscall.Gettid(), sig) }
	switch f.fault {
	case "kill":
		self(syscall.SIGKILL)
	case "stop":
		self(syscall.SIGSTOP)
	case "exit":
		os.Exit(0)
	}
}

func (f *faulty) AllReduce(s, r comm.Buffer, o comm.Op) comm.Work {
	f.enter()
	return f.Communicator.AllReduce(s, r, o)
}

func (f *faulty) Broadcast(b comm.Buffer, root int) comm.Work {
	f.enter()
	return f.Communicator.Broadcast(b, root)
}

func (f *faulty) Reduce(s, r comm.Buffer, o comm.Op, root int) comm.Work {
	f.enter()
	return f.Communicator.Reduce(s, r, o, root)
}

func (f *faulty) AllGather(s, r comm.Buffer) comm.Work {
	f.enter()
	return f.Communicator.AllGather(s, r)
}

func (f *faulty) ReduceScatter(s, r comm.Buffer, o comm.Op) comm.Work {
	f.enter()
	return f.Communicator.ReduceScatter(s, r, o)
}

func (f *faulty) Barrier() comm.Work {
	f.enter()
	return f.Communicator.Barrier()
}

func (f *faulty) Capabilities() comm.Caps { return comm.CapsOf(f.Communicator) }

func (f *faulty) Unwrap() comm.Communicator { return f.Communicator }
