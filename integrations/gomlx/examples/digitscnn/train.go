package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/mpi"
	"github.com/ddpgo/ddpgo/sampler"
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// group is the ranks this process runs: every rank of an in-process
// group, or this process's rank of an mpirun job.
type group struct {
	comms []comm.Communicator
	first int // the rank of comms[0]
	mpi   bool
}

func (g *group) close() {
	for _, c := range g.comms {
		c.Close()
	}
}

// openGroup starts cfg.Backend's ranks. Under mpi the job's size is the
// number of ranks: cfg.Ranks becomes it (a -ranks given must equal it).
func openGroup(ctx context.Context, cfg *config) (*group, error) {
	if cfg.Backend == "inproc" {
		cs, err := launch.Open(ctx, "inproc", launch.Options{Ranks: cfg.Ranks})
		if err != nil {
			return nil, err
		}
		return &group{comms: cs}, nil
	}
	if !mpi.LibraryInfo().Built {
		return nil, fmt.Errorf("-backend mpi: this binary was built without it: go build -tags mpi ./examples/digitscnn, then mpirun -np N ./digitscnn -backend mpi")
	}
	env, err := launch.FromEnv()
	if errors.Is(err, launch.ErrNoLauncher) {
		env, err = launch.Env{Launcher: "none (a single process)", Size: 1, LocalSize: 1}, nil
	}
	if err != nil {
		return nil, err
	}
	if cfg.RanksSet && cfg.Ranks != env.Size {
		return nil, fmt.Errorf("%w: -ranks %d, but the job has %d processes", errConfig, cfg.Ranks, env.Size)
	}
	cfg.Ranks = env.Size
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// One communicator and one training loop per process: blocking
	// collectives are the faster mode (package mpi).
	cs, err := launch.Open(ctx, "mpi", launch.Options{Env: &env, Config: mpi.Options{Blocking: true}})
	if err != nil {
		return nil, fmt.Errorf("starting rank %d of %d over MPI: %w", env.Rank, env.Size, err)
	}
	return &group{comms: cs, first: env.Rank, mpi: true}, nil
}

func newBackend(cfg config) (backends.Backend, error) { return simplego.New(cfg.Simplego) }

func newOptimizer(cfg config) optimizers.Interface {
	if cfg.Optimizer == "sgd" {
		return optimizers.StochasticGradientDescent().WithLearningRate(cfg.LR)
	}
	return optimizers.Adam().LearningRate(cfg.LR).Done()
}

// newContext returns a rank's context: the same initial weights on every
// rank (which the trainer's broadcast from rank 0 would give anyway).
func newContext(cfg config) (*mlctx.Context, error) {
	ctx := mlctx.New()
	return ctx, ctx.SetRNGStateFromSeed(int64(cfg.Seed))
}

// trainGroup trains one replica per rank of g, a goroutine each, and
// reports rank 0's progress to out.
func trainGroup(ctx context.Context, out io.Writer, cfg config, g *group, trainSet, testSet *digits) error {
	backend, err := newBackend(cfg)
	if err != nil {
		return err
	}
	defer backend.Finalize()
	where := "in this process"
	if g.mpi {
		where = "a process each, over MPI"
	}
	fmt.Fprintf(out, "digitscnn: %s, %d train / %d test images, %d ranks (%s), batch %d (%d per rank), %s lr %g, compression %s\n",
		cfg.Model, trainSet.len(), testSet.len(), cfg.Ranks, where, cfg.Batch, cfg.Batch/cfg.Ranks, cfg.Optimizer, cfg.LR, cfg.Compression)
	errs := make([]error, len(g.comms))
	var wg sync.WaitGroup
	shared := &lockedWriter{w: out} // every rank prints its -shard line
	for i, c := range g.comms {
		wg.Go(func() {
			if errs[i] = trainRank(ctx, shared, cfg, c, backend, trainSet, testSet); errs[i] != nil {
				errs[i] = fmt.Errorf("rank %d: %w", c.Rank(), errs[i])
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// lockedWriter serialises the writes of the ranks' goroutines to one
// writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// trainerOptions are a rank's ddptrain options, with the optimizer
// sharded as shard says (-shard's values).
func trainerOptions(cfg config, shard string) (ddptrain.Options, error) {
	o := ddptrain.Options{ReadyBatch: cfg.ReadyBatch, Reducer: ddp.Options{BucketCap: cfg.BucketCap, FirstBucketCap: cfg.BucketCap}}
	var err error
	if o.Reducer.Hook, err = hooks.ByName(cfg.Compression); err != nil {
		return o, fmt.Errorf("%w: -compression: %w", errConfig, err)
	}
	switch shard {
	case "elements":
		o.Reducer.Shard = ddp.ShardElements
	case "params":
		o.Reducer.Shard = ddp.ShardParams
	}
	return o, nil
}

// trainRank is one rank's training loop. Rank 0 evaluates and prints.
func trainRank(ctx context.Context, out io.Writer, cfg config, c comm.Communicator, backend backends.Backend, trainSet, testSet *digits) error {
	rank := c.Rank()
	mctx, err := newContext(cfg)
	if err != nil {
		return err
	}
	o, err := trainerOptions(cfg, cfg.Shard)
	if err != nil {
		return err
	}
	model := models[cfg.Model](cfg.Hidden)
	tr, err := ddptrain.New(c, backend, mctx, model, losses.SparseCategoricalCrossEntropyLogits, newOptimizer(cfg), o)
	if err != nil {
		return err
	}
	defer tr.Close()
	inputs, labels := trainSet.tensors()
	ds, err := ddptrain.NewDataset("digits", rank, c.Size(), cfg.Batch/c.Size(), inputs, labels,
		sampler.Options{Shuffle: true, Seed: cfg.Seed, DropLast: true})
	if err != nil {
		return err
	}
	var eval *evaluator
	if rank == 0 {
		if eval, err = newEvaluator(backend, mctx, model, testSet); err != nil {
			return err
		}
		defer eval.close()
	}
	step := func(spec any, in, lab []*tensors.Tensor) (float64, ddptrain.Times, error) {
		loss, err := tr.TrainStep(ctx, spec, in, lab)
		return loss, tr.Times(), err
	}
	epochEnd := func(epoch int, loss float64, times []ddptrain.Times) error {
		if rank != 0 {
			return nil
		}
		acc, err := eval.accuracy()
		if err == nil {
			fmt.Fprintf(out, "epoch %3d  loss %.4f  test acc %6.2f%%  %s\n", epoch+1, loss, 100*acc, meanLine(times))
		}
		return err
	}
	benchEnd := func(times []ddptrain.Times) error {
		exposed, err := lastToArrive(ctx, c, times)
		if err == nil && rank == 0 {
			fmt.Fprintln(out, benchLine(cfg.Steps, times, exposed))
		}
		if err == nil && cfg.Shard != "none" {
			fmt.Fprintln(out, shardLine(tr, cfg.Shard, times))
		}
		return err
	}
	return loop(cfg, ds, step, epochEnd, benchEnd)
}

// trainPlain trains with GoMLX's own train.Trainer on the global batch,
// in the same order as the ranks' shards together: the baseline.
func trainPlain(out io.Writer, cfg config, trainSet, testSet *digits) error {
	backend, err := newBackend(cfg)
	if err != nil {
		return err
	}
	defer backend.Finalize()
	mctx, err := newContext(cfg)
	if err != nil {
		return err
	}
	model := models[cfg.Model](cfg.Hidden)
	tr := train.NewTrainer(backend, mctx, model, losses.SparseCategoricalCrossEntropyLogits, newOptimizer(cfg), nil, nil)
	inputs, labels := trainSet.tensors()
	ds, err := ddptrain.NewDataset("digits", 0, 1, cfg.Batch, inputs, labels, sampler.Options{Shuffle: true, Seed: cfg.Seed, DropLast: true})
	if err != nil {
		return err
	}
	eval, err := newEvaluator(backend, mctx, model, testSet)
	if err != nil {
		return err
	}
	defer eval.close()
	fmt.Fprintf(out, "digitscnn: %s, %d train / %d test images, plain GoMLX (train.Trainer, one graph a step), batch %d, %s lr %g\n",
		cfg.Model, trainSet.len(), testSet.len(), cfg.Batch, cfg.Optimizer, cfg.LR)
	step := func(spec any, in, lab []*tensors.Tensor) (float64, ddptrain.Times, error) {
		start := time.Now()
		metrics, err := tr.TrainStep(spec, in, lab)
		d := time.Since(start)
		if err != nil {
			return 0, ddptrain.Times{}, err
		}
		defer free(metrics)
		return float64(tensors.ToScalar[float32](metrics[0])), ddptrain.Times{Graph: d, Step: d}, nil
	}
	epochEnd := func(epoch int, loss float64, times []ddptrain.Times) error {
		acc, err := eval.accuracy()
		if err == nil {
			fmt.Fprintf(out, "epoch %3d  loss %.4f  test acc %6.2f%%  step %s (one graph)\n", epoch+1, loss, 100*acc, ms(mean(times, stepOf)))
		}
		return err
	}
	benchEnd := func(times []ddptrain.Times) error {
		fmt.Fprintln(out, benchLine(cfg.Steps, times, nil))
		return nil
	}
	return loop(cfg, ds, step, epochEnd, benchEnd)
}

// loop takes a step on every batch of ds for cfg.Epochs epochs, calling
// epochEnd after each with the epoch's mean loss and its steps' times;
// with cfg.Steps (the benchmark) it stops after that many steps instead
// and calls benchEnd with the times of those after cfg.Warmup.
func loop(cfg config, ds *ddptrain.Dataset, step func(spec any, in, lab []*tensors.Tensor) (float64, ddptrain.Times, error),
	epochEnd func(epoch int, loss float64, times []ddptrain.Times) error, benchEnd func([]ddptrain.Times) error) error {
	var times []ddptrain.Times
	steps := 0
	for epoch := range cfg.Epochs {
		ds.SetEpoch(epoch)
		var sum float64
		n := 0
		for {
			spec, in, lab, err := ds.Yield()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			loss, t, err := step(spec, in, lab)
			free(in, lab)
			if err != nil {
				return err
			}
			sum, n = sum+loss, n+1
			if steps++; cfg.Steps == 0 || steps > cfg.Warmup {
				times = append(times, t)
			}
			if steps == cfg.Steps {
				return benchEnd(times)
			}
		}
		if err := epochEnd(epoch, sum/float64(max(n, 1)), times); err != nil {
			return err
		}
		times = times[:0]
	}
	return nil
}

// evaluator computes the accuracy of a context's model on a test set.
type evaluator struct {
	exec   *mlctx.Exec
	x      *tensors.Tensor
	labels []int32
}

func newEvaluator(backend backends.Backend, ctx *mlctx.Context, model train.ModelFn, test *digits) (*evaluator, error) {
	exec, err := mlctx.NewExec(backend, ctx.Reuse(), predict(model))
	if err != nil {
		return nil, err
	}
	inputs, _ := test.tensors()
	return &evaluator{exec: exec, x: inputs[0], labels: test.y}, nil
}

func (e *evaluator) accuracy() (float64, error) {
	outs, err := e.exec.Exec(e.x)
	if err != nil {
		return 0, err
	}
	defer free(outs)
	hits := 0
	for i, p := range tensors.MustCopyFlatData[int32](outs[0]) {
		if p == e.labels[i] {
			hits++
		}
	}
	return float64(hits) / float64(len(e.labels)), nil
}

func (e *evaluator) close() { e.exec.Finalize() }

func free(ts ...[]*tensors.Tensor) {
	for _, l := range ts {
		for _, x := range l {
			x.FinalizeAll()
		}
	}
}

// The report: rank 0's step and its parts.

func stepOf(t ddptrain.Times) time.Duration { return t.Step }

var parts = []struct {
	name string
	of   func(ddptrain.Times) time.Duration
}{
	{"graph", func(t ddptrain.Times) time.Duration { return t.Graph }},
	{"hand-off", func(t ddptrain.Times) time.Duration { return t.HandOff }},
	{"reduction", func(t ddptrain.Times) time.Duration { return t.Reduction }},
	{"optimizer", func(t ddptrain.Times) time.Duration { return t.Optimizer }},
}

// meanLine is an epoch's mean step and its parts.
func meanLine(ts []ddptrain.Times) string {
	s := fmt.Sprintf("step %s:", ms(mean(ts, stepOf)))
	for i, p := range parts {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(" %s %s", p.name, ms(mean(ts, p.of)))
	}
	return s
}

// lastToArrive returns, for every timed step, the least hand-off and
// reduction time of any rank: that of the rank that reached the step's
// all-reduces last, which waited for no peer. A rank's own reduction time
// also holds the wait for slower peers (their graphs ran longer, or got a
// core later); the least over the ranks is the communication the hand-off
// did not hide. One all-reduce (Min) of every step's time at once.
func lastToArrive(ctx context.Context, c comm.Communicator, ts []ddptrain.Times) ([]time.Duration, error) {
	pool, err := allocator.New(allocator.Options{SlabSize: 1 << 20, Limit: 1 << 20})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	blk, err := pool.Get(8 * max(len(ts), 1))
	if err != nil {
		return nil, err
	}
	buf := comm.HostBuffer(blk.Addr(), len(ts), comm.Int64)
	for i, t := range ts {
		buf.AsInt64()[i] = int64(t.HandOff + t.Reduction)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.AllReduce(buf, buf, comm.Min).Wait(wctx); err != nil {
		return nil, err // the block stays out of the pool: the backend may still write it
	}
	out := make([]time.Duration, len(ts))
	for i, v := range buf.AsInt64() {
		out[i] = time.Duration(v)
	}
	return out, pool.Put(blk)
}

// benchLine is the benchmark's result: medians over the timed steps.
// exposed is, per step, the hand-off and reduction of the rank that
// arrived last (nil without ddpgo).
func benchLine(steps int, ts []ddptrain.Times, exposed []time.Duration) string {
	step := median(ts, stepOf)
	s := fmt.Sprintf("steps %d (%d timed): median step %s;", steps, len(ts), ms(step))
	for i, p := range parts {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(" %s %s", p.name, ms(median(ts, p.of)))
	}
	if slices.ContainsFunc(ts, func(t ddptrain.Times) bool { return t.Gather > 0 }) {
		s += fmt.Sprintf(", gather %s", ms(median(ts, func(t ddptrain.Times) time.Duration { return t.Gather })))
	}
	// The share of the step spent handing gradients over and waiting for
	// the reduction: the median over steps of each step's own share.
	shares := make([]float64, len(ts))
	for i, t := range ts {
		shares[i] = float64(t.HandOff+t.Reduction) / float64(max(t.Step, 1))
	}
	slices.Sort(shares)
	if len(shares) > 0 {
		s += fmt.Sprintf("; hand-off+reduction %.1f%% of the step", 100*shares[len(shares)/2])
	}
	if len(exposed) == len(ts) && len(ts) > 0 {
		for i, t := range ts {
			shares[i] = float64(exposed[i]) / float64(max(t.Step, 1))
		}
		slices.Sort(shares)
		s += fmt.Sprintf(", %.1f%% on the rank that arrived last", 100*shares[len(shares)/2])
	}
	return s
}

func mean(ts []ddptrain.Times, of func(ddptrain.Times) time.Duration) time.Duration {
	var sum time.Duration
	for _, t := range ts {
		sum += of(t)
	}
	return sum / time.Duration(max(len(ts), 1))
}

func median(ts []ddptrain.Times, of func(ddptrain.Times) time.Duration) time.Duration {
	if len(ts) == 0 {
		return 0
	}
	d := make([]time.Duration, len(ts))
	for i, t := range ts {
		d[i] = of(t)
	}
	slices.Sort(d)
	return d[len(d)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// shardLine is a rank's share with -shard: the optimizer state it keeps
// (the variables the optimizer graph created: Adam's moments of its own
// elements or variables, and the scalars every rank keeps) and the
// medians of its optimizer graph and of the gather.
func shardLine(tr *ddptrain.Trainer, shard string, ts []ddptrain.Times) string {
	state, all := int64(0), int64(0)
	for _, v := range tr.OptimizerState() {
		state += int64(v.Shape().Memory())
	}
	for _, v := range tr.Variables() {
		all += int64(v.Shape().Memory())
	}
	return fmt.Sprintf("rank %d (-shard %s): elements of %d of %d variables, optimizer state %d bytes (the variables: %d bytes); median optimizer %s, gather %s",
		tr.Rank(), shard, len(tr.Owned()), len(tr.Variables()), state, all,
		ms(median(ts, func(t ddptrain.Times) time.Duration { return t.Optimizer })), ms(median(ts, func(t ddptrain.Times) time.Duration { return t.Gather })))
}
