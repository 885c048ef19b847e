// Package mpitest runs test programs under mpirun: it finds Open MPI or
// skips the test (failing it instead under DDPGO_REQUIRE_MPI=1, as CI
// sets), builds a package with the mpi tag, and runs jobs on this machine
// over shared memory.
package mpitest

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Mpirun returns mpirun's path, or skips t where Open MPI is missing
// (mpirun, or its development files for pkg-config ompi-c), under -short,
// or inside an mpirun job already; DDPGO_REQUIRE_MPI=1 makes a missing
// Open MPI a failure.
func Mpirun(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the runs under mpirun are skipped")
	}
	if os.Getenv("OMPI_COMM_WORLD_SIZE") != "" {
		t.Skip("already a rank of an mpirun job")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err == nil {
		err = exec.Command("pkg-config", "--exists", "ompi-c").Run()
	}
	if err != nil {
		msg := "Open MPI not found (mpirun, pkg-config ompi-c): apt-get install openmpi-bin libopenmpi-dev pkg-config"
		if os.Getenv("DDPGO_REQUIRE_MPI") == "1" {
			t.Fatalf("%s (DDPGO_REQUIRE_MPI=1)", msg)
		}
		t.Skip(msg)
	}
	return mpirun
}

// Build builds the package in dir (".": the test's own) with the mpi tag
// into bin.
func Build(ctx context.Context, t testing.TB, dir, bin string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "mpi", "-o", bin, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mpi %s: %v\n%s", dir, err, out)
	}
}

// Args returns mpirun's options for a job of np ranks on this machine
// only: btl is the transport between the ranks (SharedMemory, or TCP over
// the loopback), mpirun's own traffic stays on the loopback, the job is
// oversubscribed where np exceeds the cores, and root may run it. Every
// test that starts mpirun starts it with these.
func Args(np int, btl string) []string {
	args := []string{"-np", strconv.Itoa(np), "--oversubscribe", "--mca", "btl", btl, "--mca", "oob_tcp_if_include", "lo"}
	if btl == TCP {
		args = append(args, "--mca", "btl_tcp_if_include", "lo")
	}
	if os.Geteuid() == 0 {
		args = append(args, "--allow-run-as-root")
	}
	return args
}

// Transports for Args.
const (
	SharedMemory = "self,vader"
	TCP          = "self,tcp"
)

// Job returns the command that runs prog with args as np ranks on this
// machine over shared memory (Args), each rank with one malloc arena.
func Job(ctx context.Context, mpirun string, np int, prog string, args ...string) *exec.Cmd {
	full := append(Args(np, SharedMemory), "-x", "MALLOC_ARENA_MAX=1")
	return exec.CommandContext(ctx, mpirun, append(append(full, prog), args...)...)
}

// Run runs Job and returns its standard output and error, failing t if
// the job fails.
func Run(ctx context.Context, t testing.TB, mpirun string, np int, prog string, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := Job(ctx, mpirun, np, prog, args...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatalf("mpirun -np %d %s %s: %v\nstdout:\n%s\nstderr:\n%s", np, prog, strings.Join(args, " "), err, o.String(), e.String())
	}
	return o.String(), e.String()
}
