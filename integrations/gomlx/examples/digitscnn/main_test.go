package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/internal/mpitest"
)

// testEpochs is how long the tests train: enough for 95% on the test set.
const testEpochs = 4

// TestTrains trains the network for testEpochs epochs over 2 ranks in
// this process, then with fp16 compression, then over 2 processes under
// mpirun (where Open MPI is installed), and checks that each reaches 95%
// test accuracy and prints the step's parts every epoch. The processes
// shard the data as the goroutines do and average 2 ranks' gradients as
// inproc does, bit for bit, so the mpirun job prints the in-process
// run's losses and accuracies.
func TestTrains(t *testing.T) {
	cfg := defaultConfig()
	cfg.Epochs = testEpochs
	cfg.Simplego = "ops_sequential" // deterministic, and clean under the race detector
	var inproc string
	for _, compression := range []string{"none", "fp16"} {
		cfg.Compression = compression
		var out bytes.Buffer
		if err := run(context.Background(), &out, cfg); err != nil {
			t.Fatalf("compression %s: %v\n%s", compression, err, out.String())
		}
		t.Logf("2 ranks in process, compression %s:\n%s", compression, out.String())
		checkRun(t, out.String(), "2 ranks (in this process)")
		if compression == "none" {
			inproc = out.String()
		}
	}

	mpirun := mpitest.Mpirun(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "digitscnn")
	mpitest.Build(ctx, t, ".", bin)
	out, _ := mpitest.Run(ctx, t, mpirun, 2, bin, "-backend", "mpi", "-epochs", strconv.Itoa(testEpochs), "-simplego", "ops_sequential")
	t.Logf("2 processes under mpirun:\n%s", out)
	checkRun(t, out, "2 ranks (a process each, over MPI)")
	if got, want := results(out), results(inproc); got != want {
		t.Errorf("under mpirun rank 0 printed\n%s\nthe in-process run\n%s", got, want)
	}
}

var epochLine = regexp.MustCompile(`^epoch +(\d+) +loss ([0-9.]+) +test acc +([0-9.]+)% +step [0-9.]+ ms: graph [0-9.]+ ms, hand-off [0-9.]+ ms, reduction [0-9.]+ ms, optimizer [0-9.]+ ms$`)

// checkRun checks a run's output: the header names the ranks, every epoch
// prints its line with the step's four parts, and the last reaches 95%.
func checkRun(t *testing.T, out, ranks string) {
	t.Helper()
	if !strings.Contains(out, ranks) {
		t.Errorf("the header does not say %q:\n%s", ranks, out)
	}
	epochs, acc := 0, 0.0
	for _, l := range strings.Split(out, "\n") {
		if m := epochLine.FindStringSubmatch(l); m != nil {
			epochs++
			acc, _ = strconv.ParseFloat(m[3], 64)
		} else if strings.HasPrefix(l, "epoch") {
			t.Errorf("epoch line %q lacks a part of the step", l)
		}
	}
	if epochs != testEpochs {
		t.Errorf("%d epoch lines, want %d:\n%s", epochs, testEpochs, out)
	}
	if acc < 95 {
		t.Errorf("test accuracy %.2f%% after %d epochs, want at least 95%%:\n%s", acc, testEpochs, out)
	}
}

// results is the losses and accuracies of a run's epoch lines.
func results(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if m := epochLine.FindStringSubmatch(l); m != nil {
			fmt.Fprintf(&b, "epoch %s loss %s acc %s\n", m[1], m[2], m[3])
		}
	}
	return b.String()
}

// TestShardFlag: -shard trains with the optimizer sharded, by whole
// variables (params) and by elements, and each rank reports the state it
// keeps: together, every variable's (params), or each rank about half of
// Adam's two moments of the model and together all of them (elements).
func TestShardFlag(t *testing.T) {
	for _, mode := range []string{"params", "elements"} {
		cfg := defaultConfig()
		cfg.Simplego = "ops_sequential"
		cfg.Shard, cfg.Steps, cfg.Warmup = mode, 3, 1
		var out bytes.Buffer
		if err := run(context.Background(), &out, cfg); err != nil {
			t.Fatalf("-shard %s: %v\n%s", mode, err, out.String())
		}
		owned, state := 0, 0
		for r := range 2 {
			m := regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d \(-shard %s\): elements of (\d+) of (\d+) variables, optimizer state (\d+) bytes \(the variables: (\d+) bytes\)`, r, mode)).FindStringSubmatch(out.String())
			if m == nil {
				t.Fatalf("no -shard line for rank %d:\n%s", r, out.String())
			}
			n, _ := strconv.Atoi(m[1])
			total, _ := strconv.Atoi(m[2])
			mine, _ := strconv.Atoi(m[3])
			all, _ := strconv.Atoi(m[4])
			owned, state = owned+n, state+mine
			const scalars = 20 // the step counters and the learning rate, on every rank
			switch {
			case mode == "params" && r == 1 && owned != total:
				t.Errorf("the ranks own %d of %d variables:\n%s", owned, total, out.String())
			case mode == "elements" && (mine-scalars > all+4*total || r == 1 && state-2*scalars != 2*all):
				t.Errorf("rank %d keeps %d bytes of state, the ranks %d, for %d bytes of variables: want about half and all of Adam's two moments:\n%s", r, mine, state, all, out.String())
			}
		}
	}
}

// TestCompareShard: -compare with -shard takes turns between plain
// GoMLX, ddptrain and ddptrain sharded, and prints each one's medians
// (the sharded one's with its gather) and the sharded step against the
// unsharded one.
func TestCompareShard(t *testing.T) {
	cfg := defaultConfig()
	cfg.Simplego = "ops_sequential"
	cfg.Compare, cfg.Shard, cfg.Steps, cfg.Warmup = true, "elements", 4, 1
	var out bytes.Buffer
	if err := run(context.Background(), &out, cfg); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("\n%s", out.String())
	for _, re := range []string{
		`(?m)^plain:  steps 4 \(3 timed\): median step [0-9.]+ ms;`,
		`(?m)^ddpgo:  steps 4 \(3 timed\): median step [0-9.]+ ms; graph [0-9.]+ ms, hand-off [0-9.]+ ms, reduction [0-9.]+ ms, optimizer [0-9.]+ ms;`,
		`(?m)^ddpgo -shard elements:  steps 4 \(3 timed\): median step [0-9.]+ ms; graph [0-9.]+ ms, hand-off [0-9.]+ ms, reduction [0-9.]+ ms, optimizer [0-9.]+ ms, gather [0-9.]+ ms;`,
		`(?m)^ddpgo -shard elements against ddpgo, turn by turn \(medians of 3 steps' ratios\): step [0-9.]+x, optimizer graph \(the slowest rank's\) [0-9.]+x$`,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("no line matches %s", re)
		}
	}
	if l := regexp.MustCompile(`(?m)^ddpgo:  .*$`).FindString(out.String()); strings.Contains(l, "gather") {
		t.Errorf("the unsharded line reports a gather: %s", l)
	}
}
