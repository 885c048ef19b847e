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
// of these places: the zeroing Begin zeroes the gradients already handed
// out (out[i]: Grad or GradBuffer returned them in this layout), so that
// a slice kept from an earlier window holds zero and a write through it
// is the gradient; Grad and GradBuffer zero one as they first hand it out;
// SetGrad overwrites it, and AddGrad overwrites instead of adding; Ready
// with NoZeroGrad takes the caller's word that it was overwritten; the
// launcher zeroes the still-stale gradients of a complete bucket just
// before launching it (zeroStale). A gradient never handed out has no
// slice that could be written behind the Reducer's back, so only the
// handed-out ones cost Begin a pass: the bytes Grad would have zeroed
// later in the window.
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

// zeroHandedOut zeroes, in a zeroing Begin, the gradients handed out in
// the current layout (with CopyGrads, the Reducer's own copies) and makes
// them fresh.
func (r *Reducer) zeroHandedOut() {
	if !r.zeroing() {
		return
	}
	gen := r.gen.Load()
	for i := range r.out {
		if r.out[i].Load() {
			r.kern.Zero(r.gradBuf(i))
			r.fresh[i].Store(gen)
		}
	}
}

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
