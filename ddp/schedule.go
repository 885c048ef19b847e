package ddp

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ddpgo/ddpgo/internal/invariants"
)

// schedule is the per-step bookkeeping of one rank: which parameters are
// marked, how many parameters each bucket still waits for, which buckets are
// complete and which one may launch next. It has no goroutines and no
// clocks; the Reducer drives it. mark may be called from any goroutine;
// launch is called by a single goroutine (the rank's communication
// goroutine); reset only while no step is running.
//
// Buckets launch strictly in index order: bucket k launches once it is
// complete and buckets 0..k-1 have launched. This keeps every rank's
// sequence of collectives identical whatever order gradients arrive in.
type schedule struct {
	bucketOf []int32        // parameter -> bucket
	counts   []int32        // parameters per bucket
	marked   []atomic.Bool  // per parameter: marked in this step
	pending  []atomic.Int32 // per bucket: parameters not yet marked
	complete []atomic.Bool  // per bucket: pending reached zero
	nmarked  atomic.Int32   // parameters marked in this step
	next     atomic.Int32   // next bucket to launch; written by the launcher only
}

// errMarked is returned by mark for a parameter already marked this step.
var errMarked = errors.New("already marked")

// newSchedule returns a schedule for len(bucketOf) parameters in nb
// buckets; bucketOf[p] is the bucket of parameter p. Every bucket must hold
// at least one parameter.
func newSchedule(bucketOf []int, nb int) *schedule {
	s := &schedule{
		bucketOf: make([]int32, len(bucketOf)),
		counts:   make([]int32, nb),
		marked:   make([]atomic.Bool, len(bucketOf)),
		pending:  make([]atomic.Int32, nb),
		complete: make([]atomic.Bool, nb),
	}
	for p, b := range bucketOf {
		s.bucketOf[p] = int32(b)
		s.counts[b]++
	}
	s.reset()
	return s
}

// reset starts a new step: nothing marked, nothing launched.
func (s *schedule) reset() {
	for p := range s.marked {
		s.marked[p].Store(false)
	}
	for b := range s.pending {
		s.pending[b].Store(s.counts[b])
		s.complete[b].Store(false)
	}
	s.nmarked.Store(0)
	s.next.Store(0)
}

// claim marks parameter p without counting it towards its bucket yet. It
// returns errMarked if p was already claimed this step. Splitting claim and
// arrive lets the caller do its work for p (record a time, copy a gradient)
// after winning the race against a second mark and before the bucket can
// launch.
func (s *schedule) claim(p int) error {
	if !s.marked[p].CompareAndSwap(false, true) {
		return errMarked
	}
	s.nmarked.Add(1)
	return nil
}

// arrive counts claimed parameter p towards its bucket. It returns the
// bucket's index if p was the bucket's last missing parameter (the bucket
// is now complete), or -1.
func (s *schedule) arrive(p int) int {
	b := s.bucketOf[p]
	left := s.pending[b].Add(-1)
	if invariants.Enabled && (left < 0 || !s.marked[p].Load()) {
		panic(fmt.Sprintf("ddp: invariant: parameter %d arrived at bucket %d unclaimed or twice (pending %d)", p, b, left))
	}
	if left == 0 {
		s.complete[b].Store(true)
		return int(b)
	}
	return -1
}

// mark is claim followed by arrive.
func (s *schedule) mark(p int) (int, error) {
	if err := s.claim(p); err != nil {
		return -1, err
	}
	return s.arrive(p), nil
}

// isMarked reports whether p was claimed this step.
func (s *schedule) isMarked(p int) bool { return s.marked[p].Load() }

// launch returns the next bucket that may launch and advances past it, or
// -1 if the next bucket in index order is not complete yet (or every bucket
// has launched).
func (s *schedule) launch() int {
	k := int(s.next.Load())
	if k >= len(s.counts) || !s.complete[k].Load() {
		return -1
	}
	s.next.Store(int32(k + 1))
	return k
}

// ready returns how many buckets may launch now, in index order from the
// next one: each complete, and each below index limit (the launcher's
// window). It does not advance; launch does.
func (s *schedule) ready(limit int) int {
	k := int(s.next.Load())
	n := 0
	for k+n < len(s.counts) && k+n < limit && s.complete[k+n].Load() {
		n++
	}
	return n
}

// launched returns how many buckets have launched this step.
func (s *schedule) launched() int { return int(s.next.Load()) }

// buckets returns the number of buckets.
func (s *schedule) buckets() int { return len(s.counts) }
