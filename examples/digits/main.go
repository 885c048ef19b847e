package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/mpi"
	"github.com/ddpgo/ddpgo/trace"
)

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.Backend, "backend", cfg.Backend, "inproc: -ranks goroutines in this process; mpi: one rank per process under mpirun (build with -tags mpi)")
	flag.IntVar(&cfg.Ranks, "ranks", cfg.Ranks, "number of data-parallel ranks (goroutines); with -backend mpi, the job's size (unset, or equal to it)")
	flag.IntVar(&cfg.Epochs, "epochs", cfg.Epochs, "passes over the training set")
	flag.IntVar(&cfg.Batch, "batch", cfg.Batch, "global batch size, a multiple of -ranks")
	flag.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden units")
	flag.Float64Var(&cfg.LR, "lr", cfg.LR, "learning rate")
	flag.Float64Var(&cfg.Momentum, "momentum", cfg.Momentum, "SGD momentum")
	flag.StringVar(&cfg.Optimizer, "opt", cfg.Optimizer, "optimizer: momentum (SGD with -momentum) or adam (try -lr 0.002)")
	flag.BoolVar(&cfg.Shard, "shard", cfg.Shard, "shard the optimizer state (ZeRO stage 1): each rank reduce-scatters the gradients, steps its own part of each bucket and all-gathers the parameters")
	flag.StringVar(&cfg.Hook, "hook", cfg.Hook, "gradient communication: none (fp32 average), allreduce (fp32, divide then sum), fp16, bf16 or powersgd")
	flag.IntVar(&cfg.PowerSGDRank, "powersgd-rank", cfg.PowerSGDRank, "with -hook powersgd: the rank of each weight matrix's approximation")
	flag.IntVar(&cfg.PowerSGDStart, "powersgd-start", cfg.PowerSGDStart, "with -hook powersgd: synced steps averaged uncompressed before compression starts")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the split, the initial weights and the shuffles")
	flag.StringVar(&cfg.Data, "data", cfg.Data, "data set (CSV, optionally gzipped); default: the embedded copy")
	flag.BoolVar(&cfg.Stats, "stats", cfg.Stats, "print rank 0's mean step timings per epoch: step, backward, communication and the share of it hidden behind backward")
	flag.StringVar(&cfg.Trace, "trace", cfg.Trace, "write a timeline of steps 2-4 of every rank to this file (Chrome trace JSON; open in ui.perfetto.dev); with -backend mpi, one file per rank, FILE with .rankN before its extension")
	flag.StringVar(&cfg.Save, "save", cfg.Save, "write rank 0's final weights to this file: every parameter in order (W1, b1, W2, b2), as little-endian float32")
	flag.StringVar(&cfg.Checkpoint, "checkpoint", cfg.Checkpoint, "after the last epoch, write the weights and the optimizer's state (consolidated on rank 0 with -shard) to this file")
	flag.StringVar(&cfg.Resume, "resume", cfg.Resume, "start from this -checkpoint file, written by any number of ranks, sharded or not; -epochs counts the epochs done before")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { cfg.RanksSet = cfg.RanksSet || f.Name == "ranks" })
	err := run(os.Stdout, cfg)
	// Said before MPI_Finalize: once a peer has left it with a failure,
	// mpirun may end this process before it could say why.
	if err != nil {
		fmt.Fprintln(os.Stderr, "digits:", err)
	}
	// MPI must be finalized before the process exits, on every path; a
	// no-op where MPI was not used.
	if ferr := mpi.Finalize(); ferr != nil {
		fmt.Fprintln(os.Stderr, "digits:", ferr)
		err = ferr
	}
	if err != nil {
		os.Exit(1)
	}
}

// errConfig is returned (wrapped) for an invalid flag combination. main
// prefixes every error with "digits:", so the text here does not.
var errConfig = errors.New("invalid configuration")

func (c config) validate() error {
	switch {
	case c.Backend != "inproc" && c.Backend != "mpi":
		return fmt.Errorf("%w: -backend %q, want inproc or mpi", errConfig, c.Backend)
	case c.Ranks < 1:
		return fmt.Errorf("%w: -ranks %d, want >= 1", errConfig, c.Ranks)
	case c.Batch < c.Ranks || c.Batch%c.Ranks != 0:
		return fmt.Errorf("%w: -batch %d is not a positive multiple of -ranks %d", errConfig, c.Batch, c.Ranks)
	case c.Epochs < 0:
		return fmt.Errorf("%w: -epochs %d", errConfig, c.Epochs)
	case c.Hidden < 1:
		return fmt.Errorf("%w: -hidden %d", errConfig, c.Hidden)
	case !(c.LR > 0):
		return fmt.Errorf("%w: -lr %v, want > 0", errConfig, c.LR)
	case !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("%w: -momentum %v, want in [0, 1)", errConfig, c.Momentum)
	case c.Optimizer != "momentum" && c.Optimizer != "adam":
		return fmt.Errorf("%w: -opt %q, want momentum or adam", errConfig, c.Optimizer)
	case c.Shard && c.Hook == "powersgd":
		return fmt.Errorf("%w: -shard reduce-scatters each bucket, which -hook powersgd cannot do", errConfig)
	}
	return nil
}

// run loads the data, trains and prints one line per epoch to out.
func run(out io.Writer, cfg config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	ds, err := loadDigits(cfg.Data)
	if err != nil {
		return err
	}
	g, err := openGroup(context.Background(), &cfg)
	if err != nil {
		return err
	}
	defer g.close()
	if g.first != 0 {
		out = io.Discard // rank 0 reports for the job
	}
	train, test := ds.split(cfg.Seed, trainFraction)
	if train.len() < cfg.Batch {
		return fmt.Errorf("%w: -batch %d exceeds the %d training examples", errConfig, cfg.Batch, train.len())
	}
	ranks := rankCount(cfg.Ranks)
	if g.mpi {
		ranks += " (a process each, over MPI)"
	}
	fmt.Fprintf(out, "digits: %d train / %d test examples, %s, batch %d (%d per rank), hook %s\n",
		train.len(), test.len(), ranks, cfg.Batch, cfg.Batch/cfg.Ranks, cfg.Hook)
	if cfg.Stats {
		fmt.Fprintln(out, overlapNote(len(g.comms), runtime.GOMAXPROCS(0)))
	}
	// Rank 0's step statistics, summed over an epoch (rank 0's callbacks
	// all run on its own goroutine).
	var sum struct {
		steps                       int
		wall, backward, comm, ovlap time.Duration
	}
	tl := newTimeline(g.first, len(g.comms))
	// The files are created now, so that a bad path fails before training
	// does, on every rank of the job (ready).
	traceFile, saveFile, err := createFiles(g, cfg)
	if err = g.ready(context.Background(), err); err != nil {
		return errors.Join(err, closeFile(traceFile), closeFile(saveFile))
	}
	params := (&mlp{in: Pixels, hidden: cfg.Hidden, out: Classes}).params()
	obs := observer{
		step: func(rank int, s *ddp.StepStats) {
			if cfg.Trace != "" {
				tl.keep(rank, s)
			}
			if rank == 0 {
				sum.steps++
				sum.wall += s.Wall
				sum.backward += s.Compute
				sum.comm += s.Comm
				sum.ovlap += s.Overlap
			}
		},
		state: func(rank, bytes int) {
			if rank == 0 && (cfg.Shard || cfg.Optimizer != "momentum") {
				all := 0 // unsharded: a float32 per element, two with Adam
				for _, p := range params {
					all += 4 * p.Numel()
				}
				if cfg.Optimizer == "adam" {
					all *= 2
				}
				fmt.Fprintf(out, "optimizer %s: rank 0 keeps %d of %d bytes of state", cfg.Optimizer, bytes, all)
				if cfg.Shard {
					fmt.Fprint(out, " (-shard)")
				}
				fmt.Fprintln(out)
			}
		},
		epoch: func(epoch int, m *mlp) {
			trLoss, trAcc := m.evaluate(train, 256)
			teLoss, teAcc := m.evaluate(test, 256)
			fmt.Fprintf(out, "epoch %3d  train loss %.4f acc %6.2f%%  test loss %.4f acc %6.2f%%",
				epoch+1, trLoss, 100*trAcc, teLoss, 100*teAcc)
			if n := time.Duration(max(sum.steps, 1)); cfg.Stats {
				hidden := 0.0
				if sum.comm > 0 {
					hidden = 100 * float64(sum.ovlap) / float64(sum.comm)
				}
				fmt.Fprintf(out, "  step %v  backward %v  comm %v (%.0f%% hidden)",
					(sum.wall / n).Round(time.Microsecond), (sum.backward / n).Round(time.Microsecond),
					(sum.comm / n).Round(time.Microsecond), hidden)
			}
			fmt.Fprintln(out)
			sum.steps, sum.wall, sum.backward, sum.comm, sum.ovlap = 0, 0, 0, 0, 0
		},
	}
	models, err := trainRanks(context.Background(), g.comms, train, cfg, obs)
	if saveFile != nil {
		if err == nil {
			err = saveWeights(saveFile, models[0])
		}
		err = errors.Join(err, saveFile.Close())
	}
	if traceFile != nil {
		return errors.Join(err, tl.write(traceFile, cfg, params))
	}
	return err
}

// saveWeights writes m's parameters, in order, as little-endian float32.
func saveWeights(f *os.File, m *mlp) error {
	var b []byte
	for _, v := range m.values() {
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	_, err := f.Write(b)
	return err
}

// createFiles creates this process's -trace file and, on rank 0, the -save
// file; on failure it closes what it created.
func createFiles(g *group, cfg config) (traceFile, saveFile *os.File, err error) {
	if cfg.Trace != "" {
		if traceFile, err = os.Create(g.path(cfg.Trace)); err != nil {
			return nil, nil, err
		}
	}
	if cfg.Save != "" && g.first == 0 {
		if saveFile, err = os.Create(cfg.Save); err != nil {
			return nil, nil, errors.Join(err, closeFile(traceFile))
		}
	}
	return traceFile, saveFile, nil
}

// closeFile closes f, if there is one.
func closeFile(f *os.File) error {
	if f == nil {
		return nil
	}
	return f.Close()
}

// overlapNote says, for -stats, whether the "hidden" share can show. Each
// rank's backward keeps a core busy; its all-reduce runs on the rank's
// communication goroutine and needs a core of its own at the same time.
// A GPU computing backward would leave the CPU free; here the backward is
// the CPU's.
func overlapNote(ranks, procs int) string {
	if ranks >= procs {
		verb := "compute"
		if ranks == 1 {
			verb = "computes"
		}
		return fmt.Sprintf("note: %s %s backward on %d cores (GOMAXPROCS): an all-reduce started during backward\n"+
			"      waits for a core, so little or none of it hides behind backward (%% hidden below);\n"+
			"      with more cores than ranks, layer 2's all-reduce overlaps layer 1's backward", rankCount(ranks), verb, procs)
	}
	return fmt.Sprintf("note: %s on %d cores (GOMAXPROCS): a core is free for layer 2's all-reduce while layer 1's backward runs",
		rankCount(ranks), procs)
}

// rankCount is "1 rank" or "N ranks".
func rankCount(n int) string {
	if n == 1 {
		return "1 rank"
	}
	return fmt.Sprintf("%d ranks", n)
}

// The trace records these steps of every rank: the first step runs on the
// initial bucket layout, which the Reducer rebuilds after it.
const (
	traceFrom  = 2
	traceSteps = 3
)

// timeline keeps a copy of every rank's statistics for the traced
// steps, which the ranks report concurrently; write turns them into a
// trace, one step at a time.
type timeline struct {
	mu    sync.Mutex
	first int                         // the first rank this process runs
	steps [traceSteps][]ddp.StepStats // [step-traceFrom][rank-first]
}

func newTimeline(first, ranks int) *timeline {
	tl := &timeline{first: first}
	for i := range tl.steps {
		tl.steps[i] = make([]ddp.StepStats, ranks)
	}
	return tl
}

// keep copies s if it is a traced step. s is only valid during the call.
func (tl *timeline) keep(rank int, s *ddp.StepStats) {
	if s.Step < traceFrom || s.Step >= traceFrom+traceSteps {
		return
	}
	c := *s
	c.Buckets = slices.Clone(s.Buckets)
	c.ParamReady = slices.Clone(s.ParamReady)
	c.Unused = slices.Clone(s.Unused)
	tl.mu.Lock()
	tl.steps[s.Step-traceFrom][rank-tl.first] = c
	tl.mu.Unlock()
}

// write writes the kept steps to f and closes it, every rank's step as
// one trace step, so that the file's trace_steps counts them.
func (tl *timeline) write(f *os.File, cfg config, params []ddp.Param) error {
	w := trace.New(f, trace.Options{Metadata: map[string]string{
		"program": "digits", "ranks": strconv.Itoa(cfg.Ranks), "hook": cfg.Hook,
		"batch": strconv.Itoa(cfg.Batch), "steps": fmt.Sprintf("%d..%d", traceFrom, traceFrom+traceSteps-1),
	}})
	var werr error
	for _, ranks := range tl.steps {
		if ranks[0].Step == 0 {
			break // training ended before this step
		}
		for r := range ranks {
			ddp.WriteTimeline(w, tl.first+r, &ranks[r], params)
		}
		if werr = w.EndStep(); werr != nil {
			break
		}
	}
	return errors.Join(werr, w.Close(), f.Close())
}
