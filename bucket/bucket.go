package bucket

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/invariants"
)

// Tensor describes one gradient to be placed in a bucket: its element count,
// element type and device. Tensors with the same DType and Device may share
// a bucket; tensors that differ in either never do.
type Tensor struct {
	Numel  int
	DType  comm.DType
	Device int
}

// Bytes returns the size of t in bytes (Numel times the element size).
func (t Tensor) Bytes() int { return t.Numel * t.DType.Size() }

// Bucket is one group of tensors reduced together. Its tensors are laid out
// back to back, without padding, in the order of Tensors.
type Bucket struct {
	Tensors []int      // tensor indices in assignment order
	Offsets []int      // byte offset of each tensor in the bucket, dense, same order
	Bytes   int        // total bytes
	Limit   int        // byte limit the bucket was built under
	DType   comm.DType // element type shared by every tensor of the bucket
	Device  int        // device shared by every tensor of the bucket
}

// Errors returned by this package, always wrapped with the offending index
// or value; test for them with errors.Is.
var (
	// ErrTensor reports an invalid tensor: negative Numel, unknown DType, a
	// size that overflows int, or an empty tensor list.
	ErrTensor = errors.New("bucket: invalid tensor")
	// ErrLimit reports an empty limits list or a limit that is not positive.
	ErrLimit = errors.New("bucket: invalid limit")
	// ErrOrder reports an order that is not a permutation of the tensor indices.
	ErrOrder = errors.New("bucket: order is not a permutation")
	// ErrLayout reports a layout that does not describe the local tensors:
	// a malformed encoding, a tensor missing or placed twice, mixed types or
	// devices in one bucket, or offsets and sizes that are not dense.
	ErrLayout = errors.New("bucket: invalid layout")
)

// Assign groups tensors into buckets exactly as PyTorch's
// compute_bucket_assignment_by_size does (see the package documentation for
// the rules and quirks).
//
// limits are byte limits: a (dtype, device) group's first bucket is built
// under limits[0], its second under limits[1], and so on; the last limit
// applies to all later buckets of the group. A bucket closes as soon as its
// size is >= its limit.
//
// order, when not empty, is a permutation of the tensor indices: order[p] is
// the tensor visited p-th (DDP's gradient ready order; PyTorch passes the
// tensors themselves in that order plus their indices); buckets
// are then returned in the order they closed, leftovers last. When order is
// empty, tensors are visited by index and buckets are sorted by their
// smallest tensor index.
func Assign(tensors []Tensor, limits []int, order []int) ([]Bucket, error) {
	if err := checkTensors(tensors); err != nil {
		return nil, err
	}
	if err := checkLimits(limits); err != nil {
		return nil, err
	}
	if len(order) != 0 {
		if err := checkPermutation(order, len(tensors), "order"); err != nil {
			return nil, err
		}
	}
	bs := assign(tensors, limits, order)
	if invariants.Enabled {
		if err := Validate(tensors, bs); err != nil {
			panic(fmt.Sprintf("bucket: Assign produced an invalid layout: %v", err))
		}
	}
	return bs, nil
}

// Rebuild computes the layout DDP switches to after its first iteration:
// tensors visited in readyOrder (the order their gradients became ready),
// with limits [firstCap, cap], buckets in the order they closed. readyOrder
// must list every tensor index exactly once.
func Rebuild(tensors []Tensor, readyOrder []int, firstCap, cap int) ([]Bucket, error) {
	if err := checkTensors(tensors); err != nil {
		return nil, err
	}
	if err := checkPermutation(readyOrder, len(tensors), "readyOrder"); err != nil {
		return nil, err
	}
	return Assign(tensors, []int{firstCap, cap}, readyOrder)
}

func checkTensors(tensors []Tensor) error {
	if len(tensors) == 0 {
		return fmt.Errorf("%w: no tensors", ErrTensor)
	}
	total := 0
	for i, t := range tensors {
		if t.Numel < 0 {
			return fmt.Errorf("%w: tensor %d has negative numel %d", ErrTensor, i, t.Numel)
		}
		size := t.DType.Size()
		if size == 0 {
			return fmt.Errorf("%w: tensor %d has unknown dtype %d", ErrTensor, i, uint8(t.DType))
		}
		if t.Numel > math.MaxInt/size || t.Numel*size > math.MaxInt-total {
			return fmt.Errorf("%w: tensor %d: %d x %s overflows the total byte count", ErrTensor, i, t.Numel, t.DType)
		}
		total += t.Numel * size
	}
	return nil
}

func checkLimits(limits []int) error {
	if len(limits) == 0 {
		return fmt.Errorf("%w: no limits", ErrLimit)
	}
	for i, l := range limits {
		if l <= 0 {
			return fmt.Errorf("%w: limits[%d] = %d, want > 0", ErrLimit, i, l)
		}
	}
	return nil
}

// checkPermutation reports the first problem that keeps order from being a
// permutation of 0..n-1: an index out of range, a duplicate, or a missing
// index.
func checkPermutation(order []int, n int, name string) error {
	seen := make([]int32, n) // position+1 where each index was seen
	for p, t := range order {
		if t < 0 || t >= n {
			return fmt.Errorf("%w: %s[%d] = %d is out of range [0, %d)", ErrOrder, name, p, t, n)
		}
		if seen[t] != 0 {
			return fmt.Errorf("%w: %s lists tensor %d twice (positions %d and %d)", ErrOrder, name, t, seen[t]-1, p)
		}
		seen[t] = int32(p + 1)
	}
	if len(order) != n {
		for t, s := range seen {
			if s == 0 {
				return fmt.Errorf("%w: %s has %d entries for %d tensors; tensor %d is missing", ErrOrder, name, len(order), n, t)
			}
		}
	}
	return nil
}

// group is the open state of one (dtype, device) group: PyTorch's
// BucketAccumulator plus its position in the limits list.
type group struct {
	dtype  comm.DType
	device int
	limit  int // index into limits of the limit currently in force
	size   int // bytes in the open bucket
	open   int // record of the open bucket, -1 when none
}

// record is a bucket under construction.
type record struct {
	first int // first tensor index placed in it (its smallest when order is empty)
	count int
	bytes int
	limit int
	group int
}

// assign runs the assignment on validated input. It works in two passes:
// the first decides which bucket each visited tensor goes to, the second
// lays the buckets out in one backing array, so the number of allocations
// does not grow with the number of tensors or buckets.
func assign(tensors []Tensor, limits []int, order []int) []Bucket {
	n := len(tensors)
	at := func(p int) int {
		if len(order) == 0 {
			return p
		}
		return order[p]
	}

	groups := make([]group, 0, 4)
	recs := make([]record, 0, n) // at most one bucket per tensor
	closed := make([]int, 0, n)  // records in the order they closed
	recOf := make([]int, n)      // record of the tensor visited at each position

	for p := range n {
		t := at(p)
		ten := tensors[t]
		g := -1
		for k := range groups {
			if groups[k].dtype == ten.DType && groups[k].device == ten.Device {
				g = k
				break
			}
		}
		if g < 0 {
			g = len(groups)
			groups = append(groups, group{dtype: ten.DType, device: ten.Device, open: -1})
		}
		gr := &groups[g]
		if gr.open < 0 {
			gr.open = len(recs)
			recs = append(recs, record{first: t, group: g})
		}
		r := &recs[gr.open]
		recOf[p] = gr.open
		r.count++
		r.bytes += ten.Bytes()
		gr.size += ten.Bytes()
		r.limit = limits[gr.limit]
		if gr.size >= r.limit {
			closed = append(closed, gr.open)
			gr.open, gr.size = -1, 0
			if gr.limit+1 < len(limits) {
				gr.limit++
			}
		}
	}
	// PyTorch closes the leftovers while iterating a std::unordered_map;
	// libstdc++ visits its keys in reverse insertion order unless their hash
	// buckets collide (see the package documentation).
	for g := len(groups) - 1; g >= 0; g-- {
		if groups[g].open >= 0 {
			closed = append(closed, groups[g].open)
		}
	}
	if len(order) == 0 {
		slices.SortFunc(closed, func(a, b int) int { return recs[a].first - recs[b].first })
	}

	// Second pass: rank[r] is record r's final position; one backing array
	// each for indices and offsets, carved per bucket.
	rank := make([]int, len(recs))
	bs := make([]Bucket, len(closed))
	idx := make([]int, n)
	off := make([]int, n)
	start := 0
	for k, r := range closed {
		rank[r] = k
		rec := recs[r]
		gr := groups[rec.group]
		bs[k] = Bucket{
			Tensors: idx[start : start : start+rec.count],
			Offsets: off[start : start : start+rec.count],
			Limit:   rec.limit,
			DType:   gr.dtype,
			Device:  gr.device,
		}
		start += rec.count
	}
	for p := range n {
		t := at(p)
		b := &bs[rank[recOf[p]]]
		b.Tensors = append(b.Tensors, t)
		b.Offsets = append(b.Offsets, b.Bytes)
		b.Bytes += tensors[t].Bytes()
	}
	return bs
}
