package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/models"
	"github.com/google/uuid"
	"github.com/urfave/cli/v2"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "benchmark DDP training steps over a model's gradients (the default command)",
		Description: "Each rank walks the model's parameters in reverse registration order, as backward\n" +
			"produces gradients, marks each ready on a simulated backward's schedule (by default\n" +
			"20 ms per step, sleeping: the CPU stays free, as a GPU's backward leaves it) and waits\n" +
			"for the reducer. Reported per measured step (median, p10, p90): step time (slowest\n" +
			"rank), backward compute (first to last ready mark), communication (union of bucket\n" +
			"reductions), overlap ratio (communication hidden behind compute / communication) and\n" +
			"busbw (payload / communication time x 2(n-1)/n). Quantiles come from every step up to\n" +
			"4096 steps, from a uniform sample of 4096 beyond (memory stays fixed); means from all.\n" +
			"Ctrl-C prints what was measured so far, marked interrupted, and writes the trace.\n\n" + exitRule,
		Flags:  runFlags(),
		Action: runAction,
	}
}

func runFlags() []cli.Flag {
	return append(stepFlags(true),
		stringFlag("trace", "", "write a Chrome trace (ui.perfetto.dev) of the first measured steps to `FILE`"),
		intFlag("trace-steps", 3, fmt.Sprintf("measured steps to trace (at most %d: each keeps every rank's statistics in memory)", bench.MaxTraceSteps)),
		stringFlag("metrics-addr", "", "serve Prometheus /metrics on `HOST:PORT` while running (127.0.0.1:9100 keeps them on this machine; "+
			"an empty host or 0.0.0.0 serves them, unauthenticated, to every network this machine is on)"),
		telemetryFlag(),
	)
}

// defaultComputeTime is the simulated backward of a default run: long
// enough that bucketing has something to hide communication behind.
const defaultComputeTime = 20 * time.Millisecond

// maxSteps bounds --steps and --warmup: their sum stays far from
// overflowing, and no run is meant to take longer than the universe.
const maxSteps = 1_000_000_000_000

// stepFlags are the flags run and sweep share; sweep, which sets the
// bucket cap itself, goes without --bucket-cap-mb.
func stepFlags(withCap bool) []cli.Flag {
	flags := []cli.Flag{
		stringFlag("model", "resnet50", "model manifest: resnet50, bert-base, gpt2-small, or a JSON `FILE`"),
		intFlag("ranks", 2, "number of ranks"),
		stringFlag("backend", "inproc", backendUsage()),
	}
	if withCap {
		flags = append(flags, floatFlag("bucket-cap-mb", 25, "bucket size limit in MiB"))
	}
	return append(flags,
		floatFlag("first-bucket-mb", 1, "first bucket's size limit in MiB"),
		&cli.IntFlag{Name: "max-in-flight", Value: 0, Usage: "most buckets on the wire at once (ddp's Options.MaxInFlight); 0: no bound", EnvVars: envs("max-in-flight")},
		stringFlag("shard", "none", "sharded optimizer state (ZeRO stage 1, ddp's Options.Shard): none (each bucket all-reduced), elements (each bucket reduce-scattered in equal element ranges, then all-gathered) or params (whole parameters per rank)"),
		stringFlag("compression", "none", "gradient compression: none, fp16, bf16 or powersgd (pays off only where wire bytes cost more than conversions: not in shared memory)"),
		intFlag("powersgd-rank", 1, "with --compression powersgd: the rank of each matrix's approximation (PyTorch's matrix_approximation_rank)"),
		intFlag("powersgd-start-iter", 0, "with --compression powersgd: synced steps averaged uncompressed before compression starts (start_powerSGD_iter; PyTorch's default is 1000, 0 here so that the measured steps compress)"),
		floatFlag("powersgd-min-compression-rate", 2, "with --compression powersgd: a matrix n×m is compressed only if (n+m)·rank·RATE < n·m (min_compression_rate)"),
		boolFlag("powersgd-error-feedback", true, "with --compression powersgd: carry each step's compression error into the next (use_error_feedback)"),
		boolFlag("powersgd-warm-start", true, "with --compression powersgd: start each step from the previous step's Q (warm_start)"),
		floatFlag("powersgd-epsilon", 0, "with --compression powersgd: added to each column's norm when orthogonalizing (orthogonalization_epsilon)"),
		&cli.Uint64Flag{Name: "powersgd-seed", Value: 0, Usage: "with --compression powersgd: seed of the random initial Qs, the same on every rank (random_seed)", EnvVars: envs("powersgd-seed")},
		intFlag("steps", 20, "measured steps"),
		intFlag("warmup", 40, "steps before measuring (the first rebuilds the buckets; the rest let the runtime settle: parked goroutines allocate until its caches are warm)"),
		boolFlag("grad-as-bucket-view", true, "gradients are views of the bucket memory (--grad-as-bucket-view=false: copied in and out)"),
		boolFlag("zero-grad", false, "the simulated backward accumulates (+=) into zeroed gradients (default: it assigns them, like autograd after zero_grad(set_to_none=True))"),
		stringFlag("compute", "sleep", "simulated backward: sleep (CPU left free, as a GPU's backward leaves it), spin (CPU busy, as a CPU backward keeps it) or none (every gradient ready at once: the reduction alone, nothing to overlap)"),
		floatFlag("rate", 0, "backward speed in parameters per second per rank"),
		floatFlag("gflops", 0, "backward speed in GFLOP/s per rank (2 FLOPs per parameter per sample, see --batch)"),
		intFlag("batch", 32, "samples per rank per step, for --gflops"),
		&cli.DurationFlag{Name: "compute-time", Value: defaultComputeTime,
			Usage: "backward duration per step, which sets the rate from the model size (used unless --rate or --gflops is given)", EnvVars: envs("compute-time")},
		formatFlag("output: table, json or csv"),
		&cli.DurationFlag{Name: "timeout", Value: time.Minute, Usage: "deadline of each step's Wait", EnvVars: envs("timeout")},
		&cli.DurationFlag{Name: "stall-interval", Value: comm.DefaultStallInterval, Usage: "how long a step's Wait waits before it reports a stall on standard error (the step, the bucket and, where the backend can tell, the ranks it waits for), and then how often", EnvVars: envs("stall-interval")},
	)
}

// runOpts is the parsed command line of run (and of each run of sweep).
type runOpts struct {
	runID         string // names this invocation in every output (a random UUID)
	model         *models.Manifest
	modelName     string
	ranks         int
	backend       backend
	bucketCapMB   float64
	firstMB       float64
	maxInFlight   int
	compression   string
	shard         ddp.ShardMode
	powerSGD      hooks.PowerSGDOptions // with compression powersgd
	steps         int
	warmup        int
	bucketView    bool
	zeroGrad      bool
	compute       bench.Compute
	rate          float64 // params/s; 0 with compute none
	rateFrom      string  // the flag the rate came from
	format        string
	timeout       time.Duration
	stallInterval time.Duration

	trace       string
	traceSteps  int
	metricsAddr string
	telemetry   time.Duration // --telemetry-interval (run only)
}

func parseStepFlags(c *cli.Context) (runOpts, error) {
	var o runOpts
	var err error
	o.runID = uuid.NewString()
	o.modelName = c.String("model")
	if o.model, err = models.Load(o.modelName); err != nil {
		// The input is invalid: nothing ran. The flag's name lets
		// runMain say when DDPBENCH_MODEL set it.
		return o, usagef("--model: %w", err)
	}
	if o.model.Elem != comm.Float32 {
		return o, usagef("--model %s: dtype %q: the reducer averages float32 gradients only (fp16 and bf16 are a --compression)",
			o.modelName, o.model.DType)
	}
	if o.backend, err = lookupBackend(c.String("backend")); err != nil {
		return o, err
	}
	if o.ranks, err = worldRanks(o.backend, c.Int("ranks"), c.IsSet("ranks")); err != nil {
		return o, err
	}
	o.bucketCapMB, o.firstMB = c.Float64("bucket-cap-mb"), c.Float64("first-bucket-mb")
	if c.Command.Name != "sweep" && !(o.bucketCapMB > 0 && o.bucketCapMB <= 4096) {
		return o, usagef("--bucket-cap-mb %g: want a size in (0, 4096] MiB", o.bucketCapMB)
	}
	if o.maxInFlight = c.Int("max-in-flight"); o.maxInFlight < 0 || o.maxInFlight > 1<<20 {
		return o, usagef("--max-in-flight %d: want 0 (no bound) to %d", o.maxInFlight, 1<<20)
	}
	if !(o.firstMB > 0 && o.firstMB <= 4096) {
		return o, usagef("--first-bucket-mb %g: want a size in (0, 4096] MiB", o.firstMB)
	}
	o.compression = c.String("compression")
	if _, err := bench.NewHook(o.compression); err != nil {
		return o, usagef("--compression %q: want none, fp16, bf16 or powersgd", o.compression)
	}
	if o.powerSGD, err = parsePowerSGD(c, o.compression); err != nil {
		return o, err
	}
	if o.shard, err = parseShard(c.String("shard"), o); err != nil {
		return o, err
	}
	o.steps, o.warmup = c.Int("steps"), c.Int("warmup")
	if o.steps < 1 || o.steps > maxSteps {
		return o, usagef("--steps %d: want 1..%d", o.steps, maxSteps)
	}
	if o.warmup < 0 || o.warmup > maxSteps {
		return o, usagef("--warmup %d: want 0..%d", o.warmup, maxSteps)
	}
	o.bucketView = c.Bool("grad-as-bucket-view")
	if !o.bucketView && o.backend.DeviceMemory {
		return o, usagef("--grad-as-bucket-view=false with --backend %s: the gradients live in device memory, which cannot be copied to Go slices", o.backend.Name)
	}
	o.zeroGrad = c.Bool("zero-grad")
	if o.compute, err = bench.ParseCompute(c.String("compute")); err != nil {
		return o, usagef("--compute %q: want sleep, spin or none", c.String("compute"))
	}
	if o.rate, o.rateFrom, err = parseRate(c, o.compute, o.model.Numel()); err != nil {
		return o, err
	}
	if o.format, err = parseFormat(c.String("format")); err != nil {
		return o, err
	}
	if o.timeout = c.Duration("timeout"); o.timeout <= 0 {
		return o, usagef("--timeout %v: want a positive duration", o.timeout)
	}
	if o.stallInterval = c.Duration("stall-interval"); o.stallInterval <= 0 {
		return o, usagef("--stall-interval %v: want a positive duration", o.stallInterval)
	}
	need := runMemory(4*o.model.Numel(), o.ranks, o.bucketView, o.compression, o.powerSGD.ErrorFeedback)
	if o.shard != ddp.ShardOff {
		need += 4 * o.model.Numel() * int64(o.ranks) // the values each rank gathers into
	}
	if err := checkMemory(need, fmt.Sprintf("--ranks %d with --model %s (%s of float32 gradients per rank)",
		o.ranks, o.modelName, fmtBytes(4*o.model.Numel()))); err != nil {
		return o, err
	}
	return o, nil
}

// shardNames are --shard's values, by mode.
var shardNames = map[ddp.ShardMode]string{ddp.ShardOff: "none", ddp.ShardElements: "elements", ddp.ShardParams: "params"}

// parseShard parses --shard for a run configured as o so far.
func parseShard(name string, o runOpts) (ddp.ShardMode, error) {
	mode := ddp.ShardMode(255)
	for m, n := range shardNames {
		if n == name {
			mode = m
		}
	}
	switch {
	case mode == 255:
		return 0, usagef("--shard %q: want none, elements or params", name)
	case mode != ddp.ShardOff && o.compression == "powersgd":
		return 0, usagef("--shard %s with --compression powersgd: PowerSGD cannot reduce-scatter (its factors are not elementwise)", name)
	case mode != ddp.ShardOff && o.backend.DeviceMemory:
		return 0, usagef("--shard %s with --backend %s: the sharded step gathers parameters through Go slices, which needs gradients in host memory", name, o.backend.Name)
	}
	return mode, nil
}

// powerSGDFlags are the flags of --compression powersgd.
var powerSGDFlags = []string{"powersgd-rank", "powersgd-start-iter", "powersgd-min-compression-rate", "powersgd-error-feedback",
	"powersgd-warm-start", "powersgd-epsilon", "powersgd-seed"}

// parsePowerSGD reads the --powersgd-* flags, which only --compression
// powersgd takes.
func parsePowerSGD(c *cli.Context, compression string) (hooks.PowerSGDOptions, error) {
	var o hooks.PowerSGDOptions
	if compression != "powersgd" {
		for _, f := range powerSGDFlags {
			if c.IsSet(f) {
				return o, usagef("--%s needs --compression powersgd", f)
			}
		}
		return o, nil
	}
	o = hooks.PowerSGDOptions{
		Rank: c.Int("powersgd-rank"), StartIter: c.Int("powersgd-start-iter"), MinCompressionRate: c.Float64("powersgd-min-compression-rate"),
		ErrorFeedback: c.Bool("powersgd-error-feedback"), WarmStart: c.Bool("powersgd-warm-start"),
		OrthogonalizationEpsilon: float32(c.Float64("powersgd-epsilon")), Seed: c.Uint64("powersgd-seed"),
	}
	switch {
	case o.Rank < 1 || o.Rank > 1<<20:
		return o, usagef("--powersgd-rank %d: want 1..%d", o.Rank, 1<<20)
	case o.StartIter < 0 || o.StartIter > maxSteps:
		return o, usagef("--powersgd-start-iter %d: want 0..%d", o.StartIter, maxSteps)
	case !(o.MinCompressionRate >= 0) || math.IsInf(o.MinCompressionRate, 1):
		return o, usagef("--powersgd-min-compression-rate %v: want a finite rate, 0 or more", o.MinCompressionRate)
	case !(c.Float64("powersgd-epsilon") >= 0) || c.Float64("powersgd-epsilon") > math.MaxFloat32:
		return o, usagef("--powersgd-epsilon %v: want a finite value, 0 or more", c.Float64("powersgd-epsilon"))
	}
	return o, nil
}

// compressionLabel names the compression and, for PowerSGD, its options.
func (o *runOpts) compressionLabel() string {
	if o.compression != "powersgd" {
		return o.compression
	}
	p := o.powerSGD
	return fmt.Sprintf("powersgd (rank %d, from step %d, min rate %g, error feedback %v, warm start %v)", p.Rank, p.StartIter, p.MinCompressionRate, p.ErrorFeedback, p.WarmStart)
}

// parseRate reads the compute speed, in parameters per second, from at
// most one of --rate, --gflops (with --batch) and --compute-time, which
// has a default; from says which flag it came from.
func parseRate(c *cli.Context, mode bench.Compute, numel int64) (rate float64, from string, err error) {
	var set []string
	for _, f := range []string{"rate", "gflops", "compute-time"} {
		if c.IsSet(f) {
			set = append(set, "--"+f)
		}
	}
	if mode == bench.ComputeNone {
		if len(set) > 0 {
			return 0, "", usagef("%s needs --compute sleep or spin", strings.Join(set, ", "))
		}
		return 0, "", nil
	}
	if len(set) > 1 {
		return 0, "", usagef("--compute %s takes one of --rate, --gflops or --compute-time (got %s)", mode, strings.Join(set, ", "))
	}
	from = "--compute-time"
	if len(set) == 1 {
		from = set[0]
	}
	switch from {
	case "--rate":
		rate = c.Float64("rate")
		if !(rate > 0) || math.IsInf(rate, 0) {
			return 0, "", usagef("--rate %g: want a positive number of parameters per second", rate)
		}
	case "--gflops":
		g, batch := c.Float64("gflops"), c.Int("batch")
		if !(g > 0) || math.IsInf(g, 0) {
			return 0, "", usagef("--gflops %g: want a positive number", g)
		}
		if batch < 1 {
			return 0, "", usagef("--batch %d: want >= 1", batch)
		}
		rate = rateFromGFLOPS(g, batch)
		from = fmt.Sprintf("--gflops %g with --batch %d", g, batch)
	case "--compute-time":
		d := c.Duration("compute-time")
		if d <= 0 {
			return 0, "", usagef("--compute-time %v: want a positive duration", d)
		}
		rate = float64(numel) / d.Seconds()
		if !c.IsSet("compute-time") {
			from = "default --compute-time " + d.String()
		}
	}
	// A step's backward must end: a tiny rate (or a huge batch) would
	// make it last for years, and its schedule overflow a Duration.
	if t := float64(numel) / rate; !(t <= bench.MaxComputeTarget.Seconds()) {
		name, _, _ := strings.Cut(from, " with")
		return 0, "", usagef("%s: %s parameters take %.3g s of backward per step at %.4g parameters per second; want at most %v",
			name, groupDigits(numel), t, rate, bench.MaxComputeTarget)
	}
	return rate, from, nil
}

// rateFromGFLOPS converts a FLOP rate into parameters per second: a
// backward costs 2 FLOPs per parameter per sample, so a step of params
// parameters takes 2*params*batch/(gflops*1e9) seconds.
func rateFromGFLOPS(gflops float64, batch int) float64 { return gflops * 1e9 / (2 * float64(batch)) }

func parseRun(c *cli.Context) (runOpts, error) {
	o, err := parseStepFlags(c)
	if err != nil {
		return o, err
	}
	o.trace, o.traceSteps, o.metricsAddr = c.String("trace"), c.Int("trace-steps"), c.String("metrics-addr")
	if o.traceSteps < 1 || o.traceSteps > bench.MaxTraceSteps {
		return o, usagef("--trace-steps %d: want 1..%d (each traced step keeps every rank's statistics in memory)", o.traceSteps, bench.MaxTraceSteps)
	}
	if o.trace != "" {
		if err := checkOutputPath("--trace", o.trace); err != nil {
			return o, err
		}
	}
	if o.telemetry, err = parseTelemetryInterval(c); err != nil {
		return o, err
	}
	return o, nil
}

func runAction(c *cli.Context) error {
	if c.Args().Present() {
		if err := flagBeforeCommand(c, c.Args().First()); err != nil {
			return err
		}
		return unexpectedArg(c, c.Args().First(), "commands: "+commandNames(c.App))
	}
	o, err := parseRun(c)
	if err != nil {
		return err
	}
	g, err := startGroup(c.Context, o.backend, o.ranks, o.timeout)
	if err != nil {
		return err
	}
	defer g.close()
	out, errOut := c.App.Writer, c.App.ErrWriter
	if g.quietRank() {
		out, errOut = io.Discard, io.Discard // rank 0 prints the group's results
	}

	cfg := o.benchConfig(g.comms)
	// What this process sets up for itself may fail on one rank of a
	// launched job alone: the ranks agree on it before the first
	// collective (agree).
	var setup error
	if o.backend.DeviceMemory {
		cfg.Pools, setup = g.devicePools(4 * o.model.Numel())
	}
	if o.metricsAddr != "" && setup == nil {
		pools := cfg.Pools
		if pools == nil {
			pools, setup = newPools(len(g.comms), 4*o.model.Numel(), comm.HostSourceOf(g.comms[0]))
			defer closePools(pools)
			cfg.Pools = pools
		}
		if setup == nil {
			// Every process serves its own ranks; a launched job's ranks
			// on one machine listen on the port plus their local rank.
			var onStep func(int, bool, *ddp.StepStats)
			var stop func()
			if onStep, stop, setup = serveMetrics(g.rankAddr(o.metricsAddr), pools, g.rank, c.App.ErrWriter); setup == nil {
				defer stop()
				cfg.OnStep = onStep
			}
		}
	}
	if err := g.agree(c.Context, setup, o.timeout, c.App.ErrWriter, rawArgs(c)); err != nil {
		return err
	}
	hosts, err := rankHosts(c.Context, g)
	if err != nil {
		return err
	}
	watchPeers(g, hosts)
	if o.trace != "" {
		cfg.TraceSteps = o.traceSteps
	}
	o.notes(errOut)
	bar := newProgress(errOut, "run", o.warmup+o.steps, o.format == "table")
	// Every rank reports its stalls, a launched job's quiet ranks too: the
	// rank that waits is the one that knows. above serializes the ranks.
	cfg.OnStall = func(s comm.Stall) {
		bar.above(func() { fmt.Fprintf(c.App.ErrWriter, "ddpbench: stall: %s\n", s) })
	}
	cfg.OnStep = chainOnStep(cfg.OnStep, func(rank int, _ bool, _ *ddp.StepStats) {
		if rank == 0 {
			bar.add(1)
		}
	})
	// The GPUs are sampled over the measured steps: from the end of rank
	// 0's last warmup step to the end of the run.
	tel := groupTelemetry(g, o.backend, o.telemetry, errOut)
	defer tel.stop()
	if tel != nil {
		warm := 0
		cfg.OnStep = chainOnStep(cfg.OnStep, func(rank int, measured bool, _ *ddp.StepStats) {
			if rank == g.rank && !measured {
				if warm++; warm == o.warmup {
					tel.start()
				}
			}
		})
		if o.warmup == 0 {
			tel.start()
		}
	}
	if onBackward != nil {
		cfg.OnBackward = func(int) { onBackward() }
	}
	// In a launched job an interrupt may end the process before Run
	// returns (stopping one rank mid-collective ends the job), so rank 0
	// prints the steps completed as soon as it comes.
	var said atomic.Bool
	if g.launched && g.size > 1 {
		cfg.OnInterrupt = func(part *bench.Result) {
			if g.quietRank() {
				time.Sleep(interruptGrace)
				return
			}
			bar.stop()
			what := fmt.Sprintf("the results above cover the %d of %d measured steps completed", part.Steps, o.steps)
			if part.Steps == 0 {
				what = fmt.Sprintf("before the first of %d measured steps completed: nothing to report", o.steps)
			} else {
				writeRunResults(out, o.format, []runRecord{{o: o, res: part, hosts: hosts, early: true}})
			}
			fmt.Fprintf(c.App.ErrWriter, "ddpbench: rank %d of %d: interrupted (%v): %s\n", g.rank, g.size, context.Cause(c.Context), what)
			said.Store(true)
		}
	}
	launches := o.backend.launchesSince()
	res, err := bench.Run(c.Context, cfg)
	if said.Load() {
		return rankError{rank: g.rank, size: g.size, code: 130, said: true, err: err}
	}
	tel.stop()
	bar.stop()
	if err != nil && (res == nil || !res.Interrupted) {
		return timeoutHint(err, o.timeout)
	}
	if res.Interrupted && res.Steps == 0 {
		return interruptedError{msg: fmt.Sprintf("interrupted before the first of %d measured steps completed: nothing to report", o.steps), err: err}
	}
	if o.trace != "" {
		if err := writeTraceFile(g.rankPath(o.trace), &o, res, g.rank); err != nil {
			return err
		}
	}
	if err := writeRunResults(out, o.format, []runRecord{{o: o, res: res, gpu: tel.summary(), hosts: hosts, launches: launches()}}); err != nil {
		return err
	}
	if res.Interrupted {
		msg := fmt.Sprintf("interrupted: the results above cover the %d of %d measured steps completed", res.Steps, o.steps)
		if o.trace != "" {
			msg += fmt.Sprintf("; %s holds %d of them", o.trace, len(res.Trace))
		}
		return interruptedError{msg: msg, err: err}
	}
	return nil
}

// notes warns, on w, about configurations whose numbers a newcomer would
// misread: compression where no wire exists, and a CPU-bound backward
// that leaves no core for the reduction to run on.
func (o *runOpts) notes(w io.Writer) {
	if o.compression != "none" && o.backend.SharedMemory {
		fmt.Fprintf(w, "ddpbench: note: --compression %s with --backend %s: the ranks share memory, so there are no wire bytes to save, "+
			"only conversions to pay; expect a slower step than with none (compression pays off on a network)\n", o.compression, o.backend.Name)
	}
	if o.compute == bench.ComputeSpin {
		if procs := runtime.GOMAXPROCS(0); o.ranks >= procs {
			fmt.Fprintf(w, "ddpbench: note: --compute spin keeps %s busy on %d cores (GOMAXPROCS): the reductions compete with backward "+
				"for them, so little communication can hide behind it; --compute sleep leaves the CPU free, as a GPU's backward does\n",
				rankCount(o.ranks), procs)
		}
	}
}

// benchConfig returns the bench configuration for o on group g.
func (o *runOpts) benchConfig(g []comm.Communicator) bench.Config {
	params := make([]ddp.Param, len(o.model.Params))
	for i, p := range o.model.Params {
		params[i] = ddp.Param{Name: p.Name, Shape: p.Shape}
	}
	hook, _ := bench.NewHook(o.compression)
	if o.compression == "powersgd" {
		hook = bench.NewPowerSGD(o.powerSGD)
	}
	return bench.Config{
		Params: params, Comms: g,
		BucketCap: mib(o.bucketCapMB), FirstBucketCap: mib(o.firstMB), MaxInFlight: o.maxInFlight,
		Hook: hook, CopyGrads: !o.bucketView, ZeroGrad: o.zeroGrad, Shard: o.shard,
		Steps: o.steps, Warmup: o.warmup,
		Compute: o.compute, Rate: o.rate,
		Timeout: o.timeout, StallInterval: o.stallInterval,
	}
}

// timeoutHint names --timeout in an error caused by it, so that the user
// sees which flag to raise.
func timeoutHint(err error, d time.Duration) error {
	if errors.Is(err, comm.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("--timeout %v exceeded: %w", d, err)
	}
	return err
}

func chainOnStep(a, b func(int, bool, *ddp.StepStats)) func(int, bool, *ddp.StepStats) {
	if a == nil {
		return b
	}
	return func(r int, m bool, s *ddp.StepStats) { a(r, m, s); b(r, m, s) }
}

// newPools makes one CommPool per rank for gradBytes of float32
// gradients, with the limit a Reducer gives the pool it makes itself:
// room for the buckets, a rebuilt layout and a hook's scratch. src is the
// communicator's own host memory (comm.HostSourceOf), as a Reducer would
// take it; nil means HostSource.
func newPools(n int, gradBytes int64, src allocator.Source) ([]*allocator.Pool, error) {
	pools := make([]*allocator.Pool, n)
	limit := poolLimit(gradBytes)
	for r := range pools {
		p, err := allocator.New(allocator.Options{Source: src, Limit: limit})
		if err != nil {
			closePools(pools)
			return nil, fmt.Errorf("rank %d CommPool: %w", r, err)
		}
		pools[r] = p
	}
	return pools, nil
}

// poolLimit is the byte limit of a rank's pool for gradBytes of
// gradients: as ddp.New sizes the pools it owns.
func poolLimit(gradBytes int64) int64 {
	return max(allocator.DefaultLimit, 3*gradBytes+64<<20)
}

func closePools(pools []*allocator.Pool) {
	for _, p := range pools {
		if p != nil {
			p.Close()
		}
	}
}
