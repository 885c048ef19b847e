// Command digitscnn trains a convolutional network, written with GoMLX, on
// the 8x8 handwritten digits, data-parallel over ddpgo with package
// ddptrain: several ranks in one process, or one rank per process under
// mpirun.
//
// The network (conv 3x3 16, ReLU, max pool 2x2, conv 3x3 32, ReLU, max
// pool 2x2, dense 64, ReLU, dense 10) runs on GoMLX's pure-Go backend,
// simplego, so the in-process build needs no cgo. The data are the 1797
// images of the UCI "Optical Recognition of Handwritten Digits" set
// (embedded from the repository's testdata/digits; see its README.md),
// split 80/20 by a seeded shuffle.
// Each rank takes its shard of every epoch from ddptrain.Dataset (package
// sampler's order), so N ranks compute what one process computes on the
// global batch, up to float32 rounding.
//
// Usage:
//
//	go run ./examples/digitscnn [-ranks 2] [-epochs 8] [-batch 32] [-optimizer adam] [-lr 0.005] [-compression none|fp16|bf16|allreduce] [-model cnn|mlp] [-hidden 2560] [-shard elements|params] [-plain] [-steps N -warmup W]
//
// Across processes, one rank each (rank 0 prints):
//
//	go build -tags mpi -o digitscnn ./examples/digitscnn
//	mpirun -np 2 ./digitscnn -backend mpi
//
// Every epoch it prints the mean loss, the test accuracy and rank 0's
// step time split into the gradient graph, the hand-off (gradients into
// bucket memory, averages out), the reduction (the wait for the
// all-reduces not hidden by the hand-off) and the optimizer graph.
//
// -plain trains with GoMLX's own train.Trainer instead, in one process on
// the whole global batch: the baseline. -steps N stops after N steps (the
// first -warmup of them untimed) and prints the medians of the step and of
// its parts instead of training to the end: the benchmark of
// docs/lab/gomlx.md. With -compare the baseline and ddptrain over -ranks
// in-process ranks take turns, a step each, in one process. -model mlp is the larger model of that benchmark, a
// perceptron with two hidden layers of -hidden units. -shard shards the
// optimizer (ZeRO stage 1, docs/guide/zero.md): each rank's optimizer graph
// steps, and keeps Adam's moments for, its own range of each bucket's
// elements (elements: ddp.ShardElements) or its own variables (params:
// ddp.ShardParams); with -steps each rank prints the state it keeps and
// its optimizer's and gather's times.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ddpgo/ddpgo/mpi"
)

// config is what the flags set.
type config struct {
	Backend     string // inproc or mpi
	Ranks       int
	RanksSet    bool
	Shard       string // none, elements (ddp.ShardElements) or params (ddp.ShardParams): the optimizer's state and work sharded
	Model       string // cnn or mlp
	Hidden      int    // mlp's hidden units
	Epochs      int
	Batch       int // global
	Optimizer   string
	LR          float64
	Compression string
	ReadyBatch  int
	BucketCap   int // bytes; 0: ddpgo's default
	Seed        uint64
	Data        string
	Plain       bool
	Compare     bool // plain GoMLX and ddptrain (and sharded, with Shard) in turn, a step each
	Steps       int  // >0: benchmark mode
	Warmup      int
	Simplego    string // simplego's configuration
}

func defaultConfig() config {
	return config{Backend: "inproc", Ranks: 2, Model: "cnn", Hidden: 2560, Epochs: 8, Batch: 32,
		Optimizer: "adam", LR: 0.005, Compression: "none", Shard: "none", Seed: 1, Warmup: 3}
}

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.Backend, "backend", cfg.Backend, "inproc: -ranks goroutines in this process; mpi: one rank per process under mpirun (build with -tags mpi)")
	flag.IntVar(&cfg.Ranks, "ranks", cfg.Ranks, "data-parallel ranks in this process (with -backend mpi: the job's size)")
	flag.StringVar(&cfg.Model, "model", cfg.Model, "cnn, or mlp (the larger model: two hidden layers of -hidden units)")
	flag.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden units of -model mlp")
	flag.IntVar(&cfg.Epochs, "epochs", cfg.Epochs, "passes over the training set")
	flag.IntVar(&cfg.Batch, "batch", cfg.Batch, "global batch size, a multiple of the ranks")
	flag.StringVar(&cfg.Optimizer, "optimizer", cfg.Optimizer, "adam or sgd")
	flag.Float64Var(&cfg.LR, "lr", cfg.LR, "learning rate")
	flag.StringVar(&cfg.Compression, "compression", cfg.Compression, "gradient communication: none (fp32 average), allreduce (divide then sum), fp16 or bf16")
	flag.IntVar(&cfg.ReadyBatch, "ready-batch", cfg.ReadyBatch, "gradients handed over between marks ready (0: each at once)")
	flag.IntVar(&cfg.BucketCap, "bucket-cap", cfg.BucketCap, "bucket size in bytes (0: ddpgo's 25 MiB, 1 MiB for the first)")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the split, the initial weights and the shuffles")
	flag.StringVar(&cfg.Data, "data", cfg.Data, "data set (CSV, optionally gzipped); default: the embedded copy")
	flag.StringVar(&cfg.Shard, "shard", cfg.Shard, "shard the optimizer state (ZeRO stage 1): none; elements: each rank's optimizer graph steps its range of each bucket's elements (ddp.ShardElements); params: its own variables (ddp.ShardParams); then they are all-gathered")
	flag.BoolVar(&cfg.Plain, "plain", cfg.Plain, "train with GoMLX's own train.Trainer in one process, without ddpgo (the baseline)")
	flag.BoolVar(&cfg.Compare, "compare", cfg.Compare, "benchmark: plain GoMLX and ddptrain over -ranks in-process ranks take turns, a step each, for -steps steps; with -shard elements or params, ddptrain sharded takes its turn too, and its step is compared with the unsharded one turn by turn")
	flag.IntVar(&cfg.Steps, "steps", cfg.Steps, "benchmark: stop after this many steps and print the medians of the step and its parts")
	flag.IntVar(&cfg.Warmup, "warmup", cfg.Warmup, "benchmark: steps left out of the medians")
	flag.StringVar(&cfg.Simplego, "simplego", cfg.Simplego, "simplego's configuration (ops_sequential, parallelism=N; see simplego.New)")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { cfg.RanksSet = cfg.RanksSet || f.Name == "ranks" })
	err := run(context.Background(), os.Stdout, cfg)
	// MPI is finalized on every path; a no-op where it was not used.
	if err = errors.Join(err, mpi.Finalize()); err != nil {
		fmt.Fprintln(os.Stderr, "digitscnn:", err)
		os.Exit(1)
	}
}

var errConfig = errors.New("invalid configuration")

func (c config) validate() error {
	switch {
	case c.Backend != "inproc" && c.Backend != "mpi":
		return fmt.Errorf("%w: -backend %q, want inproc or mpi", errConfig, c.Backend)
	case models[c.Model] == nil:
		return fmt.Errorf("%w: -model %q, want cnn or mlp", errConfig, c.Model)
	case c.Ranks < 1 || c.Batch < c.Ranks || c.Batch%c.Ranks != 0:
		return fmt.Errorf("%w: -batch %d is not a positive multiple of -ranks %d", errConfig, c.Batch, c.Ranks)
	case c.Shard != "none" && c.Shard != "elements" && c.Shard != "params":
		return fmt.Errorf("%w: -shard %q, want none, elements or params", errConfig, c.Shard)
	case c.Optimizer != "adam" && c.Optimizer != "sgd":
		return fmt.Errorf("%w: -optimizer %q, want adam or sgd", errConfig, c.Optimizer)
	case !(c.LR > 0) || c.Epochs < 1 || c.Hidden < 1 || c.Steps < 0 || c.Warmup < 0:
		return fmt.Errorf("%w: -lr, -epochs and -hidden must be positive, -steps and -warmup not negative", errConfig)
	case c.Steps > 0 && c.Steps <= c.Warmup:
		return fmt.Errorf("%w: -steps %d leaves nothing after -warmup %d", errConfig, c.Steps, c.Warmup)
	case c.Compare && (c.Steps == 0 || c.Backend != "inproc" || c.Plain):
		return fmt.Errorf("%w: -compare needs -steps and in-process ranks", errConfig)
	}
	return nil
}

// run loads the data and trains, printing to out on rank 0.
func run(ctx context.Context, out io.Writer, cfg config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	ds, err := load(cfg.Data)
	if err != nil {
		return err
	}
	train, test := ds.split(cfg.Seed)
	if cfg.Plain {
		return trainPlain(out, cfg, train, test)
	}
	g, err := openGroup(ctx, &cfg)
	if err != nil {
		return err
	}
	defer g.close()
	if g.first != 0 {
		out = io.Discard
	}
	if cfg.Compare {
		return compare(ctx, out, cfg, g, train)
	}
	return trainGroup(ctx, out, cfg, g, train, test)
}
