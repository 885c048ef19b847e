package ddp

import (
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
)

// Writes through a slice kept from an earlier accumulation window
// (ErrStaleGrad). The lazy zeroing (zero.go) treats a gradient with no
// Grad, GradBuffer, SetGrad or AddGrad in the window as stale: whatever
// its memory holds is the last average, which the launcher zeroes before
// the bucket is launched. A caller that fetched Grad(i) once and writes
// into that slice every step would lose every write that way, silently.
//
// So the zeroing Begin plants a canary in the first element of every
// gradient: a signalling NaN, which a store replaces and arithmetic (+=)
// turns into a quiet NaN. Ready of a stale parameter, and Wait before it
// marks one unused, check that the canary is still there; if it is not,
// the caller has written the gradient without fetching it, and the call
// fails naming the parameter instead of zeroing the write. Grad (which
// zeroes), SetGrad and AddGrad (which overwrite) remove the canary as
// they make the gradient fresh. When Begin adopts a rebuilt layout, the
// old layout's memory keeps canaries too, and stays out of the pool until
// that step ends, so a slice kept across the change is caught the same
// way. The cost is one store per parameter in Begin and one load in
// Ready of a stale parameter. Device memory, which Go cannot address, and
// NoZeroGrad, under which nothing is zeroed, have no canaries.

// Canaries by dtype: signalling NaNs.
const (
	canary32   uint32 = 0x7fa5a5a5
	canary64   uint64 = 0x7ff4a5a5a5a5a5a5
	canary16   uint16 = 0x7d5a
	canaryBF16 uint16 = 0x7fa5
)

// canaries reports whether the Reducer plants canaries.
func (r *Reducer) canaries() bool { return r.host && !r.o.NoZeroGrad }

func setCanary(b comm.Buffer) {
	if b.Count == 0 {
		return
	}
	switch b.DType {
	case comm.Float32:
		*(*uint32)(b.Addr) = canary32
	case comm.Float64:
		*(*uint64)(b.Addr) = canary64
	case comm.Float16:
		*(*uint16)(b.Addr) = canary16
	case comm.BFloat16:
		*(*uint16)(b.Addr) = canaryBF16
	}
}

// hasCanary reports whether b's first element is still its canary.
func hasCanary(b comm.Buffer) bool {
	if b.Count == 0 {
		return true
	}
	switch b.DType {
	case comm.Float32:
		return *(*uint32)(b.Addr) == canary32
	case comm.Float64:
		return *(*uint64)(b.Addr) == canary64
	case comm.Float16:
		return *(*uint16)(b.Addr) == canary16
	case comm.BFloat16:
		return *(*uint16)(b.Addr) == canaryBF16
	}
	return true
}

// plantCanaries marks every gradient's memory as the zeroing Begin leaves
// it.
func (r *Reducer) plantCanaries() {
	if !r.canaries() {
		return
	}
	if r.copies != nil {
		for _, b := range r.copies {
			setCanary(b)
		}
		return
	}
	for _, b := range r.lay.Load().bufs {
		setCanary(b)
	}
}

// retire keeps the layout Begin has just replaced out of the pool until
// the step ends, with canaries in its gradients.
func (r *Reducer) retire(old *layout) error {
	if err := r.dropRetired(); err != nil {
		return err
	}
	if !r.canaries() || r.copies != nil {
		// CopyGrads' slices are the Reducer's own Go memory: they do
		// not move with the layout.
		return old.free(r.pool)
	}
	for _, b := range old.bufs {
		setCanary(b)
	}
	r.retired = old
	return nil
}

// dropRetired returns the retired layout's memory to the pool.
func (r *Reducer) dropRetired() error {
	if r.retired == nil {
		return nil
	}
	old := r.retired
	r.retired = nil
	return old.free(r.pool)
}

// heldWrite fails if stale parameter i was written through a slice kept
// from an earlier window or layout; op names the call.
func (r *Reducer) heldWrite(op string, i int) error {
	if !r.canaries() || !r.isStale(i) {
		return nil
	}
	p := r.params[i].Name
	if r.retired != nil && !hasCanary(r.retired.bufs[i]) {
		return fmt.Errorf("%w: rank %d step %d: %s: parameter %d (%q) was written through a slice of the bucket layout that this step's Begin replaced (Generation is now %d), "+
			"memory that no longer holds its gradient: call Grad(%d) in every window before writing, and fetch gradients again whenever Generation changes (package documentation, \"Views and the rebuild\")",
			ErrStaleGrad, r.c.Rank(), r.stepNo, op, i, p, r.layGen, i)
	}
	if !hasCanary(r.gradBuf(i)) {
		return fmt.Errorf("%w: rank %d step %d: %s: parameter %d (%q) was written through a slice kept from an earlier accumulation window, with no Grad(%d) since Begin; "+
			"the Reducer zeroes such a gradient before reducing it (a lazy zero_grad), so the write would be lost: call Grad(%d) in every window before writing, "+
			"or use SetGrad or AddGrad (package documentation, \"Zeroing\")",
			ErrStaleGrad, r.c.Rank(), r.stepNo, op, i, p, i, i)
	}
	return nil
}
