package ddp

import "errors"

// Errors returned by the Reducer, always wrapped with the step, the
// parameter (index and name) or the rank that explain them; test for them
// with errors.Is. Errors of the communicator (comm.ErrAborted,
// comm.ErrTimeout, ...) are wrapped as they come.
var (
	// ErrNoStep: Ready, SetGrad, AddGrad or Wait was called while no step
	// is running (before Begin, or after Wait returned).
	ErrNoStep = errors.New("ddp: no step in progress")
	// ErrStepInProgress: Begin or BroadcastParameters was called while a
	// synced step is running (Wait has not returned nil).
	ErrStepInProgress = errors.New("ddp: step in progress")
	// ErrMarkedTwice: a parameter was marked ready twice in one step.
	ErrMarkedTwice = errors.New("ddp: parameter marked ready twice")
	// ErrIndex: a parameter index is out of range.
	ErrIndex = errors.New("ddp: parameter index out of range")
	// ErrUnready: Wait found parameters that were never marked ready while
	// FindUnusedParameters is off.
	ErrUnready = errors.New("ddp: parameters not marked ready")
	// ErrStaticGraph: with StaticGraph, a parameter that got no gradient in
	// the first synced step was marked ready later.
	ErrStaticGraph = errors.New("ddp: static graph changed")
	// ErrParamMismatch: the ranks were built with different parameters, or
	// with options that would make them issue different collectives (hook,
	// bucket caps, KeepLayout), or another rank could not build its
	// Reducer at all (its own error says why). A Hook value given to
	// several ranks is reported as hooks.ErrShared on every rank instead.
	ErrParamMismatch = errors.New("ddp: parameters differ between ranks")
	// ErrGradSize: a gradient or value slice has the wrong length.
	ErrGradSize = errors.New("ddp: wrong gradient size")
	// ErrUnsupported: a parameter New cannot reduce: a dtype that is not
	// floating-point, one the hook refuses (hooks.FP16 and hooks.BF16
	// refuse float64), one whose reduction needs a kernel that the
	// pool's kernels do not do for it (comm.Supports: a device's kernels
	// scale float32 only), or a shape whose size overflows.
	ErrUnsupported = errors.New("ddp: unsupported parameter")
	// ErrOptions: an Options field is out of range (a negative bucket
	// cap) or does not fit the memory or the communicator (a device pool
	// without kernels, CopyGrads with device memory).
	ErrOptions = errors.New("ddp: invalid options")
	// ErrInFlight: memory the Reducer was releasing is still in use by a
	// collective that did not complete after the group was aborted; it
	// stays out of the pool until the collective completes (see
	// Options.DrainTimeout).
	ErrInFlight = errors.New("ddp: memory still in use by a collective")
	// ErrBusy: a gradient was asked for while its bucket is being reduced
	// (after its Ready in a synced step, before Wait or WaitEach reports
	// the bucket reduced).
	ErrBusy = errors.New("ddp: gradient is being reduced")
	// ErrDType: a gradient or value was given or asked for as a type it
	// does not have (Grad, SetGrad or AddGrad of a parameter that is not
	// float32; a value of the wrong dtype for Broadcast).
	ErrDType = errors.New("ddp: wrong gradient dtype")
	// ErrStaleGrad: a gradient was written through a slice (or Buffer)
	// of the bucket layout that this step's Begin replaced (Generation
	// changed), memory that no longer holds the gradient (package
	// documentation, "Views and the rebuild"). The error names the
	// parameter; it is left unmarked, so fetching its gradient again,
	// writing it and calling Ready goes on with the step.
	ErrStaleGrad = errors.New("ddp: gradient written through a stale slice")
	// ErrConcurrent: Wait, WaitEach, Join or Broadcast (or
	// BroadcastParameters) was called while another goroutine was inside
	// one of them, or Begin while one was; the error names both calls. A
	// Reducer takes one such call at a time: the second fails at once,
	// without touching the step or issuing a collective, and the first
	// goes on.
	ErrConcurrent = errors.New("ddp: another call is in progress")
	// ErrGather: with Options.Shard, a bucket was gathered twice in one
	// step, or WaitGather found buckets not gathered (it names them).
	ErrGather = errors.New("ddp: bucket gathered twice or not at all")
	// ErrClosed: the Reducer was closed.
	ErrClosed = errors.New("ddp: reducer closed")
)
