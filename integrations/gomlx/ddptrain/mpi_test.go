package ddptrain_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/internal/mpitest"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/mpi"
)

// The flags of a rank of TestEquivalenceMPI's jobs: the test binary, built
// with the mpi tag, runs TestMPIRank as every rank under mpirun.
var (
	mpiJob = flag.String("ddptrain.job", "", "TestMPIRank's job: sgd, adam, shard-adam, shard-elements-adam or fail")
	mpiOut = flag.String("ddptrain.out", "", "TestMPIRank writes its result to this file, .rankN appended")
)

const mpiSteps = 6

// TestEquivalenceMPI is TestEquivalence across 2 processes under mpirun,
// one rank each, over package mpi: rank 0's state after every step, with
// SGD and with Adam, is within the derived bound of plain GoMLX's, and
// rank 1's equals rank 0's bit for bit. A third job makes rank 1's model
// panic in step 3: both processes must fail in that step, rank 0 with
// ErrPeer naming rank 1, within the test's deadline. Two more train with
// Adam sharded, by whole variables (ShardParams) and by elements
// (ShardElements): both ranks' weights after every step must be the
// unsharded Adam job's bit for bit (with 2 processes the mpi backend's
// reduce-scatter sums each element as its all-reduce does). It is skipped
// where Open MPI is missing (failed under DDPGO_REQUIRE_MPI=1).
func TestEquivalenceMPI(t *testing.T) {
	if *mpiJob != "" {
		t.Skip("a rank of an mpirun job: see TestMPIRank")
	}
	mpirun := mpitest.Mpirun(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "ddptrain.test")
	if out, err := exec.CommandContext(ctx, "go", "test", "-c", "-tags", "mpi", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go test -c -tags mpi: %v\n%s", err, out)
	}
	p := newLSQ(mpiSteps, 1)
	results := map[string][]state{}
	for _, job := range []string{"sgd", "adam", "shard-adam", "shard-elements-adam", "fail"} {
		t.Run(job, func(t *testing.T) {
			out := filepath.Join(dir, job)
			jctx, jcancel := context.WithTimeout(ctx, 2*time.Minute)
			defer jcancel()
			stdout, stderr := mpitest.Run(jctx, t, mpirun, 2, bin, "-test.run=^TestMPIRank$", "-ddptrain.job="+job, "-ddptrain.out="+out)
			if testing.Verbose() {
				t.Logf("mpirun -np 2:\n%s%s", stdout, stderr)
			}
			if job == "fail" {
				checkMPIFailure(t, out)
				return
			}
			var ranks [2][]state
			for r := range ranks {
				ranks[r] = readStates(t, fmt.Sprintf("%s.rank%d", out, r))
			}
			if len(ranks[0]) != mpiSteps || len(ranks[1]) != mpiSteps {
				t.Fatalf("ranks wrote %d and %d states, want %d", len(ranks[0]), len(ranks[1]), mpiSteps)
			}
			for k := range mpiSteps {
				if !sameState(ranks[0][k], ranks[1][k]) {
					t.Fatalf("after step %d rank 1's variables differ from rank 0's", k+1)
				}
			}
			results[job] = ranks[0]
			if strings.HasPrefix(job, "shard-") {
				unsharded := results["adam"]
				for k := range mpiSteps {
					if !sameState(ranks[0][k], state{w: unsharded[k].w}) {
						t.Fatalf("after step %d the sharded run's weights differ from the unsharded run's", k+1)
					}
				}
				return
			}
			checkBound(t, p, job, 2, runPlain(t, p, run{kind: job, steps: mpiSteps}), ranks[0], 1)
		})
	}
}

// checkMPIFailure reads the errors the ranks of the "fail" job wrote.
func checkMPIFailure(t *testing.T, out string) {
	t.Helper()
	var msgs [2]string
	for r := range msgs {
		b, err := os.ReadFile(fmt.Sprintf("%s.rank%d", out, r))
		if err != nil {
			t.Fatal(err)
		}
		msgs[r] = string(b)
	}
	if !strings.Contains(msgs[0], "a peer rank failed") || !strings.Contains(msgs[0], "step 3: rank 1 failed") {
		t.Errorf("rank 0: %q, want ErrPeer naming rank 1 in step 3", msgs[0])
	}
	if !strings.Contains(msgs[1], "graph failed") || !strings.Contains(msgs[1], "step 3") || !strings.Contains(msgs[1], "model exploded") {
		t.Errorf("rank 1: %q, want ErrGraph in step 3 with the panic", msgs[1])
	}
	t.Logf("rank 0: %s\nrank 1: %s", msgs[0], msgs[1])
}

// TestMPIRank is one rank of a TestEquivalenceMPI job, run under mpirun.
func TestMPIRank(t *testing.T) {
	if *mpiJob == "" {
		t.Skip("run by TestEquivalenceMPI under mpirun")
	}
	if !mpi.LibraryInfo().Built {
		t.Fatal("this test binary was built without the mpi tag")
	}
	defer func() {
		if err := mpi.Finalize(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := launch.Open(ctx, "mpi", launch.Options{Config: mpi.Options{Blocking: true}})
	if err != nil {
		t.Fatal(err)
	}
	c := cs[0]
	defer c.Close()
	out := fmt.Sprintf("%s.rank%d", *mpiOut, c.Rank())
	p := newLSQ(mpiSteps, 1)
	if *mpiJob != "fail" {
		rn := run{kind: *mpiJob, steps: mpiSteps, o: smallBuckets}
		switch rn.kind {
		case "shard-adam":
			rn.kind = "adam"
			rn.o.Reducer.Shard = ddp.ShardParams
		case "shard-elements-adam":
			rn.kind = "adam"
			rn.o.Reducer.Shard = ddp.ShardElements
		}
		states, err := trainRank(ctx, t, c, newBackend(t), p, rn)
		if err != nil {
			t.Fatal(err)
		}
		writeStates(t, out, states)
		return
	}
	// Rank 1's model panics in step 3; every rank must fail in that step.
	_, err = faultyRank(ctx, c, newBackend(t), p, 1, 3, "panic", false, smallBuckets)
	if err == nil {
		err = errors.New("no error")
	}
	if werr := os.WriteFile(out, []byte(err.Error()), 0o644); werr != nil {
		t.Fatal(werr)
	}
}

// wireState is a state as JSON carries it (float64 values round-trip
// exactly).
type wireState struct{ W, M, V [][]float64 }

func writeStates(t testing.TB, path string, states []state) {
	t.Helper()
	w := make([]wireState, len(states))
	for i, s := range states {
		w[i] = wireState{s.w, s.m, s.v}
	}
	b, err := json.Marshal(w)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func readStates(t testing.TB, path string) []state {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var w []wireState
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	out := make([]state, len(w))
	for i, s := range w {
		out[i] = state{s.W, s.M, s.V}
	}
	return out
}
