package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"

	"github.com/ddpgo/ddpgo/testdata/digits"
)

// Pixels is the number of inputs of one example (an 8x8 image) and
// Classes the number of labels.
const (
	Pixels  = 64
	Classes = 10
)

// errFormat is returned (wrapped, with the line number) for a malformed row.
var errFormat = errors.New("digits: malformed data")

// dataset holds examples as rows of normalised pixels (0..1) and labels.
type dataset struct {
	x []float32 // len = n*Pixels, row-major
	y []int32   // len = n
}

func (d *dataset) len() int { return len(d.y) }

// row returns the pixels of example i.
func (d *dataset) row(i int) []float32 { return d.x[i*Pixels : (i+1)*Pixels] }

// loadDigits reads the data set from path, or the embedded copy if path is
// empty. The file may be gzip-compressed or plain CSV.
func loadDigits(path string) (*dataset, error) {
	var r io.Reader
	if path == "" {
		r = bytes.NewReader(digits.CSVGz)
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("digits: %s: %w", path, err)
		}
		defer zr.Close()
		return parseDigits(zr)
	}
	return parseDigits(br)
}

// parseDigits parses rows of Pixels integers in 0..16 followed by a label
// in 0..Classes-1. Blank lines are skipped.
func parseDigits(r io.Reader) (*dataset, error) {
	d := &dataset{}
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		fields := strings.Split(text, ",")
		if len(fields) != Pixels+1 {
			return nil, fmt.Errorf("%w: line %d has %d fields, want %d", errFormat, line, len(fields), Pixels+1)
		}
		for k, f := range fields {
			v, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				return nil, fmt.Errorf("%w: line %d field %d: %v", errFormat, line, k+1, err)
			}
			if k == Pixels {
				if v < 0 || v >= Classes {
					return nil, fmt.Errorf("%w: line %d: label %d not in 0..%d", errFormat, line, v, Classes-1)
				}
				d.y = append(d.y, int32(v))
				break
			}
			if v < 0 || v > 16 {
				return nil, fmt.Errorf("%w: line %d field %d: pixel %d not in 0..16", errFormat, line, k+1, v)
			}
			d.x = append(d.x, float32(v)/16)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("digits: line %d: %w", line+1, err)
	}
	if d.len() == 0 {
		return nil, fmt.Errorf("%w: no rows", errFormat)
	}
	return d, nil
}

// split shuffles the examples with seed and returns the first
// round(trainFrac*n) as the training set and the rest as the test set.
// The same seed always gives the same split.
func (d *dataset) split(seed uint64, trainFrac float64) (train, test *dataset) {
	perm := rand.New(rand.NewPCG(seed, 0x5eed)).Perm(d.len())
	nTrain := int(trainFrac*float64(d.len()) + 0.5)
	return d.subset(perm[:nTrain]), d.subset(perm[nTrain:])
}

// subset copies the examples idx into a new data set.
func (d *dataset) subset(idx []int) *dataset {
	s := &dataset{x: make([]float32, 0, len(idx)*Pixels), y: make([]int32, 0, len(idx))}
	for _, i := range idx {
		s.x = append(s.x, d.row(i)...)
		s.y = append(s.y, d.y[i])
	}
	return s
}

// gather copies the examples order[lo:hi] into x and y (resliced to fit).
func (d *dataset) gather(x []float32, y []int32, order []int) ([]float32, []int32) {
	x, y = x[:0], y[:0]
	for _, i := range order {
		x = append(x, d.row(i)...)
		y = append(y, d.y[i])
	}
	return x, y
}
