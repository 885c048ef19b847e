package ddptrain

import (
	"errors"
	"fmt"
	"io"

	"github.com/ddpgo/ddpgo/sampler"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// Dataset is a train.Dataset that yields one rank's shard of an
// in-memory data set, in batches, in the order package sampler gives that
// rank (PyTorch DistributedSampler's rule): the ranks' batches of one step
// together hold one global batch, the one a single process would take
// with a batch ranks times larger. Each epoch ends with io.EOF, dropping
// the last partial batch; Reset starts the next epoch.
//
// It plugs into GoMLX's dataset tools (datasets.Map, datasets.Parallel,
// train.Loop's dataset argument) like any other train.Dataset. Yield
// allocates the batch's tensors, which the caller owns.
type Dataset struct {
	name           string
	inputs, labels []*tensors.Tensor
	rows           int
	batch          int
	smp            *sampler.Sampler
	epoch          int
	order          []int
	next           int
}

// NewDataset returns rank's shard, out of ranks, of the examples in inputs
// and labels (the first axis of every tensor indexes the examples, the
// same number in each), in batches of batch examples. batch is per rank:
// each Yield returns batch examples of this rank's shard, and a step's
// global batch is ranks·batch (for a global batch B, pass B/ranks, as the
// example does). o configures the sampler (shuffle, seed, drop or pad),
// and must be the same on every rank.
func NewDataset(name string, rank, ranks, batch int, inputs, labels []*tensors.Tensor, o sampler.Options) (*Dataset, error) {
	if batch < 1 || len(inputs) == 0 {
		return nil, fmt.Errorf("%w: dataset %q: batch %d with %d inputs", ErrUnsupported, name, batch, len(inputs))
	}
	rows := -1
	for _, x := range append(append([]*tensors.Tensor(nil), inputs...), labels...) {
		if x.Rank() == 0 {
			return nil, fmt.Errorf("%w: dataset %q: a scalar tensor has no examples axis", ErrUnsupported, name)
		}
		n := x.Shape().Dimensions[0]
		if rows >= 0 && n != rows {
			return nil, fmt.Errorf("%w: dataset %q: tensors of %d and %d examples", ErrUnsupported, name, rows, n)
		}
		rows = n
	}
	smp, err := sampler.New(rows, ranks, rank, o)
	if err != nil {
		return nil, fmt.Errorf("dataset %q: %w", name, err)
	}
	d := &Dataset{name: name, inputs: inputs, labels: labels, rows: rows, batch: batch, smp: smp}
	d.order = smp.Epoch(0, nil)
	return d, nil
}

// Name returns the data set's name.
func (d *Dataset) Name() string { return d.name }

// Epoch returns the epoch being yielded, from 0.
func (d *Dataset) Epoch() int { return d.epoch }

// Reset starts the next epoch.
func (d *Dataset) Reset() { d.SetEpoch(d.epoch + 1) }

// SetEpoch restarts the data set at the beginning of epoch.
func (d *Dataset) SetEpoch(epoch int) {
	d.epoch, d.next = epoch, 0
	d.order = d.smp.Epoch(epoch, d.order)
}

// Steps returns the number of batches per epoch: the same on every rank.
func (d *Dataset) Steps() int { return len(d.order) / d.batch }

// Yield returns the next batch of the rank's shard (spec nil), or io.EOF
// at the end of the epoch.
func (d *Dataset) Yield() (spec any, inputs, labels []*tensors.Tensor, err error) {
	if d.next+d.batch > len(d.order) {
		return nil, nil, nil, io.EOF
	}
	idx := d.order[d.next : d.next+d.batch]
	d.next += d.batch
	inputs, err = gather(d.inputs, idx, d.rows)
	if err != nil {
		return nil, nil, nil, err
	}
	labels, err = gather(d.labels, idx, d.rows)
	if err != nil {
		finalizeAll(inputs)
		return nil, nil, nil, err
	}
	return nil, inputs, labels, nil
}

// gather returns new tensors holding the examples idx of each of src.
func gather(src []*tensors.Tensor, idx []int, rows int) ([]*tensors.Tensor, error) {
	out := make([]*tensors.Tensor, len(src))
	for i, x := range src {
		dims := append([]int{len(idx)}, x.Shape().Dimensions[1:]...)
		y := tensors.FromShape(shapes.Make(x.DType(), dims...))
		row := int(x.Shape().Memory()) / rows
		var err error
		merr := y.MutableBytes(func(dst []byte) {
			err = x.ConstBytes(func(data []byte) {
				for j, e := range idx {
					copy(dst[j*row:(j+1)*row], data[e*row:(e+1)*row])
				}
			})
		})
		if err = errors.Join(merr, err); err != nil {
			finalizeAll(out[:i])
			return nil, err
		}
		out[i] = y
	}
	return out, nil
}
