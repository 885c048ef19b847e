package ddp

import (
	"time"
)

// Lazy zeroing: what callers see is in the package documentation,
// "Zeroing"; this is how.
//
// gen is the zeroing generation: every Begin after a synced step (and
// every shadow step of Join) increments it, which makes every gradient
// stale at once, in O(1). fresh[i] == gen says parameter i's gradient
// holds this accumulation window's value; otherwise it still holds the
// last synced step's average and reads, logically, as zero (as the last
// average with NoZeroGrad). A stale gradient is made fresh in exactly one
// of these places: Grad and GradBuffer zero it as they hand it out;
// SetGrad overwrites it, and AddGrad overwrites instead of adding; Ready
// with NoZeroGrad takes the caller's word that it was overwritten; the
// launcher zeroes the still-stale gradients of a complete bucket just
// before launching it (zeroStale).
//
// The words are atomic because the launcher reads and writes them; each
// parameter's word is touched by one goroutine at a time (its owner until
// Ready, the launcher after). A synced step leaves every parameter fresh,
// so only gen and gen-1 ever meet: the counter may wrap.

// zeroing reports whether Grad zeroes stale gradients (not NoZeroGrad).
func (r *Reducer) zeroing() bool { return !r.o.NoZeroGrad }

// isStale reports whether parameter i's gradient still holds the last
// synced step's average.
func (r *Reducer) isStale(i int) bool { return r.fresh[i].Load() != r.gen.Load() }

// zeroStale zeroes the bucket slots of bucket k's parameters that are
// still stale, with the pool's kernels, and records the time it took. It
// runs on the launcher after every Ready of the bucket (the bucket's
// pending count orders them).
func (r *Reducer) zeroStale(L *layout, k int, s *BucketStats) {
	gen := r.gen.Load()
	var t0 time.Time
	for _, p := range L.buckets[k].Tensors {
		if r.fresh[p].Load() == gen {
			continue
		}
		if t0.IsZero() {
			t0 = time.Now()
		}
		r.kern.Zero(L.bufs[p])
		r.fresh[p].Store(gen) // with CopyGrads, the copy back after the hook follows
	}
	if !t0.IsZero() {
		s.Zero = time.Since(t0)
	}
}
