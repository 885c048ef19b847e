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

// Job returns the command that runs prog with args as np ranks on this
// machine: shared memory between the ranks, mpirun's own traffic on the
// loopback, oversubscribed where np exceeds the cores.
func Job(ctx context.Context, mpirun string, np int, prog string, args ...string) *exec.Cmd {
	full := []string{"-np", strconv.Itoa(np), "--oversubscribe", "--mca", "btl", "self,vader",
		"--mca", "oob_tcp_if_include", "lo", "-x", "MALLOC_ARENA_MAX=1"}
	if os.Geteuid() == 0 {
		full = append(full, "--allow-run-as-root")
	}
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
