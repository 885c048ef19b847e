package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/sampler"
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
)

// compare is -compare: plain GoMLX (train.Trainer on the global batch)
// and ddptrain over this process's ranks take turns, a step each, for
// cfg.Steps steps, so that the load of a shared machine falls on both
// alike; it prints each one's medians. Only in-process ranks.
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
	n := len(g.comms)
	ranks := make([]*rankLoop, n)
	for i, c := range g.comms {
		if ranks[i], err = newRankLoop(cfg, c, backend, model, inputs, labels, o); err != nil {
			return err
		}
		defer ranks[i].close()
	}
	done := make(chan error, n)
	for _, r := range ranks {
		go r.run(ctx, done)
	}
	defer func() {
		for _, r := range ranks {
			close(r.tick)
		}
	}()

	var ptimes, dtimes []ddptrain.Times
	var exposed []time.Duration
	for s := range cfg.Steps {
		start := time.Now()
		if err := plainStep(plain, pds); err != nil {
			return fmt.Errorf("plain GoMLX: %w", err)
		}
		pt := time.Since(start)
		for _, r := range ranks {
			r.tick <- struct{}{}
		}
		var errs []error
		for range ranks {
			errs = append(errs, <-done)
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if s < cfg.Warmup {
			continue
		}
		ptimes = append(ptimes, ddptrain.Times{Graph: pt, Step: pt})
		dtimes = append(dtimes, ranks[0].last)
		least := ranks[0].last.HandOff + ranks[0].last.Reduction
		for _, r := range ranks[1:] {
			least = min(least, r.last.HandOff+r.last.Reduction)
		}
		exposed = append(exposed, least)
	}
	fmt.Fprintf(out, "digitscnn: %s, batch %d, %s lr %g, compression %s: plain GoMLX and ddptrain over %d ranks in this process, a step each in turn\n",
		cfg.Model, cfg.Batch, cfg.Optimizer, cfg.LR, cfg.Compression, n)
	fmt.Fprintf(out, "plain:  %s\n", benchLine(cfg.Steps, ptimes, nil))
	fmt.Fprintf(out, "ddpgo:  %s\n", benchLine(cfg.Steps, dtimes, exposed))
	return nil
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

func newRankLoop(cfg config, c comm.Communicator, backend backends.Backend, model train.ModelFn, inputs, labels []*tensors.Tensor, o sampler.Options) (*rankLoop, error) {
	mctx, err := newContext(cfg)
	if err != nil {
		return nil, err
	}
	opts := ddptrain.Options{ReadyBatch: cfg.ReadyBatch, Reducer: ddp.Options{BucketCap: cfg.BucketCap, FirstBucketCap: cfg.BucketCap}}
	if opts.Reducer.Hook, err = hooks.ByName(cfg.Compression); err != nil {
		return nil, fmt.Errorf("%w: -compression: %w", errConfig, err)
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
