package bench

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
)

// Compute is how the simulated backward pass spends its time.
type Compute uint8

// The compute modes. Sleep parks the rank's goroutine until each
// gradient's deadline (the CPU stays free for communication, as with a
// GPU computing); Spin burns the CPU until it (as a CPU backward would).
const (
	ComputeNone Compute = iota
	ComputeSleep
	ComputeSpin
)

func (c Compute) String() string {
	switch c {
	case ComputeNone:
		return "none"
	case ComputeSleep:
		return "sleep"
	case ComputeSpin:
		return "spin"
	}
	return fmt.Sprintf("Compute(%d)", uint8(c))
}

// ParseCompute accepts "none", "sleep" and "spin".
func ParseCompute(s string) (Compute, error) {
	for _, c := range []Compute{ComputeNone, ComputeSleep, ComputeSpin} {
		if c.String() == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown compute mode %q (want none, sleep or spin)", ErrConfig, s)
}

// NewHook returns a fresh hook for one rank for a compression name:
// "none" (plain average), "fp16", "bf16" or "powersgd" (with PyTorch's
// defaults but compressing from the first step: NewPowerSGD sets them).
func NewHook(compression string) (func() hooks.Hook, error) {
	switch compression {
	case "", "none":
		return hooks.Avg, nil
	case "fp16":
		return hooks.FP16, nil
	case "bf16":
		return hooks.BF16, nil
	case "powersgd":
		o := hooks.DefaultPowerSGDOptions()
		o.StartIter = 0
		return NewPowerSGD(o), nil
	}
	return nil, fmt.Errorf("%w: unknown compression %q (want none, fp16, bf16 or powersgd)", ErrConfig, compression)
}

// NewPowerSGD returns a fresh PowerSGD hook with options o for each rank.
func NewPowerSGD(o hooks.PowerSGDOptions) func() hooks.Hook {
	return func() hooks.Hook { return hooks.PowerSGD(o) }
}

// Config configures Run.
type Config struct {
	Params []ddp.Param
	// Comms holds one communicator per rank, all of one group; or, in a
	// job launched with a process per rank (mpirun), this process's one
	// rank, and then every process calls Run and gets the statistics of
	// the whole group, gathered after each measured step with a small
	// AllGather over the communicator (outside the timed step).
	Comms []comm.Communicator
	// Pools, if not nil, holds each rank's CommPool; nil lets each Reducer
	// own one. A pool of device memory (Host false, over a device
	// backend's Source) makes the simulated backward write each gradient
	// with the communicator's kernels (comm.KernelSource), copying the
	// rank's value from a device buffer, and the check read it back with
	// Download: no gradient then passes through host memory.
	Pools []*allocator.Pool

	BucketCap, FirstBucketCap int // bytes; 0 -> ddp's defaults
	// MaxInFlight bounds the buckets on the wire at once; 0 -> no bound.
	MaxInFlight int
	// Hook returns a new hook for one rank; nil -> hooks.Avg.
	Hook      func() hooks.Hook
	CopyGrads bool // false: gradients are bucket views (the default)
	// Shard runs the sharded step (ddp.Options.Shard, ZeRO stage 1):
	// each bucket is reduce-scattered, each rank publishes its part with
	// Gather as soon as the bucket is reduced (inside WaitEach; nothing
	// is stepped: the benchmark measures the communication), its values
	// kept in the Reducer's memory (ddp.Reducer.Values), so that the
	// all-gathers run in place there and nothing is copied, and
	// WaitGather ends the step once the all-gathers are done. The check
	// reads the averages this rank owns. ShardOff: the all-reduce step.
	Shard ddp.ShardMode
	// ZeroGrad makes the simulated backward accumulate (+=) into zeroed
	// gradients, so every step pays for zeroing them. By default it
	// assigns its gradients, as autograd does after PyTorch's
	// zero_grad(set_to_none=True), and the Reducer runs with NoZeroGrad.
	ZeroGrad bool

	Steps  int // measured steps, >= 1
	Warmup int // steps before them (the first also rebuilds the buckets)

	Compute Compute
	// Rate is the simulated backward's speed in parameters per second per
	// rank; the whole backward takes numel/Rate. Ignored for ComputeNone.
	Rate float64

	// TraceSteps keeps the statistics of the first TraceSteps measured
	// steps of every rank in Result.Trace.
	TraceSteps int
	// OnStep, if not nil, is called by each rank's goroutine after each
	// step with that step's statistics (valid only during the call).
	OnStep func(rank int, measured bool, s *ddp.StepStats)
	// OnBackward, if not nil, is called by each rank's goroutine when the
	// simulated backward of a step starts, before it waits for its first
	// gradient (ComputeSleep and ComputeSpin only): where an interrupt
	// finds a slow step.
	OnBackward func(rank int)
	// Timeout bounds each step's Wait; 0 -> ddp's default.
	Timeout time.Duration
	// StallInterval is how long a step's Wait waits before it reports a
	// stall, and how often it repeats; 0 -> ddp's default. OnStall
	// receives the reports, from every rank's goroutine (nil: the
	// standard logger).
	StallInterval time.Duration
	OnStall       func(comm.Stall)
	// OnInterrupt, if not nil, is called once, on a goroutine of its
	// own, as soon as ctx ends during the run, with the statistics of the
	// measured steps every rank completed so far (Interrupted set, no
	// Trace, no allocation count); the ranks stop only once it has
	// returned. For a job of one rank per process (mpirun), where
	// stopping a rank mid-collective ends the whole job (MPI's abort)
	// before Run could return, and with it the chance to print them.
	OnInterrupt func(*Result)
}

// Dist summarizes one quantity over the measured steps: its quantiles
// over the steps Result.Sampled says, its mean over every step.
type Dist struct {
	Median, P10, P90, Mean float64
}

// MaxComputeTarget bounds the simulated backward of one step, so that a
// mistyped rate fails at once instead of computing for years.
const MaxComputeTarget = 24 * time.Hour

// Result is what Run measured. Times are in seconds, bandwidths in GB/s.
// A step's time is the slowest rank's (Begin to the end of Wait); its
// compute and communication are the largest over ranks; its overlap
// ratio is the summed hidden communication over the summed communication
// of all ranks; its bus bandwidth is the payload of one rank divided by
// that rank's communication time (the union of its buckets' reductions),
// times all-reduce's factor 2(n-1)/n, averaged over ranks.
type Result struct {
	Ranks     int
	Params    int
	Numel     int64
	GradBytes int64 // float32 gradient bytes per rank
	// Steps is the number of measured steps every rank completed: the
	// configured number, or fewer when the run was interrupted.
	Steps, Warmup int
	// Sampled is the number of steps the quantiles come from: Steps, or
	// SampleSize drawn uniformly from them when Steps is larger.
	Sampled int
	// Interrupted reports that the context ended the run early: the
	// statistics cover the Steps measured steps completed before it.
	Interrupted bool
	// Shard is Config.Shard: with it, a step ends with WaitGather,
	// CommTime is the union of the reduce-scatters and the all-gathers,
	// BusBW counts their payload as an all-reduce's (they move the same
	// bytes), and GatherTime is the union of the all-gathers alone.
	Shard         ddp.ShardMode
	GatherTime    Dist    // seconds; zero without Shard
	StepTime      Dist    // seconds, Begin returned to Wait (WaitGather with Shard) returned (the reducer's Wall)
	IterTime      Dist    // seconds, Begin called to Wait returned (adds Begin itself)
	ComputeTime   Dist    // seconds, first to last ready mark
	CommTime      Dist    // seconds
	OverlapRatio  Dist    // communication hidden behind compute / communication
	BusBW         Dist    // GB/s
	ComputeTarget float64 // seconds of simulated backward per step (0 for none)
	WireBytes     int64   // payload bytes one rank handed to collectives per step
	Buckets       []int64 // bytes of each bucket of the final layout
	Overflows     int64   // fp16/bf16 overflows, all ranks, all measured steps
	// AllocsPerStep is runtime.MemStats.Mallocs over the measured steps
	// divided by Steps: every goroutine of the process counts, so it
	// covers all ranks' training, communication and backend goroutines.
	AllocsPerStep float64
	// Trace holds, for the first TraceSteps measured steps, every rank's
	// statistics: Trace[step][rank].
	Trace [][]ddp.StepStats
}

// ErrCheck reports gradients that were not averaged correctly.
var ErrCheck = errors.New("bench: wrong gradient average")

// MaxTraceSteps bounds Config.TraceSteps: a traced step keeps every
// rank's full statistics in memory until Run returns.
const MaxTraceSteps = 1000

// Run builds one Reducer per rank, runs Warmup+Steps training steps on
// every rank concurrently with a simulated backward pass, and returns the
// statistics. The first measured step verifies that each gradient's first
// element holds the average of the ranks' values. Memory does not grow
// with Steps (see SampleSize).
//
// When ctx ends during the run, every rank stops within one gradient's
// share of the simulated backward (sleeping and spinning both watch ctx),
// and Run returns the statistics of the measured steps every rank
// completed, with Interrupted set, together with an error wrapping
// ctx.Err(). The group has then been aborted.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	n, launched, err := worldOf(cfg.Comms)
	if err != nil {
		return nil, err
	}
	nl := len(cfg.Comms) // ranks this process runs
	switch {
	case len(cfg.Params) == 0:
		return nil, fmt.Errorf("%w: no parameters", ErrConfig)
	case cfg.Steps < 1 || cfg.Warmup < 0:
		return nil, fmt.Errorf("%w: %d steps and %d warmup steps: want >= 1 and >= 0", ErrConfig, cfg.Steps, cfg.Warmup)
	case cfg.Compute != ComputeNone && !(cfg.Rate > 0 && !math.IsInf(cfg.Rate, 0)):
		return nil, fmt.Errorf("%w: compute %s needs a positive rate, got %g", ErrConfig, cfg.Compute, cfg.Rate)
	case cfg.Pools != nil && len(cfg.Pools) != nl:
		return nil, fmt.Errorf("%w: %d pools for %d ranks", ErrConfig, len(cfg.Pools), nl)
	case cfg.TraceSteps > MaxTraceSteps:
		return nil, fmt.Errorf("%w: %d traced steps, want at most %d", ErrConfig, cfg.TraceSteps, MaxTraceSteps)
	}
	res := &Result{Ranks: n, Params: len(cfg.Params), Warmup: cfg.Warmup, Shard: cfg.Shard}
	for _, p := range cfg.Params {
		res.Numel += int64(p.Numel())
	}
	res.GradBytes = 4 * res.Numel
	if cfg.Compute != ComputeNone {
		res.ComputeTarget = float64(res.Numel) / cfg.Rate
		if !(res.ComputeTarget <= MaxComputeTarget.Seconds()) {
			return nil, fmt.Errorf("%w: %d parameters at %g per second take %.3g s of backward per step, more than %v",
				ErrConfig, res.Numel, cfg.Rate, res.ComputeTarget, MaxComputeTarget)
		}
	}
	newHook := cfg.Hook
	if newHook == nil {
		newHook = hooks.Avg
	}

	// Build the reducers: New is collective, so every rank in its own goroutine.
	reducers := make([]*ddp.Reducer, nl)
	values := make([][][]float32, nl) // with Shard: each rank's parameters, in its Reducer's memory
	errs := make([]error, nl)
	var wg sync.WaitGroup
	for r := range nl {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := ddp.Options{BucketCap: cfg.BucketCap, FirstBucketCap: cfg.FirstBucketCap, MaxInFlight: cfg.MaxInFlight, Hook: newHook(),
				CopyGrads: cfg.CopyGrads, NoZeroGrad: !cfg.ZeroGrad, Timeout: cfg.Timeout, Shard: cfg.Shard,
				StallInterval: cfg.StallInterval, OnStall: cfg.OnStall}
			if cfg.Pools != nil {
				o.Pool = cfg.Pools[r]
			}
			reducers[r], errs[r] = ddp.New(ctx, cfg.Comms[r], cfg.Params, o)
			if errs[r] == nil && cfg.Shard != ddp.ShardOff {
				values[r], errs[r] = shardValues(reducers[r], len(cfg.Params))
			}
			if errs[r] != nil {
				cfg.Comms[r].Abort(errs[r])
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, red := range reducers {
			if red != nil {
				red.Close()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			res.Interrupted = true
			return res, fmt.Errorf("bench: interrupted while building the reducers: %w", ctx.Err())
		}
		return nil, err
	}

	// Every rank's full statistics are kept only for the traced steps, in
	// res.Trace, sized now so that copying them allocates nothing while
	// allocations are being counted (there are never more buckets than
	// parameters). Everything else goes through agg, whose memory is
	// fixed.
	trace := min(max(cfg.TraceSteps, 0), cfg.Steps)
	res.Trace = make([][]ddp.StepStats, trace)
	for s := range res.Trace {
		res.Trace[s] = make([]ddp.StepStats, nl)
		for r := range res.Trace[s] {
			res.Trace[s][r].Buckets = make([]ddp.BucketStats, 0, len(cfg.Params))
			res.Trace[s][r].ParamReady = make([]time.Duration, 0, len(cfg.Params))
		}
	}
	agg := newAggregator(n, cfg.Steps)
	var ex *exchange
	if launched {
		if ex, err = newExchange(cfg.Comms[0], nSummary); err != nil {
			return nil, err
		}
		defer ex.close()
		// Between steps the ranks wait for each other here, outside the
		// reducer: with its stall reports and deadline.
		ex.watch(comm.Watchdog{StallInterval: cfg.StallInterval, Timeout: cfg.Timeout, OnStall: cfg.OnStall},
			"gathering the step's statistics from every rank, between steps")
	}

	// With OnInterrupt, the ranks watch run, which ends only once
	// OnInterrupt has had the statistics: stopping may end the process.
	run, unwatch := ctx, func() {}
	if cfg.OnInterrupt != nil {
		var stopRun context.CancelCauseFunc
		run, stopRun = context.WithCancelCause(context.WithoutCancel(ctx))
		part := *res // copied now: Run writes res once the ranks are done
		reported := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(reported)
			part.Interrupted = true
			part.Trace = nil
			agg.summarize(&part)
			part.Buckets = bucketSizes(reducers[0])
			cfg.OnInterrupt(&part)
			stopRun(context.Cause(ctx))
		})
		unwatch = sync.OnceFunc(func() {
			if !stop() {
				<-reported // it ran: let it finish first
			}
			stopRun(nil)
		})
		defer unwatch()
	}

	// Two phases separated by a process-local rendezvous, so that the
	// allocation count covers exactly the measured steps.
	var warm, measured sync.WaitGroup
	warm.Add(nl)
	measured.Add(1)
	for r := range nl {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := newDriver(reducers[r], cfg, cfg.Comms[r].Rank(), r, n, values[r])
			d.ex = ex
			defer d.timer.Stop()
			if cfg.Pools != nil && !cfg.Pools[r].Host() {
				release, err := d.onDevice(cfg.Comms[r], cfg.Pools[r])
				if err != nil {
					warm.Done()
					agg.stop()
					errs[r] = fmt.Errorf("rank %d: %w", cfg.Comms[r].Rank(), err)
					cfg.Comms[r].Abort(errs[r])
					return
				}
				defer release()
			}
			err := d.steps(run, cfg.Warmup, nil, nil)
			warm.Done()
			measured.Wait()
			if err == nil {
				err = d.steps(run, cfg.Steps, agg, res.Trace)
			}
			if err != nil {
				agg.stop()
				errs[r] = fmt.Errorf("rank %d: %w", cfg.Comms[r].Rank(), err)
				cfg.Comms[r].Abort(errs[r])
			}
		}()
	}
	warm.Wait()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	measured.Done()
	wg.Wait()
	unwatch()
	runtime.ReadMemStats(&m1)
	res.Interrupted = ctx.Err() != nil
	if err := firstErr(errs); err != nil && !res.Interrupted {
		return nil, err
	}
	agg.summarize(res)
	res.Trace = res.Trace[:min(len(res.Trace), res.Steps)]
	if res.Steps > 0 {
		res.AllocsPerStep = float64(m1.Mallocs-m0.Mallocs) / float64(res.Steps)
	}
	res.Buckets = bucketSizes(reducers[0])
	if res.Interrupted {
		return res, fmt.Errorf("bench: interrupted after %d of %d measured steps: %w", res.Steps, cfg.Steps, interruption(ctx))
	}
	return res, nil
}

// bucketSizes returns the sizes of red's buckets.
func bucketSizes(red *ddp.Reducer) []int64 {
	var out []int64
	for _, b := range red.Buckets() {
		out = append(out, int64(b.Bytes))
	}
	return out
}

// interruption is why ctx ended: its cause where it has one (a signal,
// say), which wraps ctx.Err() or is wrapped with it.
func interruption(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err || errors.Is(cause, err) {
		return cause
	}
	return fmt.Errorf("%w: %w", err, cause)
}

func firstErr(errs []error) error {
	// Prefer a root cause over the aborts it caused on other ranks.
	for _, e := range errs {
		if e != nil && !errors.Is(e, comm.ErrAborted) && !errors.Is(e, errStopped) {
			return e
		}
	}
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// errStopped ends a rank whose peer stopped first.
var errStopped = errors.New("bench: stopped because another rank did")

// driver runs one rank's training loop.
type driver struct {
	red *ddp.Reducer
	cfg *Config
	tol float64 // the check's relative tolerance: float32's rounding, or the wire's
	// vectorsOnly: the check skips the matrices, which the hook
	// approximates (PowerSGD at rank 1).
	vectorsOnly bool
	rank, n     int
	local       int             // index among this process's ranks (Result.Trace)
	ex          *exchange       // a launched job's statistics exchange, or nil
	order       []int           // parameter indices, reverse registration order
	deadlines   []time.Duration // cumulative compute time when each becomes ready
	stats       ddp.StepStats
	// timer paces ComputeSleep; one per driver, reset for every wait, so
	// that a cancellable sleep allocates nothing.
	timer *time.Timer
	// With a device pool: the kernels, a device float32 holding the
	// rank's gradient value, and a host word to download into.
	kern comm.Kernels
	val  comm.Buffer
	word []byte
	// With Config.Shard: the values Gather publishes (one per parameter,
	// in the Reducer's memory, so that the all-gathers run in place there),
	// the first error of the step's WaitEach callback, and the step's
	// communication intervals, reused.
	values    [][]float32
	gatherErr error
	spans     []span
	each      func(ddp.Reduced)
}

// span is an interval of a step's communication.
type span struct{ lo, hi time.Duration }

// onDevice prepares the driver for gradients in device memory: the
// communicator's kernels and, from pool, one float32 holding the rank's
// value, which step copies into every gradient's ends. It returns the
// function that gives the memory back.
func (d *driver) onDevice(c comm.Communicator, pool *allocator.Pool) (func(), error) {
	ks, ok := c.(comm.KernelSource)
	if !ok {
		return nil, fmt.Errorf("%w: a device pool, but the communicator (%s) has no kernels to write gradients with", ErrConfig, comm.CapsOf(c).Backend)
	}
	d.kern = ks.Kernels()
	blk, err := pool.Get(4)
	if err != nil {
		return nil, fmt.Errorf("bench: a device float32 for the gradients' value: %w", err)
	}
	d.val = comm.Buffer{Addr: blk.Addr(), Count: 1, DType: comm.Float32, Loc: comm.Device, Device: comm.DeviceOf(c)}
	d.word = make([]byte, 4)
	binary.LittleEndian.PutUint32(d.word, math.Float32bits(float32(d.rank+1)))
	d.kern.Upload(d.val, d.word)
	return func() {
		// The stream passes every use of val before Sync returns; if it
		// cannot say so, val may still be read: keep it out of the pool.
		if d.kern.Sync() == nil {
			pool.Put(blk)
		}
	}, nil
}

// shardValues returns the n parameters' values in red's memory
// (ddp.Reducer.Values), where the sharded step gathers them in place.
func shardValues(red *ddp.Reducer, n int) ([][]float32, error) {
	values := make([][]float32, n)
	for i := range values {
		var err error
		if values[i], err = red.Values(i); err != nil {
			return nil, err
		}
	}
	return values, nil
}

func newDriver(red *ddp.Reducer, cfg Config, rank, local, n int, values [][]float32) *driver {
	d := &driver{red: red, cfg: &cfg, rank: rank, local: local, n: n, timer: time.NewTimer(time.Hour), tol: 1e-6}
	if cfg.Hook != nil {
		switch h := cfg.Hook(); h.Name() {
		case "fp16", "bf16":
			d.tol = 1e-2 // they round the 1/n-scaled values to 11 or 8 bits
		case "powersgd":
			// A gradient is its two ends (the rest zero, or the last
			// average): a matrix of rank two, which PowerSGD reproduces
			// up to its roundings at rank 2 or more. At rank 1 it is
			// approximated, and only the vectors are checked.
			d.tol = 1e-4
			if p, ok := h.(*hooks.PowerSGDHook); ok && p.Options().Rank < 2 {
				d.vectorsOnly = true
			}
		}
	}
	d.timer.Stop()
	if cfg.Shard != ddp.ShardOff {
		d.values = values
		d.each = d.publish
	}
	var cum float64
	for i := len(cfg.Params) - 1; i >= 0; i-- {
		d.order = append(d.order, i)
		if cfg.Compute != ComputeNone {
			cum += float64(cfg.Params[i].Numel())
			d.deadlines = append(d.deadlines, time.Duration(cum/cfg.Rate*float64(time.Second)))
		}
	}
	return d
}

// steps runs k synced steps. Measured steps (agg not nil) are summarized
// into agg, with their duration from calling Begin, and the statistics of
// the first len(trace) of them are copied into trace[step][rank].
func (d *driver) steps(ctx context.Context, k int, agg *aggregator, trace [][]ddp.StepStats) error {
	measured := agg != nil
	for s := range k {
		// Wait need not look at ctx when nothing is left to wait for.
		if ctx.Err() != nil {
			return interruption(ctx)
		}
		t := time.Now()
		if err := d.step(ctx); err != nil {
			return err
		}
		iter := time.Since(t)
		// Every step, so that a step that completes after a fault (a
		// link cut and restored) is known to be right, not only fast.
		if err := d.check(); err != nil {
			return err
		}
		d.red.StatsInto(&d.stats)
		if s < len(trace) {
			d.red.StatsInto(&trace[s][d.local])
		}
		if measured {
			st := &d.stats
			sum := stepSummary{wall: st.Wall, iter: iter, compute: st.Compute, comm: st.Comm,
				overlap: st.Overlap, bytes: st.Bytes, overflows: st.Overflows}
			if d.values != nil {
				sum.comm, sum.gather = d.shardComm(st)
			}
			if d.ex != nil {
				if err := d.gather(ctx, s, agg, &sum); err != nil {
					return err
				}
			} else if !agg.add(d.rank, s, sum) {
				return errStopped
			}
		}
		if d.cfg.OnStep != nil {
			d.cfg.OnStep(d.rank, measured, &d.stats)
		}
	}
	return nil
}

// nSummary is the number of values of a stepSummary.
const nSummary = 8

// gather exchanges measured step s's summary with every rank of a
// launched job and adds all of them to agg.
func (d *driver) gather(ctx context.Context, s int, agg *aggregator, sum *stepSummary) error {
	all, err := d.ex.gather(ctx, float64(sum.wall), float64(sum.iter), float64(sum.compute), float64(sum.comm),
		float64(sum.overlap), float64(sum.bytes), float64(sum.overflows), float64(sum.gather))
	if err != nil {
		return err
	}
	for r := range d.n {
		v := all[r*nSummary : (r+1)*nSummary]
		if !agg.add(r, s, stepSummary{wall: time.Duration(v[0]), iter: time.Duration(v[1]), compute: time.Duration(v[2]),
			comm: time.Duration(v[3]), overlap: time.Duration(v[4]), bytes: int64(v[5]), overflows: int64(v[6]), gather: time.Duration(v[7])}) {
			return errStopped
		}
	}
	return nil
}

// step is one synced step: the simulated backward marks every gradient
// ready in reverse order on its deadline, then Wait.
func (d *driver) step(ctx context.Context) error {
	if err := d.red.Begin(ddp.Sync); err != nil {
		return err
	}
	start := time.Now()
	v := float32(d.rank + 1)
	if d.deadlines != nil && d.cfg.OnBackward != nil {
		d.cfg.OnBackward(d.rank)
	}
	for j, i := range d.order {
		if d.deadlines != nil {
			if err := d.await(ctx, start, d.deadlines[j]); err != nil {
				return fmt.Errorf("in the simulated backward, %d of %d gradients marked ready: %w", j, len(d.order), err)
			}
		}
		// Producing the gradient is part of the compute being simulated:
		// mark its ends, which the check reads back after the reduction.
		if d.kern != nil {
			g, err := d.red.GradBuffer(i)
			if err != nil {
				return err
			}
			d.kern.Copy(g.Slice(0, 1), d.val)
			d.kern.Copy(g.Slice(g.Count-1, 1), d.val)
			if err := d.red.Ready(i); err != nil {
				return err
			}
			continue
		}
		g, err := d.red.Grad(i)
		if err != nil {
			return err
		}
		g[0], g[len(g)-1] = v, v
		if err := d.red.Ready(i); err != nil {
			return err
		}
	}
	if d.values == nil {
		return d.red.Wait(ctx)
	}
	d.gatherErr = nil
	if err := d.red.WaitEach(ctx, d.each); err != nil {
		return err
	}
	if d.gatherErr != nil {
		return d.gatherErr
	}
	return d.red.WaitGather(ctx)
}

// publish is the sharded step's WaitEach callback: it checks the
// averages this rank owns of bucket b (the only ones it received) and
// publishes its part with Gather at once.
func (d *driver) publish(b ddp.Reduced) {
	if d.gatherErr != nil {
		return
	}
	if err := d.checkOwned(b.Owned); err != nil {
		d.gatherErr = err
		return
	}
	d.gatherErr = d.red.Gather(b.Bucket, d.values)
}

// checkOwned is check for the parts of a sharded step's bucket that this
// rank owns: the ends of a parameter, where its part holds them.
func (d *driver) checkOwned(parts []ddp.Part) error {
	want := float32(d.n+1) / 2
	for _, pt := range parts {
		p := d.cfg.Params[pt.Param]
		if d.vectorsOnly && len(p.Shape) >= 2 {
			continue
		}
		g, err := d.red.Grad(pt.Param)
		if err != nil {
			return err
		}
		if (pt.Lo == 0 && !near(g[0], want, d.tol)) || (pt.Hi == len(g) && !near(g[len(g)-1], want, d.tol)) {
			return fmt.Errorf("%w: rank %d param %d (%s): got %g and %g at its ends (owning [%d, %d) of %d), want %g",
				ErrCheck, d.rank, pt.Param, p.Name, g[0], g[len(g)-1], pt.Lo, pt.Hi, len(g), want)
		}
	}
	return nil
}

// shardComm returns a sharded step's communication: the union of its
// reduce-scatters' and all-gathers' intervals, and of the all-gathers'
// alone.
func (d *driver) shardComm(st *ddp.StepStats) (all, gathers time.Duration) {
	d.spans = d.spans[:0]
	for _, b := range st.Buckets {
		d.spans = append(d.spans, span{b.GatherStart, b.GatherEnd})
	}
	gathers = union(d.spans) // in bucket order: the all-gathers launch in it
	for _, b := range st.Buckets {
		d.spans = append(d.spans, span{b.Launch, b.Done})
	}
	slices.SortFunc(d.spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	return union(d.spans), gathers
}

// union is the length of the union of spans sorted by start.
func union(spans []span) time.Duration {
	var total, end time.Duration
	for _, s := range spans {
		lo := max(s.lo, end)
		if s.hi <= lo {
			continue
		}
		total += s.hi - lo
		end = s.hi
	}
	return total
}

// await returns when at has passed since start, sleeping or spinning, or
// with ctx's error as soon as ctx ends: a slow simulated backward must
// not hold an interrupted run for the rest of its step.
func (d *driver) await(ctx context.Context, start time.Time, at time.Duration) error {
	done := ctx.Done()
	if d.cfg.Compute == ComputeSleep {
		left := at - time.Since(start)
		if left <= 0 {
			return nil
		}
		d.timer.Reset(left)
		select {
		case <-d.timer.C:
			return nil
		case <-done:
			d.timer.Stop()
			return interruption(ctx)
		}
	}
	for time.Since(start) < at {
		select {
		case <-done:
			return interruption(ctx)
		default:
		}
	}
	return nil
}

// check verifies that every gradient's ends hold the average of the
// ranks' values 1..n.
func (d *driver) check() error {
	if d.values != nil {
		return nil // the sharded step checked the averages it owns (checkOwned); the buckets now hold the gathered values
	}
	want := float32(d.n+1) / 2
	for i, p := range d.cfg.Params {
		if d.vectorsOnly && len(p.Shape) >= 2 {
			continue
		}
		var first, last float32
		if d.kern != nil {
			g, err := d.red.GradBuffer(i)
			if err != nil {
				return err
			}
			first, last = d.download(g.Slice(0, 1)), d.download(g.Slice(g.Count-1, 1))
		} else {
			g, err := d.red.Grad(i)
			if err != nil {
				return err
			}
			first, last = g[0], g[len(g)-1]
		}
		if !near(first, want, d.tol) || !near(last, want, d.tol) {
			return fmt.Errorf("%w: rank %d param %d (%s): got %g and %g at its ends, want %g",
				ErrCheck, d.rank, i, p.Name, first, last, want)
		}
	}
	return nil
}

// download reads one device float32 (after everything issued before it).
func (d *driver) download(b comm.Buffer) float32 {
	d.kern.Download(d.word, b)
	return math.Float32frombits(binary.LittleEndian.Uint32(d.word))
}

func near(got, want float32, tol float64) bool {
	return math.Abs(float64(got-want)) <= tol*float64(want)
}
