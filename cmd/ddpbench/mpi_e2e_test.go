package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/internal/mpitest"
)

// TestMPIEndToEnd builds ddpbench with the mpi tag and runs it under
// mpirun with 2 processes: collective and run, as a user would, checking
// that rank 0 alone prints one result for the whole job.
func TestMPIEndToEnd(t *testing.T) {
	mpirun := mpitest.Mpirun(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "ddpbench")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	mpitest.Build(ctx, t, ".", bin)
	job := func(args ...string) (stdout, stderr string) {
		t.Helper()
		return mpitest.Run(ctx, t, mpirun, 2, bin, args...)
	}

	out, _ := job("collective", "--backend", "mpi", "-b", "1K", "-e", "64K", "-f", "8", "-n", "5", "-w", "1")
	if strings.Count(out, "# Collective test: all_reduce, backend mpi") != 1 || !strings.Contains(out, "nRanks 2 ") ||
		!strings.Contains(out, "#  Rank  1 Group  0 Pid") || !strings.Contains(out, "# Out of bounds values : 0 OK") {
		t.Errorf("collective under mpirun: want one table for 2 ranks, rank 1 listed, nothing wrong:\n%s", out)
	}
	out, _ = job("collective", "--backend", "mpi", "-b", "1K", "-e", "4K", "-f", "4", "-n", "3", "-w", "1", "--format", "json")
	var cj collectiveJSON
	if err := json.Unmarshal([]byte(out), &cj); err != nil || cj.Ranks != 2 || cj.Backend != "mpi" || cj.Wrong != 0 || len(cj.Rows) != 2 {
		t.Errorf("collective json under mpirun: %+v, %v\n%s", cj, err, out)
	}

	// Without --backend mpi, each process would run an in-process job of
	// its own: every rank refuses, with exit status 2.
	{
		cmd := mpitest.Job(ctx, mpirun, 2, bin, "collective", "-b", "1K", "-e", "1K")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 ||
			!strings.Contains(stderr.String(), "--backend inproc runs every rank in this process, but openmpi started 2 processes") {
			t.Errorf("collective without --backend mpi under mpirun: %v; want exit status 2 and the reason:\n%s", err, stderr.String())
		}
	}

	model := writeFile(t, "tiny.json", `{"model":"tiny","params":[{"name":"a","shape":[300,256]},{"name":"b","shape":[256]},{"name":"c","shape":[10,256]}]}`)
	trace := filepath.Join(dir, "t.json")
	out, _ = job("run", "--backend", "mpi", "--model", model, "--bucket-cap-mb", "0.25", "--first-bucket-mb", "0.1",
		"--steps", "4", "--warmup", "1", "--compute", "none", "--format", "json", "--trace", trace)
	var rj runJSON
	if err := json.Unmarshal([]byte(out), &rj); err != nil || rj.Ranks != 2 || rj.Backend != "mpi" || rj.Steps != 4 {
		t.Errorf("run json under mpirun: %+v, %v\n%s", rj, err, out)
	}
	// What the table's header and rank table show, the JSON carries: the
	// library, the hosts, what the backend chose, and each rank's process.
	if !strings.HasPrefix(rj.Library, "Open MPI") || rj.Hosts != 1 || rj.Transport == nil || rj.Transport.Hosts != 1 ||
		len(rj.RankHosts) != 2 || rj.RankHosts[1].Rank != 1 || rj.RankHosts[0].PID == rj.RankHosts[1].PID || rj.RankHosts[0].Host == "" {
		t.Errorf("run json under mpirun: library %q, hosts %d, transport %+v, rank hosts %+v; want Open MPI's library, 1 host, "+
			"the backend's choices and each rank's own process", rj.Library, rj.Hosts, rj.Transport, rj.RankHosts)
	}
	out, _ = job("run", "--backend", "mpi", "--model", model, "--steps", "2", "--warmup", "1", "--compute", "none")
	if !strings.Contains(out, "Open MPI") || !regexp.MustCompile(`(?m)^ +1 +\d+  \S+$`).MatchString(out) {
		t.Errorf("run under mpirun: want the library in the header and rank 1 in the rank table:\n%s", out)
	}
	for _, f := range []string{"t.rank0.json", "t.rank1.json"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("--trace under mpirun: %s: %v", f, err)
		}
	}

	// A rank that fails on its own after MPI started (here rank 1, which
	// cannot bind its metrics port, the port plus its local rank) says
	// so first, naming itself, and the job ends at once with its exit
	// status (2: the input was invalid), not at --timeout.
	port, busy := busyPortAbove(t)
	defer busy.Close()
	start := time.Now()
	cmd := mpitest.Job(ctx, mpirun, 2, bin, "run", "--backend", "mpi", "--model", model, "--steps", "2", "--warmup", "0",
		"--compute", "none", "--timeout", "2m", "--metrics-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), "ddpbench: rank 1 of 2: --metrics-addr") ||
		!strings.Contains(stderr.String(), "rank 1 failed before the run started") {
		t.Errorf("a rank that cannot bind its metrics port: %v after %v; want exit status 2 and its error, naming rank 1, on every rank's behalf:\n%s",
			err, time.Since(start).Round(time.Second), stderr.String())
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("the job took %v to end after rank 1 failed; want seconds (--timeout is 2m)", d.Round(time.Second))
	}

	// Ctrl-C goes to mpirun, which ends every rank with SIGTERM a second
	// later: rank 0 prints the statistics of the steps completed, marked,
	// and the reason, before the job ends (with mpirun's own status).
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePorts(t)))
	cmd = mpitest.Job(ctx, mpirun, 2, bin, "run", "--backend", "mpi", "--model", model, "--steps", "1000000", "--warmup", "1",
		"--compute-time", "20ms", "--timeout", "2m", "--metrics-addr", addr)
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for stepsServed(addr) < 4 && ctx.Err() == nil { // the warmup and a few measured steps
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(os.Interrupt)
	err = cmd.Wait()
	if !strings.Contains(so.String(), "INTERRUPTED after") || !strings.Contains(se.String(), "ddpbench: rank 0 of 2: interrupted (") ||
		!strings.Contains(se.String(), "SIGTERM") {
		t.Errorf("Ctrl-C under mpirun (%v): want rank 0's statistics so far, marked, and the reason:\nstdout:\n%s\nstderr:\n%s", err, so.String(), se.String())
	}
}

// freePorts returns a port p such that p and p+1 are free.
func freePorts(t *testing.T) int {
	t.Helper()
	for range 20 {
		p, busy := busyPortAbove(t)
		busy.Close()
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1))); err == nil {
			ln.Close()
			return p
		}
	}
	t.Fatal("no free pair of ports")
	return 0
}

// stepsServed returns the steps rank 0 has completed, from its metrics.
func stepsServed(addr string) int {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	steps := 0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "ddpgo_steps_total{") { // synced and not
			f := strings.Fields(line)
			n, _ := strconv.ParseFloat(f[len(f)-1], 64)
			steps += int(n)
		}
	}
	return steps
}

// busyPortAbove returns a port p whose successor p+1 it holds open, so
// that rank 1 of a job on this machine given --metrics-addr with port p
// cannot listen.
func busyPortAbove(t *testing.T) (int, net.Listener) {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port - 1
		if free, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			free.Close()
			return p, ln
		}
		ln.Close()
	}
	t.Fatal("no free pair of ports")
	return 0, nil
}
