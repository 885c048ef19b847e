package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/mpi"
	"github.com/ddpgo/ddpgo/sampler"
)

// bucketCap is the byte limit of the gradient buckets. Backward produces
// b2 and W2 (5,160 bytes) first, then b1 and W1 (33,280 bytes); a 4 KiB cap
// puts each layer in a bucket of its own, so the last layer's all-reduce
// starts while the first layer's gradients are still being computed. (The
// default, 25 MiB, would put the whole 38 KB model in one bucket.)
const bucketCap = 4 << 10

// observer receives what train reports; either function may be nil.
type observer struct {
	step  func(rank int, s *ddp.StepStats) // every rank, after every step
	epoch func(epoch int, m *mlp)          // rank 0, after every epoch
	state func(rank, bytes int)            // every rank, once: its optimizer state's size
}

// train is one rank's training loop; every rank of c runs it at the same
// time on the same data and returns its replica, identical on all ranks.
// Each rank takes its shard of every epoch from a sampler, in batches of
// cfg.Batch/c.Size() examples, the ranks' batches of one step making up
// one global batch of cfg.Batch; the Reducer averages the gradients while
// backward runs.
func train(ctx context.Context, c comm.Communicator, data *dataset, cfg config, hook hooks.Hook, obs observer) (*mlp, error) {
	m := newMLP(cfg.Seed, Pixels, cfg.Hidden, Classes)
	var ck *checkpoint
	if cfg.Resume != "" {
		var err error
		if ck, err = loadCheckpoint(cfg.Resume, cfg); err != nil {
			return nil, err
		}
	}
	opts := ddp.Options{Hook: hook, FirstBucketCap: bucketCap, BucketCap: bucketCap}
	if cfg.Shard {
		opts.Shard = ddp.ShardElements
	}
	r, err := ddp.New(ctx, c, m.params(), opts)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := r.BroadcastParameters(ctx, m.values()); err != nil { // start from rank 0's weights
		return nil, err
	}
	parts := wholeParts(m.values())
	if cfg.Shard { // state for this rank's part of each bucket only
		parts = parts[:0]
		for k := range r.Buckets() {
			parts = append(parts, r.Owned(k)...)
		}
	}
	opt := newOptimizer(cfg, parts)
	start := 0
	if ck != nil {
		ck.restore(m, opt) // every rank: the weights and its parts of the state
		start = ck.epochs
	}
	if obs.state != nil {
		obs.state(c.Rank(), opt.stateBytes())
	}
	shard := cfg.Batch / c.Size()
	// This rank's share of every epoch: the shuffle is the same on every
	// rank, and batch b of all ranks together is the global batch b.
	smp, err := sampler.New(data.len(), c.Size(), c.Rank(), sampler.Options{Shuffle: true, Seed: cfg.Seed, DropLast: true})
	if err != nil {
		return nil, err
	}
	var mine []int
	var stats ddp.StepStats // reused: StatsInto allocates nothing once warm
	var x []float32
	var y []int32
	for epoch := start; epoch < cfg.Epochs; epoch++ {
		mine = smp.Epoch(epoch, mine)
		for b := range len(mine) / shard { // the last partial batch is dropped
			x, y = data.gather(x, y, mine[b*shard:(b+1)*shard])
			if err := r.Begin(ddp.Sync); err != nil {
				return nil, err
			}
			m.forward(x, y)
			if err := m.backward(r.Grad, r.Ready); err != nil { // layer 2's all-reduce overlaps layer 1
				return nil, err
			}
			if cfg.Shard {
				if err := shardedStep(ctx, r, opt, m.values()); err != nil {
					return nil, err
				}
			} else {
				if err := r.Wait(ctx); err != nil { // gradients now hold the average over ranks
					return nil, err
				}
				if err := opt.step(m.values(), r.Grad); err != nil {
					return nil, err
				}
			}
			if obs.step != nil {
				r.StatsInto(&stats) // timings of this step: compute, comm, overlap, per bucket
				obs.step(c.Rank(), &stats)
			}
		}
		if c.Rank() == 0 && obs.epoch != nil {
			obs.epoch(epoch, m)
		}
	}
	if cfg.Checkpoint != "" {
		if err := saveCheckpoint(ctx, r, cfg.Checkpoint, cfg.Epochs, m, opt); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// shardedStep ends a step with -shard: as each bucket is reduced, this
// rank steps the part of it that it owns (the only part whose gradients
// it received) and publishes it with Gather, which all-gathers it while
// later buckets are still reduced or stepped; WaitGather then gives every
// rank every rank's updates.
func shardedStep(ctx context.Context, r *ddp.Reducer, opt *optimizer, values [][]float32) error {
	opt.begin()
	var stepErr error
	err := r.WaitEach(ctx, func(b ddp.Reduced) {
		for _, pt := range b.Owned {
			g, err := r.Grad(pt.Param)
			if err != nil {
				stepErr = cmp.Or(stepErr, err)
				return
			}
			opt.update(pt, values[pt.Param][pt.Lo:pt.Hi], g[pt.Lo:pt.Hi])
		}
		stepErr = cmp.Or(stepErr, r.Gather(b.Bucket, values))
	})
	if err = cmp.Or(err, stepErr); err != nil {
		return err
	}
	return r.WaitGather(ctx)
}

// params describes the model's parameters to the Reducer, in registration
// (forward) order.
func (m *mlp) params() []ddp.Param {
	names, shapes := m.shapes()
	ps := make([]ddp.Param, len(names))
	for i := range ps {
		ps[i] = ddp.Param{Name: names[i], Shape: shapes[i]}
	}
	return ps
}

// newHook returns the Reducer hook named by the -hook flag: a new value per
// rank, since a hook belongs to one rank.
func newHook(cfg config) (hooks.Hook, error) {
	switch name := cfg.Hook; name {
	case "none", "":
		return hooks.Avg(), nil
	case "allreduce":
		return hooks.AllReduce(), nil
	case "fp16":
		return hooks.FP16(), nil
	case "bf16":
		return hooks.BF16(), nil
	case "powersgd":
		o := hooks.DefaultPowerSGDOptions()
		o.Rank, o.StartIter = cfg.PowerSGDRank, cfg.PowerSGDStart
		if o.Rank < 1 || o.StartIter < 0 {
			return nil, fmt.Errorf("%w: -powersgd-rank %d and -powersgd-start %d, want a rank of at least 1 and a start of 0 or more", errConfig, o.Rank, o.StartIter)
		}
		return hooks.PowerSGD(o), nil
	}
	return nil, fmt.Errorf("%w: -hook %q, want none, allreduce, fp16, bf16 or powersgd", errConfig, cfg.Hook)
}

// group is the ranks this process runs: every rank of an in-process
// group, or this process's rank of a job launched by mpirun.
type group struct {
	comms []comm.Communicator
	first int  // the rank of comms[0]
	mpi   bool // one rank per process
	close func()
}

// openGroup starts cfg.Backend's ranks. Under mpi the job's size is the
// number of ranks: cfg.Ranks is set to it, and a -ranks given on the
// command line must equal it.
func openGroup(ctx context.Context, cfg *config) (*group, error) {
	if cfg.Backend != "mpi" {
		cs, err := launch.Open(ctx, "inproc", launch.Options{Ranks: cfg.Ranks})
		if err != nil {
			return nil, err
		}
		return &group{comms: cs, close: func() { closeAll(cs) }}, nil
	}
	if info := mpi.LibraryInfo(); !info.Built {
		// Said before the launcher's environment is read, which would
		// otherwise fail first under a plain run.
		_, err := mpi.Open(mpi.Options{})
		return nil, fmt.Errorf("-backend mpi: this binary was built without it: go build -tags mpi ./examples/digits, then mpirun -np N ./digits -backend mpi (%w)", err)
	}
	env, err := launch.FromEnv()
	if errors.Is(err, launch.ErrNoLauncher) {
		env, err = launch.Env{Launcher: "none (a single process)", Size: 1, LocalSize: 1}, nil
	}
	if err != nil {
		return nil, err
	}
	if cfg.RanksSet && cfg.Ranks != env.Size {
		return nil, fmt.Errorf("%w: -ranks %d, but the job has %d processes (%s): leave -ranks unset under a launcher, or make them equal",
			errConfig, cfg.Ranks, env.Size, env.Launcher)
	}
	cfg.Ranks = env.Size
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// One communicator per process and one training loop: blocking
	// collectives are the faster mode (see package mpi).
	cs, err := launch.Open(ctx, "mpi", launch.Options{Env: &env, Config: mpi.Options{Blocking: true}})
	if err != nil {
		return nil, fmt.Errorf("starting rank %d of %d over MPI: %w", env.Rank, env.Size, err)
	}
	return &group{comms: cs, first: env.Rank, mpi: true, close: func() { closeAll(cs) }}, nil
}

// path names this process's copy of an output file: name itself, or under
// mpi, name with .rankN before its extension.
func (g *group) path(name string) string {
	if !g.mpi {
		return name
	}
	ext := filepath.Ext(name)
	return fmt.Sprintf("%s.rank%d%s", strings.TrimSuffix(name, ext), g.first, ext)
}

func closeAll(cs []comm.Communicator) {
	for _, c := range cs {
		c.Close()
	}
}

// trainGroup trains cfg.Ranks replicas at once, one goroutine per rank over
// an in-process group, and returns every rank's model.
func trainGroup(ctx context.Context, data *dataset, cfg config, obs observer) ([]*mlp, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	comms, err := launch.Open(ctx, "inproc", launch.Options{Ranks: cfg.Ranks})
	if err != nil {
		return nil, err
	}
	defer closeAll(comms)
	return trainRanks(ctx, comms, data, cfg, obs)
}

// trainRanks trains the replicas of comms' ranks at once, a goroutine
// each, and returns their models. If one rank fails, its Reducer aborts
// the group, so the others fail too instead of waiting.
func trainRanks(ctx context.Context, comms []comm.Communicator, data *dataset, cfg config, obs observer) ([]*mlp, error) {
	models := make([]*mlp, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		hook, err := newHook(cfg)
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			models[i], errs[i] = train(ctx, c, data, cfg, hook, obs)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("rank %d: %w", c.Rank(), errs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return models, nil
}
