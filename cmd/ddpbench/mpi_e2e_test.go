package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
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
}
