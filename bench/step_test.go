package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/invariants"
)

func tinyParams() []ddp.Param {
	return []ddp.Param{
		{Name: "a.weight", Shape: []int{64, 32}}, {Name: "a.bias", Shape: []int{64}},
		{Name: "b.weight", Shape: []int{1000, 300}}, {Name: "b.bias", Shape: []int{1000}},
	}
}

func TestRun(t *testing.T) {
	tests := []struct {
		name     string
		ranks    int
		hook     string
		compute  Compute
		copy     bool
		wireFrac int64 // grad bytes / wire bytes
	}{
		{"none", 2, "none", ComputeNone, false, 1},
		{"fp16 sleep", 2, "fp16", ComputeSleep, false, 2},
		{"bf16 spin 3 ranks copy", 3, "bf16", ComputeSpin, true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			hook, err := NewHook(tt.hook)
			if err != nil {
				t.Fatal(err)
			}
			var onStep [4]int
			cfg := Config{Params: tinyParams(), Comms: group(t, tt.ranks), BucketCap: 256 << 10, FirstBucketCap: 16 << 10,
				Hook: hook, CopyGrads: tt.copy, Steps: 4, Warmup: 2, Compute: tt.compute, Rate: 303112 / 2e-3, TraceSteps: 2,
				OnStep: func(rank int, measured bool, s *ddp.StepStats) {
					if measured {
						onStep[rank]++
					}
				}}
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Numel != 303112 || res.GradBytes != 4*303112 || res.WireBytes != res.GradBytes/tt.wireFrac {
				t.Errorf("numel %d grad bytes %d wire bytes %d", res.Numel, res.GradBytes, res.WireBytes)
			}
			var sum int64
			for _, b := range res.Buckets {
				sum += b
			}
			if sum != res.GradBytes || len(res.Buckets) < 2 {
				t.Errorf("buckets %v", res.Buckets)
			}
			if len(res.Trace) != 2 || len(res.Trace[0]) != tt.ranks || res.Trace[1][0].Step != res.Trace[0][0].Step+1 {
				t.Errorf("trace: %d steps", len(res.Trace))
			}
			for s := range res.Trace {
				for r, st := range res.Trace[s] {
					if st.Wall <= 0 || len(st.Buckets) != len(res.Buckets) || len(st.ParamReady) != 4 {
						t.Errorf("trace step %d rank %d: wall %v, %d buckets, %d ready marks", s, r, st.Wall, len(st.Buckets), len(st.ParamReady))
					}
				}
			}
			for r := range tt.ranks {
				if onStep[r] != 4 {
					t.Errorf("rank %d: OnStep called %d times for measured steps, want 4", r, onStep[r])
				}
			}
			d := res.StepTime
			if !(d.P10 <= d.Median && d.Median <= d.P90 && d.P10 > 0) || res.IterTime.Median < d.P10 {
				t.Errorf("step time %+v, iteration %+v", d, res.IterTime)
			}
			if tt.compute == ComputeNone && res.ComputeTarget != 0 || tt.compute != ComputeNone && math.Abs(res.ComputeTarget-2e-3) > 1e-9 {
				t.Errorf("compute target %g", res.ComputeTarget)
			}
			if tt.compute != ComputeNone && res.ComputeTime.Median < 1.5e-3 {
				// The schedule's last deadline is the target: the first
				// ready mark comes after the first parameter's share.
				t.Errorf("compute %v, want about 2ms", res.ComputeTime.Median)
			}
			if r := res.OverlapRatio; r.P10 < 0 || r.P90 > 1 || res.AllocsPerStep < 0 {
				t.Errorf("overlap %+v allocs %g", r, res.AllocsPerStep)
			}
			// Every goroutine the run started has exited (the group's own
			// are closed by the cleanup).
			if n := runtime.NumGoroutine(); n > before+tt.ranks*8 {
				t.Errorf("%d goroutines after the run, %d before", n, before)
			}
		})
	}
}

// TestRunNoTrace checks that a run keeps no per-step statistics when it
// traces nothing, whatever TraceSteps says.
func TestRunNoTrace(t *testing.T) {
	for _, ts := range []int{0, -1} {
		res, err := Run(context.Background(), Config{Params: tinyParams(), Comms: group(t, 2), Steps: 2, TraceSteps: ts})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Trace) != 0 || res.StepTime.Median <= 0 {
			t.Errorf("TraceSteps %d: %d traced steps, step time %v", ts, len(res.Trace), res.StepTime)
		}
	}
}

// TestRunChecksEveryStep: a backend that reduces with the wrong operation
// (Max instead of the average) from the third step on fails the run with
// ErrCheck, naming the rank and parameter, although the first steps were
// right.
func TestRunChecksEveryStep(t *testing.T) {
	cs := group(t, 2)
	var calls atomic.Int64
	for i, c := range cs {
		cs[i] = maxComm{c, &calls}
	}
	_, err := Run(context.Background(), Config{Params: tinyParams(), Comms: cs, Steps: 4, Warmup: 1, Hook: hooks.AllReduce})
	if !errors.Is(err, ErrCheck) || !strings.Contains(err.Error(), "param ") {
		t.Fatalf("Run = %v; want ErrCheck naming a parameter", err)
	}
}

// maxComm reduces with Max once both ranks have made four all-reduces
// (past New's checks and the first steps).
type maxComm struct {
	comm.Communicator
	calls *atomic.Int64
}

func (c maxComm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	if c.calls.Add(1) > 8 {
		op = comm.Max
	}
	return c.Communicator.AllReduce(send, recv, op)
}

func TestRunConfigErrors(t *testing.T) {
	g := group(t, 2)
	ok := Config{Params: tinyParams(), Comms: g, Steps: 1}
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"no ranks", func(c *Config) { c.Comms = nil }},
		{"no params", func(c *Config) { c.Params = nil }},
		{"no steps", func(c *Config) { c.Steps = 0 }},
		{"negative warmup", func(c *Config) { c.Warmup = -1 }},
		{"no rate", func(c *Config) { c.Compute = ComputeSleep }},
		{"infinite rate", func(c *Config) { c.Compute, c.Rate = ComputeSpin, math.Inf(1) }},
		{"pools", func(c *Config) { c.Pools = make([]*allocator.Pool, 1) }},
	}
	for _, tt := range tests {
		cfg := ok
		tt.mutate(&cfg)
		if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", tt.name, err)
		}
	}
}

func TestDist(t *testing.T) {
	d := dist([]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	if d.Median != 5.5 || d.P10 != 1 || d.P90 != 9 || d.Mean != 5.5 {
		t.Errorf("dist %+v", d)
	}
	if d := dist([]float64{3}); d.Median != 3 || d.P10 != 3 || d.P90 != 3 {
		t.Errorf("dist of one %+v", d)
	}
	if d := dist(nil); d != (Dist{}) {
		t.Errorf("dist of none %+v", d)
	}
}

func TestParseCompute(t *testing.T) {
	for _, c := range []Compute{ComputeNone, ComputeSleep, ComputeSpin} {
		if got, err := ParseCompute(c.String()); err != nil || got != c {
			t.Errorf("ParseCompute(%q) = %v, %v", c, got, err)
		}
	}
	if _, err := ParseCompute("busy"); !errors.Is(err, ErrConfig) {
		t.Errorf("busy: %v", err)
	}
	if _, err := NewHook("int8"); !errors.Is(err, ErrConfig) {
		t.Errorf("int8: %v", err)
	}
}

// TestRunAllocations checks that a warm step allocates nothing: the
// driver's own bookkeeping included, the process makes well under one
// allocation per step.
func TestRunAllocations(t *testing.T) {
	if invariants.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	res, err := Run(context.Background(), Config{Params: tinyParams(), Comms: group(t, 2), BucketCap: 256 << 10,
		FirstBucketCap: 16 << 10, Steps: 200, Warmup: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.AllocsPerStep >= 1 {
		t.Errorf("%.2f allocations per step, want < 1", res.AllocsPerStep)
	}
}

// TestRunShard: the sharded step (reduce-scatter, Gather, all-gather) on
// 2 and 3 ranks, both partitions, with and without fp16, checks the
// averages each rank owns and reports the all-gathers' time inside the
// communication's; a warm sharded step allocates nothing.
func TestRunShard(t *testing.T) {
	for _, mode := range []ddp.ShardMode{ddp.ShardElements, ddp.ShardParams} {
		for _, tt := range []struct {
			ranks    int
			hook     string
			wireFrac int64
		}{{2, "none", 1}, {3, "fp16", 2}} {
			t.Run(fmt.Sprintf("%v/%d ranks/%s", mode, tt.ranks, tt.hook), func(t *testing.T) {
				hook, err := NewHook(tt.hook)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Run(context.Background(), Config{Params: tinyParams(), Comms: group(t, tt.ranks), BucketCap: 256 << 10,
					FirstBucketCap: 16 << 10, Hook: hook, Shard: mode, Steps: 200, Warmup: 3})
				if err != nil {
					t.Fatal(err)
				}
				if res.Shard != mode || !(res.GatherTime.Median > 0) || res.CommTime.Median < res.GatherTime.Median {
					t.Errorf("shard %v, gather %+v, communication %+v", res.Shard, res.GatherTime, res.CommTime)
				}
				// The reduce-scatters' payload is the buckets' (on the wire's
				// dtype), as the all-reduces' is.
				if res.WireBytes < res.GradBytes/tt.wireFrac {
					t.Errorf("wire bytes %d, want at least %d", res.WireBytes, res.GradBytes/tt.wireFrac)
				}
				if !invariants.RaceEnabled && res.AllocsPerStep >= 1 {
					t.Errorf("%.2f allocations per step, want < 1", res.AllocsPerStep)
				}
			})
		}
	}
}

// TestRunShardChecks: a reduce-scatter that takes the maximum instead of
// the sum fails the sharded run with ErrCheck naming a parameter.
func TestRunShardChecks(t *testing.T) {
	cs := group(t, 2)
	for i, c := range cs {
		cs[i] = maxScatter{c}
	}
	_, err := Run(context.Background(), Config{Params: tinyParams(), Comms: cs, Steps: 2, Shard: ddp.ShardElements, Hook: hooks.AllReduce})
	if !errors.Is(err, ErrCheck) || !strings.Contains(err.Error(), "param ") {
		t.Fatalf("Run = %v; want ErrCheck naming a parameter", err)
	}
}

type maxScatter struct{ comm.Communicator }

func (c maxScatter) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	return c.Communicator.ReduceScatter(send, recv, comm.Max)
}
