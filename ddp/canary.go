package ddp

import (
	"fmt"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// Writes through a slice of a replaced layout (ErrStaleGrad). Within one
// layout no write through a slice the Reducer handed out is lost: Begin
// zeroes that memory instead of leaving it to the lazy zeroing (zero.go).
// When Begin adopts a rebuilt layout (Generation changes), every
// parameter moves to new memory, and a slice kept from the old layout
// points to memory that no longer holds a gradient. So that a write
// through it is not lost silently, Begin fills every element of the old
// layout's handed-out gradients with a canary, a signalling NaN that a
// store replaces and arithmetic turns quiet, and keeps that memory out of
// the pool until the step ends. Ready of such a parameter, and Wait
// before it marks one unused, check every element of its old slot and
// fail naming the parameter if one changed (adopt, layout.go, refuses a
// rebuild that cannot keep the old layout). The fill and the checks cost
// one pass over the old layout's handed-out memory, once per layout
// change. Device memory, which Go cannot address, and CopyGrads' slices,
// which are the Reducer's own and do not move with the layout, have no
// canaries.

// Canaries by dtype: signalling NaNs.
const (
	canary32   uint32 = 0x7fa5a5a5
	canary64   uint64 = 0x7ff4a5a5a5a5a5a5
	canary16   uint16 = 0x7d5a
	canaryBF16 uint16 = 0x7fa5
)

// fillCanary sets every element of b to its dtype's canary.
func fillCanary(b comm.Buffer) {
	if b.Count == 0 {
		return
	}
	switch b.DType {
	case comm.Float32:
		fill(unsafe.Slice((*uint32)(b.Addr), b.Count), canary32)
	case comm.Float64:
		fill(unsafe.Slice((*uint64)(b.Addr), b.Count), canary64)
	case comm.Float16:
		fill(unsafe.Slice((*uint16)(b.Addr), b.Count), canary16)
	case comm.BFloat16:
		fill(unsafe.Slice((*uint16)(b.Addr), b.Count), canaryBF16)
	}
}

// allCanary reports whether every element of b is still its canary.
func allCanary(b comm.Buffer) bool {
	if b.Count == 0 {
		return true
	}
	switch b.DType {
	case comm.Float32:
		return all(unsafe.Slice((*uint32)(b.Addr), b.Count), canary32)
	case comm.Float64:
		return all(unsafe.Slice((*uint64)(b.Addr), b.Count), canary64)
	case comm.Float16:
		return all(unsafe.Slice((*uint16)(b.Addr), b.Count), canary16)
	case comm.BFloat16:
		return all(unsafe.Slice((*uint16)(b.Addr), b.Count), canaryBF16)
	}
	return true
}

func fill[T uint16 | uint32 | uint64](s []T, v T) {
	for j := range s {
		s[j] = v
	}
}

func all[T uint16 | uint32 | uint64](s []T, v T) bool {
	for _, x := range s {
		if x != v {
			return false
		}
	}
	return true
}

// retire keeps the layout Begin has just replaced out of the pool until
// the step ends, with canaries in the gradients it had handed out, and
// starts the new layout with none handed out.
func (r *Reducer) retire(old *layout) error {
	if err := r.dropRetired(); err != nil {
		return err
	}
	if r.copies != nil {
		// CopyGrads' slices are the Reducer's own Go memory: they do
		// not move with the layout, and stay handed out.
		return old.free(r.pool)
	}
	if r.held == nil {
		r.held = make([]bool, len(r.params))
	}
	kept := false
	for i := range r.out {
		r.held[i] = r.out[i].Swap(false) && r.host
		kept = kept || r.held[i]
	}
	if !kept {
		return old.free(r.pool)
	}
	for i, b := range old.bufs {
		if r.held[i] {
			fillCanary(b)
		}
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

// heldWrite fails if parameter i was written through a slice of the
// layout that this step's Begin replaced; op names the call. The slot
// gets its canaries back, so that the parameter can be written again
// and marked.
func (r *Reducer) heldWrite(op string, i int) error {
	if r.retired == nil || !r.held[i] {
		return nil
	}
	b := r.retired.bufs[i]
	if allCanary(b) {
		return nil
	}
	fillCanary(b)
	return fmt.Errorf("%w: rank %d step %d: %s: parameter %d (%q) was written through a slice of the bucket layout that this step's Begin replaced (Generation is now %d), "+
		"memory that no longer holds its gradient: fetch gradients again whenever Generation changes, Grad(%d) here (package documentation, \"Views and the rebuild\")",
		ErrStaleGrad, r.c.Rank(), r.stepNo, op, i, r.params[i].Name, r.layGen, i)
}
