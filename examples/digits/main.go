package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	cfg := defaultConfig()
	flag.IntVar(&cfg.Ranks, "ranks", cfg.Ranks, "number of data-parallel ranks (goroutines)")
	flag.IntVar(&cfg.Epochs, "epochs", cfg.Epochs, "passes over the training set")
	flag.IntVar(&cfg.Batch, "batch", cfg.Batch, "global batch size, a multiple of -ranks")
	flag.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden units")
	flag.Float64Var(&cfg.LR, "lr", cfg.LR, "learning rate")
	flag.Float64Var(&cfg.Momentum, "momentum", cfg.Momentum, "SGD momentum")
	flag.StringVar(&cfg.Hook, "hook", cfg.Hook, "gradient communication: none (fp32), fp16 or bf16")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the split, the initial weights and the shuffles")
	flag.StringVar(&cfg.Data, "data", cfg.Data, "data set (CSV, optionally gzipped); default: the embedded copy")
	flag.Parse()
	if err := run(os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "digits:", err)
		os.Exit(1)
	}
}

// errConfig is returned (wrapped) for an invalid flag combination.
var errConfig = errors.New("digits: invalid configuration")

func (c config) validate() error {
	switch {
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
	train, test := ds.split(cfg.Seed, trainFraction)
	if train.len() < cfg.Batch {
		return fmt.Errorf("%w: -batch %d exceeds the %d training examples", errConfig, cfg.Batch, train.len())
	}
	fmt.Fprintf(out, "digits: %d train / %d test examples, %d ranks, batch %d (%d per rank), hook %s\n",
		train.len(), test.len(), cfg.Ranks, cfg.Batch, cfg.Batch/cfg.Ranks, cfg.Hook)
	report := func(epoch int, m *mlp) {
		trLoss, trAcc := m.evaluate(train, 256)
		teLoss, teAcc := m.evaluate(test, 256)
		fmt.Fprintf(out, "epoch %3d  train loss %.4f acc %6.2f%%  test loss %.4f acc %6.2f%%\n",
			epoch+1, trLoss, 100*trAcc, teLoss, 100*teAcc)
	}
	_, err = trainGroup(context.Background(), train, cfg, report)
	return err
}
