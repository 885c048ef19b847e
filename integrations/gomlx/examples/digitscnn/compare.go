package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/sampler"
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
)

// compare is -compare: plain GoMLX (train.Trainer on the global batch)
// and ddptrain over this process's ranks take turns, a step each, for
// cfg.Steps steps, so that the load of a shared machine falls on both
// alike; it prints each one's medians. With -shard elements or params, a
// third contender takes its turn too: ddptrain with the optimizer sharded,
// over ranks of its own, and the line after it compares its step and its
// optimizer with the unsharded ddptrain's, turn by turn. The contenders
// take the first turn of a step in rotation. Only in-process ranks.
func compare(ctx context.Context, out io.Writer, cfg config, g *group, trainSet *digits) error {
	backend, err := newBackend(cfg)
	if err != nil {
		return err
	}
	defer backend.Finalize()
	inputs, labels := trainSet.tensors()
	o := sampler.Options{Shuffle: true, Seed: cfg.Seed, DropLast: true}
	model := models[cfg.Model](cfg.Hidden)

	// The baseline, on this goroutine.
	pctx, err := newContext(cfg)
	if err != nil {
		return err
	}
	plain := train.NewTrainer(backend, pctx, model, losses.SparseCategoricalCrossEntropyLogits, newOptimizer(cfg), nil, nil)
	pds, err := ddptrain.NewDataset("digits", 0, 1, cfg.Batch, inputs, labels, o)
	if err != nil {
		return err
	}

	// The ranks, a goroutine each, taking a step when told.
	groups := []*rankGroup{{name: "ddpgo", shard: "none", comms: g.comms}}
	if cfg.Shard != "none" {
		cs, err := launch.Open(ctx, "inproc", launch.Options{Ranks: cfg.Ranks})
		if err != nil {
			return err
		}
		sharded := &group{comms: cs}
		defer sharded.close()
		groups = append(groups, &rankGroup{name: "ddpgo -shard " + cfg.Shard, shard: cfg.Shard, comms: cs})
	}
	for _, rg := range groups {
		defer rg.stop() // the loops it started, the trainers it made
		if err := rg.start(ctx, cfg, backend, model, inputs, labels, o); err != nil {
			return err
		}
	}

	var ptimes []ddptrain.Times
	for s := range cfg.Steps {
		for turn := range 1 + len(groups) {
			switch i := (s + turn) % (1 + len(groups)); i {
			case 0:
				start := time.Now()
				if err := plainStep(plain, pds); err != nil {
					return fmt.Errorf("plain GoMLX: %w", err)
				}
				if pt := time.Since(start); s >= cfg.Warmup {
					ptimes = append(ptimes, ddptrain.Times{Graph: pt, Step: pt})
				}
			default:
				if err := groups[i-1].step(s >= cfg.Warmup); err != nil {
					return fmt.Errorf("%s: %w", groups[i-1].name, err)
				}
			}
		}
	}
	n := len(g.comms)
	fmt.Fprintf(out, "digitscnn: %s, batch %d, %s lr %g, compression %s: plain GoMLX and ddptrain over %d ranks in this process, a step each in turn\n",
		cfg.Model, cfg.Batch, cfg.Optimizer, cfg.LR, cfg.Compression, n)
	fmt.Fprintf(out, "plain:  %s\n", benchLine(cfg.Steps, ptimes, nil))
	for _, rg := range groups {
		fmt.Fprintf(out, "%s:  %s\n", rg.name, benchLine(cfg.Steps, rg.times, rg.exposed))
	}
	if len(groups) == 2 {
		fmt.Fprintln(out, shardRatios(groups[0], groups[1]))
	}
	return nil
}

// shardRatios compares the sharded ranks' steps with the unsharded ones'
// taken in the same turns: the medians over steps of each step's ratio,
// of the whole step and of the optimizer graph on the slowest rank.
func shardRatios(plain, sharded *rankGroup) string {
	steps := make([]float64, len(plain.times))
	opts := make([]float64, len(plain.times))
	for i := range plain.times {
		steps[i] = float64(sharded.times[i].Step) / float64(max(plain.times[i].Step, 1))
		opts[i] = float64(sharded.slowest[i]) / float64(max(plain.slowest[i], 1))
	}
	return fmt.Sprintf("%s against ddpgo, turn by turn (medians of %d steps' ratios): step %.3fx, optimizer graph (the slowest rank's) %.3fx",
		sharded.name, len(steps), medianOf(steps), medianOf(opts))
}

// medianOf returns the median of xs, which it sorts.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// rankGroup is one ddptrain contender of -compare: a rank loop per
// communicator, and the times of its timed steps.
type rankGroup struct {
	name  string
	shard string // -shard's value
	comms []comm.Communicator
	ranks []*rankLoop
	done  chan error
	// Per timed step: rank 0's times, the least hand-off and reduction
	// over the ranks (the rank that arrived last) and the most optimizer
	// time over the ranks.
	times   []ddptrain.Times
	exposed []time.Duration
	slowest []time.Duration
}

// start makes the group's trainers and starts their loops.
func (rg *rankGroup) start(ctx context.Context, cfg config, backend backends.Backend, model train.ModelFn, inputs, labels []*tensors.Tensor, o sampler.Options) error {
	rg.done = make(chan error, len(rg.comms))
	for _, c := range rg.comms {
		r, err := newRankLoop(cfg, rg.shard, c, backend, model, inputs, labels, o)
		if err != nil {
			return err
		}
		rg.ranks = append(rg.ranks, r)
		go r.run(ctx, rg.done) // it waits for a tick
	}
	return nil
}

// step has every rank take a step, and records their times if timed.
func (rg *rankGroup) step(timed bool) error {
	for _, r := range rg.ranks {
		r.tick <- struct{}{}
	}
	var errs []error
	for range rg.ranks {
		errs = append(errs, <-rg.done)
	}
	if err := errors.Join(errs...); err != nil || !timed {
		return err
	}
	rg.times = append(rg.times, rg.ranks[0].last)
	least, most := rg.ranks[0].last.HandOff+rg.ranks[0].last.Reduction, rg.ranks[0].last.Optimizer
	for _, r := range rg.ranks[1:] {
		least = min(least, r.last.HandOff+r.last.Reduction)
		most = max(most, r.last.Optimizer)
	}
	rg.exposed = append(rg.exposed, least)
	rg.slowest = append(rg.slowest, most)
	return nil
}

// stop ends the loops, which wait for a tick between steps, and closes
// the trainers.
func (rg *rankGroup) stop() {
	for _, r := range rg.ranks {
		close(r.tick)
		r.close()
	}
}

// plainStep takes the baseline's next step, starting the next epoch at
// the end of one.
func plainStep(tr *train.Trainer, ds *ddptrain.Dataset) error {
	spec, in, lab, err := ds.Yield()
	if err == io.EOF {
		ds.Reset()
		spec, in, lab, err = ds.Yield()
	}
	if err != nil {
		return err
	}
	metrics, err := tr.TrainStep(spec, in, lab)
	free(in, lab, metrics)
	return err
}

// rankLoop is one rank of -compare: it takes a step on every tick.
type rankLoop struct {
	tr   *ddptrain.Trainer
	ds   *ddptrain.Dataset
	tick chan struct{}
	last ddptrain.Times
}

func newRankLoop(cfg config, shard string, c comm.Communicator, backend backends.Backend, model train.ModelFn, inputs, labels []*tensors.Tensor, o sampler.Options) (*rankLoop, error) {
	mctx, err := newContext(cfg)
	if err != nil {
		return nil, err
	}
	opts, err := trainerOptions(cfg, shard)
	if err != nil {
		return nil, err
	}
	tr, err := ddptrain.New(c, backend, mctx, model, losses.SparseCategoricalCrossEntropyLogits, newOptimizer(cfg), opts)
	if err != nil {
		return nil, err
	}
	ds, err := ddptrain.NewDataset("digits", c.Rank(), c.Size(), cfg.Batch/c.Size(), inputs, labels, o)
	if err != nil {
		return nil, errors.Join(err, tr.Close())
	}
	return &rankLoop{tr: tr, ds: ds, tick: make(chan struct{})}, nil
}

func (r *rankLoop) run(ctx context.Context, done chan<- error) {
	for range r.tick {
		spec, in, lab, err := r.ds.Yield()
		if err == io.EOF {
			r.ds.Reset()
			spec, in, lab, err = r.ds.Yield()
		}
		if err == nil {
			_, err = r.tr.TrainStep(ctx, spec, in, lab)
			free(in, lab)
		}
		r.last = r.tr.Times()
		done <- err
	}
}

func (r *rankLoop) close() { r.tr.Close() }
