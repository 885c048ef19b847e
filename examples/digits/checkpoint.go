package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/ddpgo/ddpgo/ddp"
)

// A checkpoint is what -checkpoint writes after the last epoch and
// -resume starts from: the epochs done, the optimizer's steps (Adam's bias
// correction counts them), the weights, and the optimizer's state in its
// unsharded form, each kind of it (momentum; Adam's two moments) shaped
// like the parameters. With -shard each rank holds its own parts of the
// state only, so they are consolidated on rank 0 first
// (ddp.Reducer.Consolidate, PyTorch's consolidate_state_dict). Any number
// of ranks, with -shard or without, resume from it: each takes its parts
// of the state (ddp.Reducer.Owned), or all of it.
//
// The file: the magic line, then little-endian uint32 epochs, steps,
// optimizer (0 momentum, 1 adam) and hidden units, then float32 weights
// (W1, b1, W2, b2) and each kind of state in the same order.
type checkpoint struct {
	epochs, steps int
	adam          bool
	hidden        int
	weights       [][]float32
	state         [][][]float32 // per kind: per parameter
}

const checkpointMagic = "ddpgo digits checkpoint 1\n"

// errCheckpoint is returned (wrapped) for a checkpoint that does not fit
// the configuration or is not one.
var errCheckpoint = errors.New("bad checkpoint")

// saveCheckpoint consolidates opt's state on rank 0, which writes the
// checkpoint of m after epochs epochs to path. Every rank calls it.
func saveCheckpoint(ctx context.Context, r *ddp.Reducer, path string, epochs int, m *mlp, opt *optimizer) error {
	ck := checkpoint{epochs: epochs, steps: opt.t, adam: opt.adam, hidden: m.hidden, weights: m.values()}
	for kind := range opt.kinds() {
		full := shapedLike(m.values())
		opt.export(kind, full)
		if err := r.Consolidate(ctx, 0, full); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		ck.state = append(ck.state, full)
	}
	if r.Rank() != 0 {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(ck.write(f), f.Close())
}

// loadCheckpoint reads the checkpoint at path, for a model and optimizer
// made from cfg.
func loadCheckpoint(path string, cfg config) (*checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ck, err := readCheckpoint(bufio.NewReader(f), cfg)
	if err != nil {
		return nil, fmt.Errorf("-resume %s: %w", path, err)
	}
	return ck, nil
}

// restore gives m the checkpoint's weights and opt its state (the parts
// opt keeps) and steps.
func (ck *checkpoint) restore(m *mlp, opt *optimizer) {
	for i, w := range m.values() {
		copy(w, ck.weights[i])
	}
	for kind, s := range ck.state {
		opt.load(kind, s)
	}
	opt.t = ck.steps
}

func (ck *checkpoint) write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	bw.WriteString(checkpointMagic)
	var b []byte
	for _, x := range []int{ck.epochs, ck.steps, boolInt(ck.adam), ck.hidden} {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	bw.Write(b)
	for _, params := range append([][][]float32{ck.weights}, ck.state...) {
		for _, v := range params {
			b = b[:0]
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
			bw.Write(b)
		}
	}
	return bw.Flush()
}

// readCheckpoint reads a checkpoint written by write and checks that it
// fits cfg (its hidden units and optimizer).
func readCheckpoint(r io.Reader, cfg config) (*checkpoint, error) {
	magic := make([]byte, len(checkpointMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != checkpointMagic {
		return nil, fmt.Errorf("%w: not a digits checkpoint", errCheckpoint)
	}
	var h [4]uint32
	if err := binary.Read(r, binary.LittleEndian, &h); err != nil {
		return nil, fmt.Errorf("%w: its header: %w", errCheckpoint, err)
	}
	ck := &checkpoint{epochs: int(h[0]), steps: int(h[1]), adam: h[2] == 1, hidden: int(h[3])}
	switch {
	case ck.hidden != cfg.Hidden:
		return nil, fmt.Errorf("%w: %d hidden units, -hidden %d", errCheckpoint, ck.hidden, cfg.Hidden)
	case ck.adam != (cfg.Optimizer == "adam"):
		return nil, fmt.Errorf("%w: optimizer adam %v, -opt %s", errCheckpoint, ck.adam, cfg.Optimizer)
	case ck.epochs > cfg.Epochs:
		return nil, fmt.Errorf("%w: %d epochs done, -epochs %d", errCheckpoint, ck.epochs, cfg.Epochs)
	}
	like := (&mlp{in: Pixels, hidden: ck.hidden, out: Classes}).params()
	read := func() ([][]float32, error) {
		out := make([][]float32, len(like))
		for i, p := range like {
			out[i] = make([]float32, p.Numel())
			if err := binary.Read(r, binary.LittleEndian, out[i]); err != nil {
				return nil, fmt.Errorf("%w: %s: %w", errCheckpoint, p.Name, err)
			}
		}
		return out, nil
	}
	var err error
	if ck.weights, err = read(); err != nil {
		return nil, err
	}
	for range 1 + boolInt(ck.adam) {
		s, err := read()
		if err != nil {
			return nil, err
		}
		ck.state = append(ck.state, s)
	}
	if n, _ := r.Read(make([]byte, 1)); n != 0 {
		return nil, fmt.Errorf("%w: bytes after the state", errCheckpoint)
	}
	return ck, nil
}

// shapedLike returns zeros shaped like params.
func shapedLike(params [][]float32) [][]float32 {
	out := make([][]float32, len(params))
	for i, p := range params {
		out[i] = make([]float32, len(p))
	}
	return out
}
