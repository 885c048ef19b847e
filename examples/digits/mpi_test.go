package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/internal/mpitest"
)

// TestMPIMatchesInproc builds the example with the mpi tag and trains it
// under mpirun with 2 and 4 processes: rank 0 alone prints, its epoch
// lines (losses and accuracies) are those of the in-process run with the
// same rank count, and its final weights are that run's bit for bit: on
// one host the backend's all-reduces run on the shared-memory engine that
// inproc runs on, with the same kernels in the same rank order. Both runs
// shard the data by rank with the same sampler, so they are the same
// computation.
func TestMPIMatchesInproc(t *testing.T) {
	mpirun := mpitest.Mpirun(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "digits")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	mpitest.Build(ctx, t, ".", bin)
	for _, np := range []int{2, 4} {
		cfg := defaultConfig()
		cfg.Epochs, cfg.Ranks = 3, np
		cfg.Save = filepath.Join(dir, fmt.Sprintf("inproc%d.bin", np))
		var want bytes.Buffer
		if err := run(&want, cfg); err != nil {
			t.Fatal(err)
		}
		saved := filepath.Join(dir, fmt.Sprintf("mpi%d.bin", np))
		out, _ := mpitest.Run(ctx, t, mpirun, np, bin, "-backend", "mpi", "-epochs", "3", "-save", saved)
		if !strings.Contains(out, fmt.Sprintf("%d ranks (a process each, over MPI)", np)) {
			t.Errorf("-np %d: the header does not name %d ranks over MPI:\n%s", np, np, out)
		}
		if got, want := epochLines(out), epochLines(want.String()); got != want || strings.Count(got, "\n") != 3 {
			t.Errorf("-np %d: rank 0 printed\n%s\nwant (inproc, %d ranks)\n%s", np, got, np, want)
		}
		a, b := readWeights(t, saved), readWeights(t, cfg.Save)
		if len(a) != len(b) || len(a) == 0 {
			t.Fatalf("-np %d: %d weights saved, inproc %d", np, len(a), len(b))
		}
		worst, at := 0.0, 0
		for i := range a {
			if d := math.Abs(float64(a[i]) - float64(b[i])); d > worst {
				worst, at = d, i
			}
		}
		t.Logf("-np %d: max |w_mpi - w_inproc| = %.3g (weight %d)", np, worst, at)
		if worst != 0 {
			t.Errorf("-np %d: weight %d is %g over MPI, %g in process: %.3g apart; on one host the backend reduces as inproc does, bit for bit", np, at, a[at], b[at], worst)
		}
	}

	// PowerSGD over MPI: two processes compute what two goroutines do,
	// bit for bit (its all-reduces are sums, which MPI's two-rank sum
	// makes as inproc does, and every rank derives the average from them
	// alone, in deterministic kernels).
	{
		cfg := defaultConfig()
		cfg.Epochs, cfg.Ranks, cfg.Hook, cfg.PowerSGDStart = 3, 2, "powersgd", 0
		cfg.Save = filepath.Join(dir, "inproc_powersgd.bin")
		var want bytes.Buffer
		if err := run(&want, cfg); err != nil {
			t.Fatal(err)
		}
		saved := filepath.Join(dir, "mpi_powersgd.bin")
		out, _ := mpitest.Run(ctx, t, mpirun, 2, bin, "-backend", "mpi", "-epochs", "3", "-hook", "powersgd", "-powersgd-start", "0", "-save", saved)
		if got, want := epochLines(out), epochLines(want.String()); got != want {
			t.Errorf("powersgd -np 2: rank 0 printed\n%s\nwant (inproc)\n%s", got, want)
		}
		a, b := readWeights(t, saved), readWeights(t, cfg.Save)
		if !slices.Equal(a, b) || len(a) == 0 {
			t.Errorf("powersgd -np 2: the weights differ from the in-process run's (%d and %d weights)", len(a), len(b))
		}
	}

	// Sharded optimizer state over MPI (-shard, with Adam): the processes
	// compute what the goroutines do, bit for bit: on one host the
	// backend's reduce-scatters and all-gathers run on the engine too,
	// reducing in rank order as its all-reduces do.
	for _, np := range []int{2, 4} {
		cfg := defaultConfig()
		cfg.Epochs, cfg.Ranks, cfg.Shard, cfg.Optimizer, cfg.LR = 3, np, true, "adam", 0.002
		cfg.Save = filepath.Join(dir, fmt.Sprintf("inproc_shard%d.bin", np))
		var want bytes.Buffer
		if err := run(&want, cfg); err != nil {
			t.Fatal(err)
		}
		saved := filepath.Join(dir, fmt.Sprintf("mpi_shard%d.bin", np))
		out, _ := mpitest.Run(ctx, t, mpirun, np, bin, "-backend", "mpi", "-epochs", "3", "-shard", "-opt", "adam", "-lr", "0.002", "-save", saved)
		if got, want := epochLines(out), epochLines(want.String()); got != want || strings.Count(got, "\n") != 3 {
			t.Errorf("-shard -np %d: rank 0 printed\n%s\nwant (inproc)\n%s", np, got, want)
		}
		a, b := readWeights(t, saved), readWeights(t, cfg.Save)
		if len(a) != len(b) || len(a) == 0 {
			t.Fatalf("-shard -np %d: %d weights saved, inproc %d", np, len(a), len(b))
		}
		worst := 0.0
		for i := range a {
			worst = max(worst, math.Abs(float64(a[i])-float64(b[i])))
		}
		t.Logf("-shard -np %d: max |w_mpi - w_inproc| = %.3g", np, worst)
		if worst != 0 {
			t.Errorf("-shard -np %d: the weights differ from the in-process run's by %.3g", np, worst)
		}
	}

	// A rank that cannot create its -trace file (here rank 1's alone, a
	// directory in its way) fails before training, and its peer with it
	// instead of waiting for it in a collective, well within the deadline.
	if err := os.Mkdir(filepath.Join(dir, "t.rank1.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(ctx, time.Minute)
	defer fcancel()
	out, err := mpitest.Job(fctx, mpirun, 2, bin, "-backend", "mpi", "-epochs", "1", "-trace", filepath.Join(dir, "t.json")).CombinedOutput()
	if err == nil || fctx.Err() != nil || !strings.Contains(string(out), "t.rank1.json: is a directory") ||
		!strings.Contains(string(out), "rank 0: rank 1 of 2 failed before training") {
		t.Errorf("-np 2, rank 1's -trace file blocked: %v (deadline: %v), want both ranks to fail at once, naming the file and rank 1:\n%s", err, fctx.Err(), out)
	}

	// A -ranks other than the job's size fails on every rank, naming both.
	out, err = mpitest.Job(fctx, mpirun, 2, bin, "-backend", "mpi", "-ranks", "4", "-epochs", "1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "-ranks 4, but the job has 2 processes") {
		t.Errorf("-np 2 with -ranks 4: %v, want a failure naming -ranks 4 and the 2 processes:\n%s", err, out)
	}
}

// epochLines returns the lines of out that report an epoch.
func epochLines(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "epoch ") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func readWeights(t *testing.T, path string) []float32 {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	w := make([]float32, len(raw)/4)
	for i := range w {
		w[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return w
}
