package main

import (
	"bytes"
	"compress/gzip"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"

	digitsdata "github.com/ddpgo/ddpgo/testdata/digits"
	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// The images are 8x8 with one channel, in 10 classes.
const (
	side    = 8
	classes = 10
)

// digits is a set of examples: pixels scaled to [0, 1], row-major, and
// their labels.
type digits struct {
	x []float32 // n × side × side
	y []int32
}

func (d *digits) len() int { return len(d.y) }

// tensors returns the images as [n, side, side, 1] and the labels as
// [n, 1], as GoMLX's sparse cross-entropy takes them.
func (d *digits) tensors() (inputs, labels []*tensors.Tensor) {
	return []*tensors.Tensor{tensors.FromFlatDataAndDimensions(d.x, d.len(), side, side, 1)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(d.y, d.len(), 1)}
}

// load reads the data set: path, or the embedded copy if path is empty;
// gzipped or plain CSV rows of 64 pixels in 0..16 and a label.
func load(path string) (*digits, error) {
	raw := digitsdata.CSVGz
	if path != "" {
		var err error
		if raw, err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}
	var r io.Reader = bytes.NewReader(raw)
	if len(raw) > 2 && raw[0] == 0x1f && raw[1] == 0x8b {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		r = zr
	}
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("digits: %w", err)
	}
	d := &digits{}
	for i, row := range rows {
		if len(row) != side*side+1 {
			return nil, fmt.Errorf("digits: row %d has %d fields, want %d", i+1, len(row), side*side+1)
		}
		for k, f := range row {
			v, err := strconv.Atoi(f)
			switch {
			case err != nil:
				return nil, fmt.Errorf("digits: row %d field %d: %w", i+1, k+1, err)
			case k == side*side && (v < 0 || v >= classes):
				return nil, fmt.Errorf("digits: row %d: label %d", i+1, v)
			case k == side*side:
				d.y = append(d.y, int32(v))
			case v < 0 || v > 16:
				return nil, fmt.Errorf("digits: row %d field %d: pixel %d", i+1, k+1, v)
			default:
				d.x = append(d.x, float32(v)/16)
			}
		}
	}
	if d.len() == 0 {
		return nil, errors.New("digits: no rows")
	}
	return d, nil
}

// split shuffles the examples with seed and returns the first 80% as the
// training set and the rest as the test set.
func (d *digits) split(seed uint64) (train, test *digits) {
	perm := rand.New(rand.NewPCG(seed, 0x5eed)).Perm(d.len())
	n := (d.len()*4 + 2) / 5
	return d.subset(perm[:n]), d.subset(perm[n:])
}

func (d *digits) subset(idx []int) *digits {
	s := &digits{}
	for _, i := range idx {
		s.x = append(s.x, d.x[i*side*side:(i+1)*side*side]...)
		s.y = append(s.y, d.y[i])
	}
	return s
}
