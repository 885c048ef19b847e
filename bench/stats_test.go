package bench

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/ddpgo/ddpgo/ddp"
)

// TestSamplerExactWhenSmall checks that a stream of at most SampleSize
// rows is kept whole: the quantiles are those of every row.
func TestSamplerExactWhenSmall(t *testing.T) {
	s := newSampler(10)
	for _, v := range []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10} {
		var row [nQuantities]float64
		row[qWall] = v
		s.add(&row)
	}
	if d := s.dist(qWall); d != (Dist{Median: 5.5, P10: 1, P90: 9, Mean: 5.5}) {
		t.Errorf("dist %+v", d)
	}
	if cap(s.rows) != 10 {
		t.Errorf("sampler for 10 rows holds %d", cap(s.rows))
	}
}

// TestSamplerBounded checks that a long stream keeps SampleSize rows, an
// exact mean, and quantiles close to the stream's: a uniform sample of
// 4096 puts a quantile within a few tenths of a percent of rank.
func TestSamplerBounded(t *testing.T) {
	const n = 200_000
	s := newSampler(n)
	for i := range n {
		var row [nQuantities]float64
		row[qWall] = float64(i)
		s.add(&row)
	}
	if len(s.rows) != SampleSize || cap(s.rows) != SampleSize {
		t.Fatalf("%d rows kept (capacity %d), want %d", len(s.rows), cap(s.rows), SampleSize)
	}
	d := s.dist(qWall)
	if d.Mean != (n-1)/2.0 {
		t.Errorf("mean %g, want %g exactly", d.Mean, (n-1)/2.0)
	}
	for _, q := range []struct{ got, want float64 }{{d.P10, 0.1 * n}, {d.Median, 0.5 * n}, {d.P90, 0.9 * n}} {
		if math.Abs(q.got-q.want) > 0.03*n {
			t.Errorf("quantile %g, want %g within 3%% of the range", q.got, q.want)
		}
	}
}

// TestSamplerAddAllocs checks that adding a row allocates nothing: it runs
// during the measured steps, whose allocations are reported.
func TestSamplerAddAllocs(t *testing.T) {
	s := newSampler(1 << 40)
	var row [nQuantities]float64
	if a := testing.AllocsPerRun(3*SampleSize, func() { row[qWall]++; s.add(&row) }); a != 0 {
		t.Errorf("add allocates %v times", a)
	}
}

// interruptAfter returns an OnStep that cancels the run once rank 0 has
// completed k measured steps.
func interruptAfter(k int64, cancel context.CancelFunc) func(int, bool, *ddp.StepStats) {
	var done atomic.Int64
	return func(rank int, measured bool, _ *ddp.StepStats) {
		if rank == 0 && measured && done.Add(1) == k {
			cancel()
		}
	}
}

// heapDuring returns the bytes of Go heap allocated while f runs.
func heapDuring(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// TestRunMemoryIndependentOfSteps checks that what Run allocates does not
// depend on the number of steps asked for: a run of 2^40 steps (which
// would once have allocated 56 bytes per step per rank up front),
// interrupted after a few hundred, allocates no more than a run of a
// thousand interrupted at the same point, give or take the fixed-size
// quantile sample.
func TestRunMemoryIndependentOfSteps(t *testing.T) {
	const after = 300
	run := func(steps int) (*Result, uint64) {
		var res *Result
		var err error
		bytes := heapDuring(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			res, err = Run(ctx, Config{Params: tinyParams(), Comms: group(t, 2), Steps: steps, Warmup: 1,
				OnStep: interruptAfter(after, cancel)})
		})
		if !errors.Is(err, context.Canceled) || res == nil || !res.Interrupted {
			t.Fatalf("%d steps: result %v, error %v: want an interrupted result", steps, res, err)
		}
		// The rank that saw the cancellation may have been one step ahead.
		if res.Steps < after-1 || res.Steps > after+1 || res.Sampled != res.Steps || !(res.StepTime.Median > 0) {
			t.Errorf("%d steps: %d measured, %d sampled, step time %+v", steps, res.Steps, res.Sampled, res.StepTime)
		}
		return res, bytes
	}
	_, small := run(1000)
	_, huge := run(1 << 40)
	t.Logf("heap allocated: %d bytes for 1000 steps, %d for 2^40", small, huge)
	// The sample holds at most SampleSize rows of nQuantities float64s.
	if slack := uint64(SampleSize*nQuantities*8) + 1<<20; huge > small+slack {
		t.Errorf("2^40 steps allocated %d bytes, 1000 steps %d: more than the fixed sample's %d apart", huge, small, slack)
	}
}

// TestRunInterruptedMidStep checks that a run whose simulated backward
// would take an hour per step stops when its context ends, sleeping or
// spinning, in warmup or measured steps, and reports no measured step.
func TestRunInterruptedMidStep(t *testing.T) {
	for _, c := range []Compute{ComputeSleep, ComputeSpin} {
		for _, warmup := range []int{0, 2} {
			// The context ends as the first step's backward starts: in
			// warmup, or in the first measured step.
			ctx, cancel := context.WithCancel(context.Background())
			res, err := Run(ctx, Config{Params: tinyParams(), Comms: group(t, 2), Steps: 3, Warmup: warmup,
				Compute: c, Rate: 303112.0 / 3600, OnBackward: func(int) { cancel() }})
			cancel()
			if !errors.Is(err, context.Canceled) || res == nil || !res.Interrupted || res.Steps != 0 {
				t.Errorf("%s, %d warmup: result %+v, error %v", c, warmup, res, err)
			}
		}
	}
}

func TestRunComputeTargetBound(t *testing.T) {
	_, err := Run(context.Background(), Config{Params: tinyParams(), Comms: group(t, 2), Steps: 1,
		Compute: ComputeSleep, Rate: 1e-9})
	if !errors.Is(err, ErrConfig) {
		t.Errorf("a backward of 3e14 s: %v, want ErrConfig", err)
	}
	_, err = Run(context.Background(), Config{Params: tinyParams(), Comms: group(t, 2), Steps: 1, TraceSteps: MaxTraceSteps + 1})
	if !errors.Is(err, ErrConfig) {
		t.Errorf("TraceSteps %d: %v, want ErrConfig", MaxTraceSteps+1, err)
	}
}
