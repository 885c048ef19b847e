//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/mpi"
)

// The tests are SPMD: under mpirun every rank runs them all, and every
// rank issues the same collectives in the same order. Run outside mpirun,
// the binary is a 1-rank world (MPI's singleton start-up), and
// TestUnderMpirun starts the same binary under mpirun with more ranks.

func TestMain(m *testing.M) {
	code := m.Run()
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "mpi.Finalize:", err)
		code = 1
	}
	os.Exit(code)
}

// underMpirun reports whether this process is one rank of an mpirun job.
func underMpirun() bool { return os.Getenv("OMPI_COMM_WORLD_SIZE") != "" }

// TestUnderMpirun runs this test binary under mpirun with the rank counts
// of DDPGO_MPI_NP (default "2,3"), so that a plain go test covers several
// ranks. It is skipped inside such a job, with -short, or without mpirun.
func TestUnderMpirun(t *testing.T) {
	if underMpirun() {
		t.Skip("already a rank of an mpirun job")
	}
	if testing.Short() {
		t.Skip("-short: the multi-rank runs under mpirun are skipped")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun not found (Debian: apt-get install openmpi-bin); only the 1-rank tests ran")
	}
	nps := os.Getenv("DDPGO_MPI_NP")
	if nps == "" {
		nps = "2,3"
	}
	for _, np := range strings.Split(nps, ",") {
		t.Run(np+"ranks", func(t *testing.T) {
			args := mpirunArgs(np)
			args = append(args, os.Args[0], "-test.timeout=15m")
			for _, a := range os.Args[1:] {
				// Keep the caller's -run, -v and friends, not its coverage or
				// profile outputs, which the ranks would overwrite.
				if strings.HasPrefix(a, "-test.run") || strings.HasPrefix(a, "-test.v") || strings.HasPrefix(a, "-test.count") || strings.HasPrefix(a, "-test.short") {
					args = append(args, a)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, mpirun, args...)
			cmd.Env = childEnv()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("mpirun -np %s %s: %v\n%s", np, os.Args[0], err, out)
			}
			if testing.Verbose() {
				t.Logf("mpirun -np %s:\n%s", np, out)
			}
		})
	}
}

// mpirunArgs are the options for a job of np ranks on this machine only:
// shared memory between the ranks, the runtime's own traffic on loopback.
func mpirunArgs(np string) []string {
	args := []string{"-np", np, "--oversubscribe", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"}
	if os.Geteuid() == 0 {
		args = append(args, "--allow-run-as-root")
	}
	return args
}

// childEnv is the environment without what a singleton MPI start-up of
// this process may have added, which would confuse the job's ranks.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OMPI_") || strings.HasPrefix(kv, "PMIX_") || strings.HasPrefix(kv, "OPAL_") || strings.HasPrefix(kv, "ORTE_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// open returns a new communicator, closed when the test ends.
func open(t testing.TB, o mpi.Options) comm.Communicator {
	t.Helper()
	c, err := mpi.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// pool is the tests' source of collective memory (the contract's rule:
// never Go-heap memory).
var pool = func() *allocator.Pool {
	p, err := allocator.New(allocator.Options{Limit: 4 << 30})
	if err != nil {
		panic(err)
	}
	return p
}()

// alloc returns a pool buffer of count elements of dt, returned to the
// pool when the test ends.
func alloc(t testing.TB, count int, dt comm.DType) comm.Buffer {
	t.Helper()
	b, err := pool.Get(count * dt.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Put(b); err != nil {
			t.Error(err)
		}
	})
	return comm.HostBuffer(b.Addr(), count, dt)
}

// waitAll waits for every Work with a deadline and fails on any error.
func waitAll(t testing.TB, ws ...comm.Work) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, w := range ws {
		if err := w.Wait(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("operation %d (#%d) did not complete in 2 minutes: %v", i, w.ID(), err)
			}
			t.Fatalf("operation %d (#%d): %v", i, w.ID(), err)
		}
	}
}
