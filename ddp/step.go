package ddp

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// SyncMode says whether a step's gradients are averaged across ranks.
type SyncMode uint8

const (
	// Sync starts a synced step: the gradients are averaged across ranks
	// once marked ready, and Wait must be called before the next Begin.
	Sync SyncMode = iota
	// NoSync starts a no-sync step (PyTorch's no_sync): nothing is
	// communicated, gradients accumulate locally, and the next synced step
	// reduces the accumulated sum; Wait is optional.
	NoSync
)

func (m SyncMode) String() string {
	switch m {
	case Sync:
		return "Sync"
	case NoSync:
		return "NoSync"
	}
	return fmt.Sprintf("SyncMode(%d)", uint8(m))
}

// Begin starts a step: Begin(Sync) a synced one, Begin(NoSync) a no-sync
// one (see SyncMode).
//
// After Begin every gradient reads as zero, unless the previous step was a
// no-sync step (which the synced step then accumulates onto) or
// Options.NoZeroGrad is set: see the package documentation, "Zeroing".
// Begin also adopts a rebuilt bucket layout if one is pending, and
// Generation then changes.
func (r *Reducer) Begin(mode SyncMode) error {
	if err := r.usable(); err != nil {
		return err
	}
	if r.inCall.Load() != callNone {
		return r.concurrent(callBegin)
	}
	if mode != Sync && mode != NoSync {
		return fmt.Errorf("%w: rank %d: Begin(%v): want Sync or NoSync", ErrOptions, r.c.Rank(), mode)
	}
	switch r.state.Load() {
	case syncing:
		return fmt.Errorf("%w: rank %d: Begin(%v) while synced step %d is running: call %s first", ErrStepInProgress, r.c.Rank(), mode, r.stepNo, r.stepEnd())
	case local:
		r.finish()
	}
	return r.open(mode == Sync, false)
}

// open starts a step. A shadow step is a joined rank's (join.go): its
// gradients are zeroed whatever the last step was, and its join flag has
// been exchanged already.
func (r *Reducer) open(sync, shadow bool) error {
	if r.next != nil {
		bs := r.next
		r.next = nil
		if err := r.adopt(bs); err != nil {
			return r.fail(fmt.Errorf("ddp: rank %d: adopting the rebuilt layout at step %d: %w", r.c.Rank(), r.stepNo+1, err))
		}
	}
	L := r.lay.Load()
	if r.prevSync || shadow {
		// zero_grad: every gradient becomes stale in O(1), and those
		// handed out as slices are zeroed now (zero.go).
		r.gen.Add(1)
		r.zeroHandedOut()
	}
	r.stepNo++
	L.sched.reset()
	L.issued.Store(0)
	r.nready.Store(0)
	r.reduced.Store(0)
	r.gathered.Store(0)
	clear(r.isUnused)
	s := r.cur
	s.reset(r.stepNo, sync, len(r.params))
	s.Buckets = s.Buckets[:len(L.buckets)]
	for k := range s.Buckets {
		b := &L.buckets[k]
		s.Buckets[k] = BucketStats{Index: k, Params: len(b.Tensors), Bytes: int64(b.Bytes), DType: b.DType, Wire: r.hook.Wire(b.DType)}
	}
	s.Joined = shadow
	r.seq = newSequence(r.o.Join != JoinOff, r.o.Join == JoinThrow, shadow, len(r.bufs.wire))
	r.start = time.Now()
	s.Start = r.start
	r.prevSync = sync
	if !sync {
		r.state.Store(local)
		return nil
	}
	if r.o.Join != JoinOff && !shadow {
		// Before anything can complete a bucket: the flag precedes the
		// step's buffers and buckets in every rank's sequence.
		r.sendFlag(false)
	}
	r.state.Store(syncing)
	if r.staticOK && !shadow {
		for i, u := range r.static {
			if u {
				r.markUnused(L, i)
			}
		}
	}
	return nil
}

// Grad returns parameter i's gradient, a float32 parameter's: by default a
// view of its slot in the bucket memory (with CopyGrads, a Go slice of its
// own). Write or add the gradient into it, then call Ready(i). After a
// synced step's Wait it holds the average over ranks.
//
// The slice stays valid, and Grad returns the same slice, as long as
// Generation does not change (package documentation, "Views and the
// rebuild"). A kept slice may be written in a later window without
// calling Grad again: Begin zeroes the gradients it has handed out
// (package documentation, "Zeroing").
//
// Grad fails with ErrIndex for an index out of range (as Ready does), with
// ErrDType for a parameter that is not float32 (use GradBuffer), with
// ErrOptions for a pool of device memory, which Go cannot address (use
// GradBuffer), with ErrBusy while the parameter's bucket is being reduced
// (between its Ready in a synced step and the end of its bucket's
// reduction, as Wait or WaitEach report it), and with ErrClosed after
// Close. Grad(i) may run concurrently with Grad and Ready of other
// parameters.
//
// After Close, a slice Grad returned no longer holds a gradient. With the
// Reducer's own pool of host memory (no Options.Pool, and a backend
// without memory of its own, as inproc), its memory is retired, not
// unmapped: the slice reads zeros and writes go nowhere, so a late use is
// harmless (allocator.Options.Retire). With Options.Pool the memory goes
// back to that pool and may be handed to someone else, and with the mpi
// backend's shared memory it is unmapped, so that a late use faults (a
// SIGSEGV that recover cannot catch): do not use a gradient slice after
// Close.
func (r *Reducer) Grad(i int) ([]float32, error) {
	if err := r.gradOK("Grad", i); err != nil {
		return nil, err
	}
	if !r.host {
		return nil, fmt.Errorf("%w: rank %d: Grad(%d): the pool holds device memory, which Go cannot address; use GradBuffer", ErrOptions, r.c.Rank(), i)
	}
	if dt := r.params[i].DType; dt != comm.Float32 {
		return nil, fmt.Errorf("%w: rank %d: Grad(%d): parameter %q is %s, not float32; use GradBuffer", ErrDType, r.c.Rank(), i, r.params[i].Name, dt)
	}
	g := r.grad(i)
	if r.zeroing() && r.isStale(i) {
		clear(g)
		r.fresh[i].Store(r.gen.Load())
	}
	r.out[i].Store(true)
	return g, nil
}

// GradBuffer is Grad for parameters of any dtype and memory of any kind:
// it returns parameter i's gradient as a comm.Buffer (device memory for a
// device pool; on the host, Buffer.AsFloat64 and the like give typed Go
// views), zeroed on first use in an accumulation window as Grad's is.
// Write it (with the kernels of its memory, on a device), then call
// Ready(i). It stays valid as Grad's slice does, and fails as Grad does
// for a bad index, a busy parameter or a closed Reducer.
func (r *Reducer) GradBuffer(i int) (comm.Buffer, error) {
	if err := r.gradOK("GradBuffer", i); err != nil {
		return comm.Buffer{}, err
	}
	b := r.gradBuf(i)
	if r.zeroing() && r.isStale(i) {
		r.kern.Zero(b)
		r.fresh[i].Store(r.gen.Load())
	}
	r.out[i].Store(true)
	return b, nil
}

// gradOK checks that parameter i's gradient may be handed out by op.
func (r *Reducer) gradOK(op string, i int) error {
	if i < 0 || i >= len(r.params) {
		return fmt.Errorf("%w: rank %d: %s(%d): the reducer has %d parameters", ErrIndex, r.c.Rank(), op, i, len(r.params))
	}
	if r.closed.Load() {
		return ErrClosed
	}
	if r.state.Load() == syncing {
		L := r.lay.Load()
		if L.sched.isMarked(i) && L.bucketOf[i] >= int(r.reduced.Load()) {
			return fmt.Errorf("%w: rank %d step %d: %s(%d): parameter %q is marked ready and its bucket %d is being reduced; "+
				"read it once Wait returns (or once WaitEach reports bucket %d)", ErrBusy, r.c.Rank(), r.stepNo, op, i, r.params[i].Name, L.bucketOf[i], L.bucketOf[i])
		}
		if L.sched.isPublished(L.bucketOf[i]) {
			return fmt.Errorf("%w: rank %d step %d: %s(%d): parameter %q is in bucket %d, which Gather has published: its memory carries the parameters until WaitGather returns",
				ErrBusy, r.c.Rank(), r.stepNo, op, i, r.params[i].Name, L.bucketOf[i])
		}
	}
	return nil
}

// grad returns parameter i's gradient memory as it is, stale or not (host
// pools only).
func (r *Reducer) grad(i int) []float32 {
	if r.copies != nil {
		return r.copies[i].AsFloat32()
	}
	return r.lay.Load().views[i]
}

// gradBuf is grad for memory of any kind.
func (r *Reducer) gradBuf(i int) comm.Buffer {
	if r.copies != nil {
		return r.copies[i]
	}
	return r.lay.Load().bufs[i]
}

// Ready marks parameter i's gradient as complete for this step. It may be
// called from any goroutine, in any order, and never waits for the
// network: when i completes a bucket and every earlier bucket has launched,
// the bucket's reduction starts on the rank's launcher goroutine.
// Marking a parameter twice in a step, an index out of range, or Ready
// outside a step are errors naming the parameter, and so is a gradient
// written through a slice of the layout that this step's Begin replaced
// (ErrStaleGrad; the parameter stays unmarked). Every Ready of a step
// must return before Wait is called.
func (r *Reducer) Ready(i int) error {
	if i < 0 || i >= len(r.params) {
		return fmt.Errorf("%w: rank %d: Ready(%d): the reducer has %d parameters", ErrIndex, r.c.Rank(), i, len(r.params))
	}
	if err := r.usable(); err != nil {
		return err
	}
	st := r.state.Load()
	if st == idle {
		return fmt.Errorf("%w: rank %d: Ready of parameter %d (%q) outside a step: call Begin first", ErrNoStep, r.c.Rank(), i, r.params[i].Name)
	}
	if err := r.heldWrite("Ready", i); err != nil {
		return err
	}
	L := r.lay.Load()
	if err := L.sched.claim(i); err != nil {
		return r.markedErr("Ready", i)
	}
	if r.o.NoZeroGrad {
		// The caller vouches for the gradient as it stands (it
		// overwrote the last average): nothing will zero it.
		r.fresh[i].Store(r.gen.Load())
	}
	r.arrive(L, i, st == syncing)
	return nil
}

// SetGrad copies g into parameter i's gradient (replacing it) and marks it
// ready. It works for device pools too (the copy is an upload). Like
// AddGrad, it takes float32 parameters; write others through GradBuffer.
func (r *Reducer) SetGrad(i int, g []float32) error {
	if err := r.gradFor("SetGrad", i, g); err != nil {
		return err
	}
	if r.host {
		copy(r.grad(i), g)
	} else {
		r.kern.Upload(r.gradBuf(i), unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(g))), 4*len(g)))
	}
	r.fresh[i].Store(r.gen.Load())
	return r.Ready(i)
}

// AddGrad adds g into parameter i's gradient and marks it ready. A
// gradient not yet written in this accumulation window is overwritten
// instead ("Zeroing"), so AddGrad accumulates correctly in every step of
// a window and never pays for zeroing. It needs a host pool.
func (r *Reducer) AddGrad(i int, g []float32) error {
	if err := r.gradFor("AddGrad", i, g); err != nil {
		return err
	}
	if !r.host {
		return fmt.Errorf("%w: rank %d: AddGrad of parameter %d (%q): the pool holds device memory; add into GradBuffer with the device's kernels", ErrOptions, r.c.Rank(), i, r.params[i].Name)
	}
	dst := r.grad(i)
	if gen := r.gen.Load(); r.fresh[i].Load() != gen {
		copy(dst, g)
		r.fresh[i].Store(gen)
	} else {
		for j, v := range g {
			dst[j] += v
		}
	}
	return r.Ready(i)
}

// gradFor checks a SetGrad or AddGrad of g into parameter i.
func (r *Reducer) gradFor(op string, i int, g []float32) error {
	if i < 0 || i >= len(r.params) {
		return fmt.Errorf("%w: rank %d: %s(%d): the reducer has %d parameters", ErrIndex, r.c.Rank(), op, i, len(r.params))
	}
	if err := r.usable(); err != nil {
		return err
	}
	if r.state.Load() == idle {
		return fmt.Errorf("%w: rank %d: %s of parameter %d (%q) outside a step: call Begin first", ErrNoStep, r.c.Rank(), op, i, r.params[i].Name)
	}
	if dt := r.params[i].DType; dt != comm.Float32 {
		return fmt.Errorf("%w: rank %d: %s of parameter %d (%q): it is %s, not float32; write it through GradBuffer and call Ready", ErrDType, r.c.Rank(), op, i, r.params[i].Name, dt)
	}
	if n := r.tensors[i].Numel; len(g) != n {
		return fmt.Errorf("%w: rank %d: %s: parameter %d (%q, shape %v) has %d elements, got %d", ErrGradSize, r.c.Rank(), op, i, r.params[i].Name, r.params[i].Shape, n, len(g))
	}
	if r.lay.Load().sched.isMarked(i) {
		return r.markedErr(op, i)
	}
	return nil
}

// markedErr explains why parameter i, already marked in this step, cannot
// be marked by op.
func (r *Reducer) markedErr(op string, i int) error {
	if r.static[i] && r.staticOK && r.state.Load() == syncing {
		return fmt.Errorf("%w: %s: rank %d step %d: parameter %d (%q) got no gradient in the first synced step, so the Reducer marks it; "+
			"drop StaticGraph or keep the set of unused parameters fixed", ErrStaticGraph, op, r.c.Rank(), r.stepNo, i, r.params[i].Name)
	}
	return fmt.Errorf("%w: %s: rank %d step %d: parameter %d (%q) is already marked ready", ErrMarkedTwice, op, r.c.Rank(), r.stepNo, i, r.params[i].Name)
}

// arrive records claimed parameter i and counts it towards its bucket.
func (r *Reducer) arrive(L *layout, i int, sync bool) {
	r.cur.ParamReady[i] = time.Since(r.start)
	r.order[r.nready.Add(1)-1].Store(int32(i))
	if !sync {
		return
	}
	if r.copies != nil && !r.isStale(i) {
		// A stale gradient is not copied: the launcher zeroes its bucket
		// slot instead.
		r.kern.Copy(L.bufs[i], r.copies[i])
	}
	if L.sched.arrive(i) >= 0 {
		select {
		case r.poke <- struct{}{}:
		default:
		}
	}
}

// markUnused marks parameter i ready on its owner's behalf.
func (r *Reducer) markUnused(L *layout, i int) {
	if L.sched.claim(i) != nil {
		return
	}
	// A stale gradient (the caller wrote nothing in this window) is
	// zeroed by the launcher before the bucket is launched.
	r.isUnused[i] = true
	r.cur.Unused = append(r.cur.Unused, i)
	r.arrive(L, i, true)
}
