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
	// With Options.Shard: which buckets Gather has published, and the
	// next whose all-gather may launch (the launcher's). nil otherwise.
	published []atomic.Bool
	gnext     atomic.Int32
}

// errMarked is returned by mark for a parameter already marked this step,
// and by publish for a bucket already published.
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
	for b := range s.published {
		s.published[b].Store(false)
	}
	s.gnext.Store(0)
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

// shard makes the schedule track the gathers of Options.Shard.
func (s *schedule) shard() {
	s.published = make([]atomic.Bool, len(s.counts))
}

// publish records that bucket b's gather may launch. It returns errMarked
// if b was published already this step.
func (s *schedule) publish(b int) error {
	if !s.published[b].CompareAndSwap(false, true) {
		return errMarked
	}
	return nil
}

// isPublished reports whether bucket b was published this step (false
// without Options.Shard).
func (s *schedule) isPublished(b int) bool {
	return s.published != nil && s.published[b].Load()
}

// gatherReady returns how many gathers may launch now, in index order
// from the next one: each published, and every bucket launched for its
// reduction, so that the gathers follow the step's last reduction on the
// wire of every rank, whenever each rank's optimizer publishes them.
func (s *schedule) gatherReady() int {
	if s.published == nil || int(s.next.Load()) < len(s.counts) {
		return 0
	}
	k := int(s.gnext.Load())
	n := 0
	for k+n < len(s.published) && s.published[k+n].Load() {
		n++
	}
	return n
}

// launchGather returns the next gather that may launch and advances past
// it, or -1.
func (s *schedule) launchGather() int {
	if s.gatherReady() == 0 {
		return -1
	}
	k := s.gnext.Load()
	s.gnext.Store(k + 1)
	return int(k)
}

// gathersLaunched returns how many gathers have launched this step.
func (s *schedule) gathersLaunched() int { return int(s.gnext.Load()) }

// buckets returns the number of buckets.
func (s *schedule) buckets() int { return len(s.counts) }

// The kinds of a step's collectives.
const (
	kindBucket  uint8 = iota // a bucket (k: its index)
	kindBuffers              // a group of buffers (k: the group)
	kindJoin                 // the join flag
	kindGather               // a bucket's all-gather (k: its index; Options.Shard)
)

// sequence is the order of a synced step's collectives and who reads the
// join flag, decided when the step opens from what it holds, so that the
// launcher and the finisher follow it without branching on what each
// collective is. Every rank issues the same order: the join flag first (an
// active rank's, with Options.Join: issued by Begin, before anything can
// complete a bucket), then the buffers' broadcasts (one per dtype group,
// just before bucket 0, from the root the flag decides), then the buckets
// in index order. A joined rank's shadow step has no flag of its own in
// the sequence: Join exchanged it already.
//
// The flag is read exactly once, before any bucket is finished: by the
// launcher before the step's first launch when there are buffers (their
// root is the lowest active rank); otherwise by the finisher, together with
// the item after it (bucket 0, or the first buffers), whose completion
// implies the flag's, so that reading it costs no wake-up of its own; or,
// with JoinThrow, as soon as it completes, since it may fail the step.
type sequence struct {
	flag    bool // the step opens with this rank's join flag
	early   bool // the finisher reads the flag as soon as it completes (JoinThrow)
	buffers int  // buffer groups broadcast before bucket 0
}

// newSequence returns the sequence of a step: join says Options.Join is
// on, throw that it is JoinThrow, shadow that the step is a joined rank's.
func newSequence(join, throw, shadow bool, buffers int) sequence {
	return sequence{flag: join && !shadow, early: throw, buffers: buffers}
}

// launcherReadsFlag reports whether the launcher reads the flag before the
// step's first launch.
func (q sequence) launcherReadsFlag() bool { return q.flag && q.buffers > 0 }

// What the finisher does with a collective as it takes it from the fifo.
const (
	arriveWait uint8 = iota // wait for it (and read a held flag), then finish it
	arriveSkip              // nothing: the launcher reads the flag
	arriveHold              // hold the flag, to read it with the next collective
)

// arrival says what the finisher does with a collective of kind.
func (q sequence) arrival(kind uint8) uint8 {
	switch {
	case kind != kindJoin:
		return arriveWait
	case q.launcherReadsFlag():
		return arriveSkip
	case !q.early:
		return arriveHold
	}
	return arriveWait
}

// prefix returns what precedes bucket 0 on the wire, in order, for the
// launcher to launch (the flag, issued by Begin, is not in it): the buffer
// groups.
func (q sequence) prefix() int { return q.buffers }

// items returns the step's collectives in issue order, for a step of n
// buckets.
func (q sequence) items(n int) []inflight {
	var out []inflight
	if q.flag {
		out = append(out, inflight{kind: kindJoin})
	}
	for g := range q.buffers {
		out = append(out, inflight{k: g, kind: kindBuffers})
	}
	for k := range n {
		out = append(out, inflight{k: k, kind: kindBucket})
	}
	return out
}
