package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/internal/invariants"
	"github.com/ddpgo/ddpgo/trace/tracetest"
)

// testData returns the training and test sets of the default split.
func testData(t testing.TB) (train, test *dataset) {
	t.Helper()
	ds, err := loadDigits("")
	if err != nil {
		t.Fatal(err)
	}
	return ds.split(defaultConfig().Seed, trainFraction)
}

// maxDiff returns the largest absolute difference between two models'
// parameters and where it is.
func maxDiff(a, b *mlp) (d float64, param, index int) {
	for p := range numParams {
		for k := range a.w[p] {
			if v := math.Abs(float64(a.w[p][k]) - float64(b.w[p][k])); v > d {
				d, param, index = v, p, k
			}
		}
	}
	return d, param, index
}

// TestRanksMatchOneProcess trains the same configuration on 1, 2 and 4
// ranks and on the single-process reference loop: every rank's replica must
// be identical to its peers' and within 1e-5 of the reference, since with
// equal shards the average of the shards' mean gradients is the mean
// gradient of the global batch.
func TestRanksMatchOneProcess(t *testing.T) {
	train, _ := testData(t)
	cfg := defaultConfig()
	cfg.Epochs = 2
	if invariants.RaceEnabled {
		cfg.Epochs, cfg.Hidden = 1, 32
		train = train.subset(seq(8 * cfg.Batch))
	}
	ref := trainLocal(train, cfg, nil)
	for _, ranks := range []int{1, 2, 4} {
		cfg.Ranks = ranks
		models, err := trainGroup(context.Background(), train, cfg, observer{})
		if err != nil {
			t.Fatalf("%d ranks: %v", ranks, err)
		}
		names, _ := ref.shapes()
		for r, m := range models {
			for p := range numParams {
				if !slices.Equal(m.w[p], models[0].w[p]) {
					t.Fatalf("%d ranks: rank %d's %s differs from rank 0's", ranks, r, names[p])
				}
			}
		}
		d, p, k := maxDiff(models[0], ref)
		t.Logf("%d ranks: max |w - w_reference| = %.3g (%s[%d])", ranks, d, names[p], k)
		if d > 1e-5 {
			t.Errorf("%d ranks: %s[%d] differs from the single-process run by %.3g > 1e-5", ranks, names[p], k, d)
		}
		if d, _, _ := maxDiff(models[0], newMLP(cfg.Seed, Pixels, cfg.Hidden, Classes)); d < 0.01 {
			t.Errorf("%d ranks: the weights moved by at most %.3g: nothing was trained", ranks, d)
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestAccuracy trains the default configuration (4 ranks) with each hook:
// the test accuracy must reach 95%, and compressing gradients to fp16 or
// bf16 must cost at most one accuracy point against fp32.
func TestAccuracy(t *testing.T) {
	if invariants.RaceEnabled {
		t.Skip("numerics only; the race detector makes it slow (TestRanksMatchOneProcess covers the concurrency)")
	}
	train, test := testData(t)
	acc := map[string]float64{}
	for _, hook := range []string{"none", "fp16", "bf16"} {
		cfg := defaultConfig()
		cfg.Hook = hook
		models, err := trainGroup(context.Background(), train, cfg, observer{})
		if err != nil {
			t.Fatalf("hook %s: %v", hook, err)
		}
		_, acc[hook] = models[0].evaluate(test, 256)
		t.Logf("hook %s: test accuracy %.2f%%", hook, 100*acc[hook])
		if acc[hook] < 0.95 {
			t.Errorf("hook %s: test accuracy %.2f%% < 95%%", hook, 100*acc[hook])
		}
	}
	for _, hook := range []string{"fp16", "bf16"} {
		if d := math.Abs(acc[hook] - acc["none"]); d > 0.01 {
			t.Errorf("hook %s: test accuracy %.2f%% is %.2f points from fp32's %.2f%%", hook, 100*acc[hook], 100*d, 100*acc["none"])
		}
	}
}

// TestShardMatchesUnsharded trains with -shard and without, with
// momentum and Adam, on 1, 2 and 4 ranks: the loss after every epoch
// and the final weights of every rank must be the same bits, since the
// reduce-scatter leaves each rank the averaged gradient bits the
// all-reduce does and the optimizers are elementwise; and each rank
// must keep at most a quarter of the state (plus an element a bucket)
// with 4 ranks.
func TestShardMatchesUnsharded(t *testing.T) {
	train, _ := testData(t)
	cfg := defaultConfig()
	cfg.Epochs = 2
	if invariants.RaceEnabled {
		cfg.Epochs, cfg.Hidden = 1, 32
		train = train.subset(seq(8 * cfg.Batch))
	}
	for _, opt := range []string{"momentum", "adam"} {
		for _, ranks := range []int{1, 2, 4} {
			cfg.Optimizer, cfg.Ranks, cfg.LR = opt, ranks, 0.05
			if opt == "adam" {
				cfg.LR = 0.002
			}
			type run struct {
				losses []float64
				models []*mlp
				state  []int
			}
			runs := make([]run, 2)
			for i, shard := range []bool{false, true} {
				cfg.Shard = shard
				r := &runs[i]
				r.state = make([]int, ranks)
				obs := observer{
					epoch: func(_ int, m *mlp) {
						loss, _ := m.evaluate(train, 256)
						r.losses = append(r.losses, loss)
					},
					state: func(rank, bytes int) { r.state[rank] = bytes },
				}
				var err error
				if r.models, err = trainGroup(context.Background(), train, cfg, obs); err != nil {
					t.Fatalf("%s, %d ranks, shard %v: %v", opt, ranks, shard, err)
				}
			}
			plain, sharded := runs[0], runs[1]
			for e := range plain.losses {
				if math.Float64bits(sharded.losses[e]) != math.Float64bits(plain.losses[e]) {
					t.Errorf("%s, %d ranks: epoch %d's loss is %v sharded, %v not", opt, ranks, e+1, sharded.losses[e], plain.losses[e])
				}
			}
			names, _ := plain.models[0].shapes()
			for r := range ranks {
				for p := range numParams {
					if !slices.Equal(bitsOf(sharded.models[r].w[p]), bitsOf(plain.models[r].w[p])) {
						t.Fatalf("%s, %d ranks: rank %d's %s differs between the sharded and the plain run", opt, ranks, r, names[p])
					}
				}
				// Each layer has a bucket of its own (bucketCap): a
				// rank's share is 1/N of it, rounded up.
				buckets := 2
				if limit := plain.state[r]/ranks + 4*buckets*(1+boolInt(opt == "adam")); sharded.state[r] > limit {
					t.Errorf("%s, %d ranks: rank %d keeps %d bytes of optimizer state sharded, %d not: over %d", opt, ranks, r, sharded.state[r], plain.state[r], limit)
				}
			}
			t.Logf("%s, %d ranks: final train loss %.4f, rank 0 keeps %d of %d bytes of state", opt, ranks, plain.losses[len(plain.losses)-1], sharded.state[0], plain.state[0])
		}
	}
}

func bitsOf(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for j, x := range v {
		b[j] = math.Float32bits(x)
	}
	return b
}

// TestPowerSGDAccuracy trains the default configuration with PowerSGD at
// ranks 1, 2 and 4, compressing from the first step: the test accuracy
// must be within half a point of fp32's (one test image is 0.28 points),
// the replicas must agree bit for bit, and the compressed steps must send
// less than a fifth of fp32's bytes.
func TestPowerSGDAccuracy(t *testing.T) {
	if invariants.RaceEnabled {
		t.Skip("numerics only; the race detector makes it slow (the hooks package tests PowerSGD under it)")
	}
	train, test := testData(t)
	cfg := defaultConfig()
	ref, err := trainGroup(context.Background(), train, cfg, observer{})
	if err != nil {
		t.Fatal(err)
	}
	_, fp32 := ref[0].evaluate(test, 256)
	var fp32Bytes int64
	cfg.Epochs = 1
	if _, err := trainGroup(context.Background(), train, cfg, observer{step: func(rank int, s *ddp.StepStats) {
		if rank == 0 {
			fp32Bytes = s.Bytes
		}
	}}); err != nil {
		t.Fatal(err)
	}
	for _, rank := range []int{1, 2, 4} {
		cfg := defaultConfig()
		cfg.Hook, cfg.PowerSGDRank, cfg.PowerSGDStart = "powersgd", rank, 0
		var wire int64
		models, err := trainGroup(context.Background(), train, cfg, observer{step: func(r int, s *ddp.StepStats) {
			if r == 0 {
				wire = s.Bytes
			}
		}})
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		names, _ := models[0].shapes()
		for r, m := range models {
			for p := range numParams {
				if !slices.Equal(m.w[p], models[0].w[p]) {
					t.Fatalf("powersgd rank %d: replica %d's %s differs from replica 0's", rank, r, names[p])
				}
			}
		}
		_, acc := models[0].evaluate(test, 256)
		t.Logf("powersgd rank %d: test accuracy %.2f%% (fp32 %.2f%%), %d bytes a step on the wire (fp32 %d)", rank, 100*acc, 100*fp32, wire, fp32Bytes)
		if d := math.Abs(acc - fp32); d > 0.005 {
			t.Errorf("powersgd rank %d: test accuracy %.2f%% is %.2f points from fp32's %.2f%%", rank, 100*acc, 100*d, 100*fp32)
		}
		if wire <= 0 || 5*wire >= fp32Bytes {
			t.Errorf("powersgd rank %d: %d bytes a step on the wire, fp32 %d: want under a fifth", rank, wire, fp32Bytes)
		}
	}
}

func TestRunPrintsEpochs(t *testing.T) {
	cfg := defaultConfig()
	cfg.Epochs, cfg.Ranks = 2, 2
	var out bytes.Buffer
	if err := run(&out, cfg); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "epoch   1 ") || !strings.HasPrefix(lines[2], "epoch   2 ") {
		t.Fatalf("output:\n%s", out.String())
	}
	for _, want := range []string{"train loss", "test loss", "acc"} {
		if !strings.Contains(lines[2], want) {
			t.Errorf("epoch line %q lacks %q", lines[2], want)
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, edit := range []func(*config){
		func(c *config) { c.Ranks, c.Batch = 3, 64 },
		func(c *config) { c.Hook = "int8" },
		func(c *config) { c.Batch = 4096 },
	} {
		cfg := defaultConfig()
		cfg.Epochs = 1
		edit(&cfg)
		if err := run(&bytes.Buffer{}, cfg); !errors.Is(err, errConfig) {
			t.Errorf("run(%+v) = %v, want errConfig", cfg, err)
		}
	}
}

// TestRunWritesTrace runs the command with -stats and -trace and checks the
// timeline strictly: every rank's steps 2..4 with an arrow per bucket.
func TestRunWritesTrace(t *testing.T) {
	cfg := defaultConfig()
	cfg.Epochs, cfg.Ranks, cfg.Stats = 1, 2, true
	cfg.Trace = filepath.Join(t.TempDir(), "trace.json")
	var out bytes.Buffer
	if err := run(&out, cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "% hidden)") {
		t.Errorf("-stats printed no step timings:\n%s", out.String())
	}
	f, err := os.Open(cfg.Trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sum, err := tracetest.Validate(f)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sum.Pids, []int{1, 2}) {
		t.Errorf("trace has processes %v, want ranks 0 and 1 as pids 1 and 2", sum.Pids)
	}
	const buckets = 2 // {b2, W2} and {b1, W1} under bucketCap
	if want := cfg.Ranks * traceSteps * buckets; sum.Flows != want {
		t.Errorf("trace has %d arrows, want %d", sum.Flows, want)
	}
	if want := cfg.Ranks * traceSteps * int(numParams); sum.Phases["i"] != want {
		t.Errorf("trace has %d ready marks, want %d", sum.Phases["i"], want)
	}
}
