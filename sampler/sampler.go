// Package sampler shards a data set across the ranks of a data-parallel
// job, as PyTorch's DistributedSampler does: every epoch, every rank
// computes the same order of the data set's indices (a shuffle seeded by
// the seed and the epoch, or the identity), makes its length a multiple of
// the number of ranks, and takes every ranks-th index from its own rank
// on. The ranks' shards are disjoint, of equal length, and together cover
// the data set (padded) or all of it but fewer than ranks indices
// (dropped), with no communication.
//
// Because the shards are strided, the ranks' batches of one step come from
// one contiguous stretch of the epoch's order: batch b of every rank, with
// batch size B per rank, together hold exactly positions [b·B·ranks,
// (b+1)·B·ranks) of the order, the global batch b that one process would
// take with batch size B·ranks. So N ranks follow one process's
// trajectory, as the digits example checks.
package sampler

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// Options configures a Sampler. The zero value takes the indices in order
// and pads.
type Options struct {
	// Shuffle permutes the indices every epoch, the same way on every
	// rank: the permutation depends only on Seed and the epoch.
	Shuffle bool
	Seed    uint64
	// DropLast drops the end of the order so that its length is a
	// multiple of the ranks: each rank gets n/ranks indices, rounded down.
	// Without it, the order is padded with its own first indices, so each
	// rank gets n/ranks rounded up, and a few examples are seen twice per
	// epoch.
	DropLast bool
}

// ErrArgs: a Sampler was asked for with a negative size, no ranks, or a
// rank outside them.
var ErrArgs = errors.New("sampler: invalid arguments")

// Sampler gives one rank its shard of each epoch. It is not safe for
// concurrent use (each rank has its own).
type Sampler struct {
	n, ranks, rank int
	o              Options
	order          []int // scratch: the epoch's order of all n indices
}

// New returns rank's sampler of a data set of n examples shared by ranks
// ranks.
func New(n, ranks, rank int, o Options) (*Sampler, error) {
	if n < 0 || ranks < 1 || rank < 0 || rank >= ranks {
		return nil, fmt.Errorf("%w: %d examples, rank %d of %d: want n >= 0 and 0 <= rank < ranks", ErrArgs, n, rank, ranks)
	}
	return &Sampler{n: n, ranks: ranks, rank: rank, o: o}, nil
}

// Len returns how many indices the rank gets per epoch: n/ranks rounded
// down with DropLast, up without (0 for an empty data set).
func (s *Sampler) Len() int {
	if s.o.DropLast || s.n == 0 {
		return s.n / s.ranks
	}
	return (s.n + s.ranks - 1) / s.ranks
}

// Epoch returns the rank's indices for epoch, in the order to visit them,
// appended to dst[:0] (pass the last result to reuse its memory).
func (s *Sampler) Epoch(epoch int, dst []int) []int {
	dst = dst[:0]
	m := s.Len()
	if m == 0 {
		return dst
	}
	if cap(s.order) < s.n {
		s.order = make([]int, s.n)
	}
	order := s.order[:s.n]
	for i := range order {
		order[i] = i
	}
	if s.o.Shuffle {
		rng := rand.New(rand.NewPCG(s.o.Seed, uint64(epoch)))
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	// Position p of the padded (or cut) order of m·ranks indices is
	// order[p mod n]: padding repeats the order from its start.
	for k := range m {
		dst = append(dst, order[(k*s.ranks+s.rank)%s.n])
	}
	return dst
}
