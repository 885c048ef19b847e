//go:build cgo

package nccl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "binding.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

const ctxErr = C.DDP_CTXERR

// cdriver is the driver over a dispatch table filled by dlsym.
type cdriver struct {
	t          *C.ddp_lib
	cuda, nccl unsafe.Pointer // dlopen handles
	standin    string         // the test stand-in's description, "" for real libraries
}

func cgoEnabled() bool { return true }

// openDriver opens the two libraries and fills the table. Symbols named in
// hide are treated as absent (tests use it to exercise the errors for a
// missing symbol).
func openDriver(ncclPath, cudaPath string, hide map[string]bool) (driver, []symbol, error) {
	var errbuf [512]C.char
	open := func(path string) (unsafe.Pointer, string) {
		cs := C.CString(path)
		defer C.free(unsafe.Pointer(cs))
		h := C.ddp_dlopen(cs, &errbuf[0], C.size_t(len(errbuf)))
		if h == nil {
			return nil, C.GoString(&errbuf[0])
		}
		return h, ""
	}
	d := &cdriver{t: C.ddp_lib_new()}
	var msg string
	if d.cuda, msg = open(cudaPath); d.cuda == nil {
		d.close()
		return nil, nil, &LoadError{Library: cudaPath, Reason: msg, cuda: true}
	}
	if d.nccl, msg = open(ncclPath); d.nccl == nil {
		d.close()
		return nil, nil, &LoadError{Library: ncclPath, Reason: msg}
	}
	for _, h := range []unsafe.Pointer{d.nccl, d.cuda} {
		if s := C.ddp_standin(h); s != nil && d.standin == "" {
			d.standin = C.GoString(s)
		}
	}
	n := int(C.ddp_nsyms())
	syms := make([]symbol, n)
	for i := range n {
		s := symbol{
			name:     C.GoString(C.ddp_sym_name(C.int(i))),
			nccl:     C.ddp_sym_lib_of(C.int(i)) == 1,
			since:    int(C.ddp_sym_ver_of(C.int(i))),
			required: C.ddp_sym_req_of(C.int(i)) == 1,
		}
		h := d.cuda
		if s.nccl {
			h = d.nccl
		}
		if !hide[s.name] {
			cs := C.CString(s.name)
			p := C.ddp_dlsym(h, cs)
			C.free(unsafe.Pointer(cs))
			C.ddp_set(d.t, C.int(i), p)
			s.present = p != nil
		}
		syms[i] = s
	}
	return d, syms, nil
}

func (d *cdriver) close() {
	// The libraries stay loaded: NCCL and the driver start threads of
	// their own that a dlclose would pull the code from under.
	if d.t != nil {
		C.ddp_lib_free(d.t)
		d.t = nil
	}
}

func (d *cdriver) standIn() string { return d.standin }

func (d *cdriver) cuErr(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	e := &CUDAError{Call: call, Code: int(r)}
	if s := C.ddp_cuErrName(d.t, r); s != nil {
		e.Name = C.GoString(s)
	}
	if s := C.ddp_cuErrString(d.t, r); s != nil {
		e.Text = C.GoString(s)
	}
	return e
}

// ncclErr turns an NCCL wrapper's result into an error; comm, when not 0,
// supplies ncclGetLastError's text.
func (d *cdriver) ncclErr(call string, r C.ncclResult_t, comm uintptr) error {
	if r == 0 {
		return nil
	}
	if r >= ctxErr {
		return d.cuErr(call+": cuCtxSetCurrent", C.CUresult(r-ctxErr))
	}
	e := &Error{Call: call, Result: Result(r)}
	e.Text = C.GoString(C.ddp_ncclErrString(d.t, r))
	e.Last = d.lastError(comm)
	return e
}

func (d *cdriver) lastError(comm uintptr) string {
	if s := C.ddp_ncclLastError(d.t, C.hnd(comm)); s != nil {
		return C.GoString(s)
	}
	return ""
}

func (d *cdriver) ncclVersion() (int, error) {
	var v C.int
	r := C.ddp_ncclGetVersion(d.t, &v)
	return int(v), d.ncclErr("ncclGetVersion", r, 0)
}

func (d *cdriver) driverVersion() (int, error) {
	var v C.int
	r := C.ddp_cuDriverGetVersion(d.t, &v)
	return int(v), d.cuErr("cuDriverGetVersion", r)
}

func (d *cdriver) cuInit() error { return d.cuErr("cuInit", C.ddp_cuInit(d.t)) }

func (d *cdriver) deviceCount() (int, error) {
	var n C.int
	r := C.ddp_cuDeviceGetCount(d.t, &n)
	return int(n), d.cuErr("cuDeviceGetCount", r)
}

func (d *cdriver) deviceName(dev int) (string, error) {
	var b [256]C.char
	if err := d.cuErr("cuDeviceGetName", C.ddp_cuDeviceName(d.t, C.int(dev), &b[0], C.int(len(b)))); err != nil {
		return "", err
	}
	return C.GoString(&b[0]), nil
}

func (d *cdriver) deviceAttr(dev, attr int) (int, error) {
	var v C.int
	r := C.ddp_cuDeviceAttr(d.t, C.int(dev), C.int(attr), &v)
	return int(v), d.cuErr("cuDeviceGetAttribute", r)
}

func (d *cdriver) retainPrimary(dev int) (uintptr, error) {
	var c C.hnd
	r := C.ddp_cuRetain(d.t, C.int(dev), &c)
	return uintptr(c), d.cuErr("cuDevicePrimaryCtxRetain", r)
}

func (d *cdriver) releasePrimary(dev int) error {
	return d.cuErr("cuDevicePrimaryCtxRelease_v2", C.ddp_cuRelease(d.t, C.int(dev)))
}

func (d *cdriver) streamCreate(ctx uintptr) (uintptr, error) {
	var s C.hnd
	r := C.ddp_cuStreamCreate(d.t, C.hnd(ctx), &s)
	return uintptr(s), d.cuErr("cuStreamCreate", r)
}

func (d *cdriver) streamDestroy(ctx, s uintptr) error {
	return d.cuErr("cuStreamDestroy_v2", C.ddp_cuStreamDestroy(d.t, C.hnd(ctx), C.hnd(s)))
}

func (d *cdriver) streamQuery(ctx, s uintptr) (bool, error) {
	r := C.ddp_cuStreamQuery(d.t, C.hnd(ctx), C.hnd(s))
	if r == cudaErrorNotReady {
		return false, nil
	}
	return true, d.cuErr("cuStreamQuery", r)
}

func (d *cdriver) streamSync(ctx, s uintptr) error {
	return d.cuErr("cuStreamSynchronize", C.ddp_cuStreamSync(d.t, C.hnd(ctx), C.hnd(s)))
}

func (d *cdriver) streamWaitEvent(ctx, s, e uintptr) error {
	return d.cuErr("cuStreamWaitEvent", C.ddp_cuStreamWaitEvent(d.t, C.hnd(ctx), C.hnd(s), C.hnd(e)))
}

func (d *cdriver) waitOther(ctx, s, other, e uintptr) error {
	return d.cuErr("cuEventRecord+cuStreamWaitEvent", C.ddp_cuWaitOther(d.t, C.hnd(ctx), C.hnd(s), C.hnd(other), C.hnd(e)))
}

func (d *cdriver) eventCreate(ctx uintptr) (uintptr, error) {
	var e C.hnd
	r := C.ddp_cuEventCreate(d.t, C.hnd(ctx), &e)
	return uintptr(e), d.cuErr("cuEventCreate", r)
}

func (d *cdriver) eventDestroy(ctx, e uintptr) error {
	return d.cuErr("cuEventDestroy_v2", C.ddp_cuEventDestroy(d.t, C.hnd(ctx), C.hnd(e)))
}

func (d *cdriver) eventRecord(ctx, e, s uintptr) error {
	return d.cuErr("cuEventRecord", C.ddp_cuEventRecord(d.t, C.hnd(ctx), C.hnd(e), C.hnd(s)))
}

func (d *cdriver) eventQuery(ctx, e uintptr) (bool, error) {
	r := C.ddp_cuEventQuery(d.t, C.hnd(ctx), C.hnd(e))
	if r == cudaErrorNotReady {
		return false, nil
	}
	return true, d.cuErr("cuEventQuery", r)
}

func (d *cdriver) memAlloc(ctx uintptr, n int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	r := C.ddp_cuMemAlloc(d.t, C.hnd(ctx), C.size_t(n), &p)
	return p, d.cuErr(fmt.Sprintf("cuMemAlloc_v2(%d bytes)", n), r)
}

func (d *cdriver) memFree(ctx uintptr, p unsafe.Pointer) error {
	return d.cuErr("cuMemFree_v2", C.ddp_cuMemFree(d.t, C.hnd(ctx), C.CUdeviceptr(uintptr(p))))
}

func (d *cdriver) htod(ctx, dst uintptr, src unsafe.Pointer, n int, s uintptr) error {
	r := C.ddp_cuHtoD(d.t, C.hnd(ctx), C.CUdeviceptr(dst), C.uintptr_t(uintptr(src)), C.size_t(n), C.hnd(s))
	return d.cuErr("cuMemcpyHtoDAsync_v2", r)
}

func (d *cdriver) dtoh(ctx uintptr, dst unsafe.Pointer, src uintptr, n int, s uintptr) error {
	r := C.ddp_cuDtoH(d.t, C.hnd(ctx), C.uintptr_t(uintptr(dst)), C.CUdeviceptr(src), C.size_t(n), C.hnd(s))
	return d.cuErr("cuMemcpyDtoHAsync_v2", r)
}

func (d *cdriver) dtod(ctx, dst, src uintptr, n int, s uintptr) error {
	r := C.ddp_cuDtoD(d.t, C.hnd(ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), C.hnd(s))
	return d.cuErr("cuMemcpyAsync", r)
}

func (d *cdriver) memset(ctx, dst uintptr, v byte, n int, s uintptr) error {
	r := C.ddp_cuMemset(d.t, C.hnd(ctx), C.CUdeviceptr(dst), C.uchar(v), C.size_t(n), C.hnd(s))
	return d.cuErr("cuMemsetD8Async", r)
}

func (d *cdriver) moduleLoad(ctx uintptr, image string) (uintptr, error) {
	cs := C.CString(image) // NUL-terminated, as cuModuleLoadData wants PTX
	defer C.free(unsafe.Pointer(cs))
	var m C.hnd
	r := C.ddp_cuModuleLoad(d.t, C.hnd(ctx), cs, &m)
	return uintptr(m), d.cuErr("cuModuleLoadData", r)
}

func (d *cdriver) moduleUnload(ctx, m uintptr) error {
	return d.cuErr("cuModuleUnload", C.ddp_cuModuleUnload(d.t, C.hnd(ctx), C.hnd(m)))
}

func (d *cdriver) function(ctx, m uintptr, name string) (uintptr, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var f C.hnd
	r := C.ddp_cuFunction(d.t, C.hnd(ctx), C.hnd(m), cs, &f)
	return uintptr(f), d.cuErr("cuModuleGetFunction("+name+")", r)
}

func (d *cdriver) launchKernel(ctx, f uintptr, grid, block int, s uintptr, a0, a1, a2 uintptr, n int, x float32) error {
	r := C.ddp_cuLaunch(d.t, C.hnd(ctx), C.hnd(f), C.uint(grid), C.uint(block), C.hnd(s),
		C.ulonglong(a0), C.ulonglong(a1), C.ulonglong(a2), C.ulonglong(n), C.float(x))
	return d.cuErr("cuLaunchKernel", r)
}

func (d *cdriver) uniqueID() (UniqueID, error) {
	var id C.ncclUniqueId
	r := C.ddp_ncclUniqueId(d.t, &id)
	var u UniqueID
	copy(u[:], unsafe.Slice((*byte)(unsafe.Pointer(&id.internal[0])), len(u)))
	return u, d.ncclErr("ncclGetUniqueId", r, 0)
}

func (d *cdriver) commInit(ctxs []uintptr, nranks int, id UniqueID, ranks []int, blocking bool) ([]uintptr, Result, int, error) {
	n := len(ctxs)
	cctx := make([]C.hnd, n)
	cranks := make([]C.int, n)
	for i := range n {
		cctx[i] = C.hnd(ctxs[i])
		cranks[i] = C.int(ranks[i])
	}
	comms := make([]C.hnd, n)
	var cid C.ncclUniqueId
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&cid.internal[0])), len(id)), id[:])
	b := C.int(0)
	if blocking {
		b = 1
	}
	var failed C.int
	// The slices are C-typed Go memory holding no Go pointers, which cgo
	// allows C to read and write during the call.
	r := C.ddp_ncclInit(d.t, C.int(n), &cctx[0], &comms[0], C.int(nranks), &cid, &cranks[0], b, &failed)
	out := make([]uintptr, n)
	for i := range n {
		out[i] = uintptr(comms[i])
	}
	if r == 0 || r == resultInProgress {
		return out, Result(r), -1, nil
	}
	var comm uintptr
	if failed >= 0 {
		comm = out[failed]
	}
	return out, Result(r), int(failed), d.ncclErr("ncclCommInitRankConfig", r, comm)
}

func (d *cdriver) asyncError(comm uintptr) (Result, error) {
	var st C.ncclResult_t
	r := C.ddp_ncclAsyncError(d.t, C.hnd(comm), &st)
	return Result(st), d.ncclErr("ncclCommGetAsyncError", r, comm)
}

func (d *cdriver) abort(ctx, comm uintptr) error {
	return d.ncclErr("ncclCommAbort", C.ddp_ncclAbort(d.t, C.hnd(ctx), C.hnd(comm)), 0)
}

func (d *cdriver) destroy(ctx, comm uintptr) error {
	return d.ncclErr("ncclCommDestroy", C.ddp_ncclDestroy(d.t, C.hnd(ctx), C.hnd(comm)), 0)
}

func (d *cdriver) commInfo(comm uintptr) (count, rank, dev int, err error) {
	var n, r, v C.int
	c := C.hnd(comm)
	if err = d.ncclErr("ncclCommCount", C.ddp_ncclCount(d.t, c, &n), comm); err != nil {
		return
	}
	if err = d.ncclErr("ncclCommUserRank", C.ddp_ncclUserRank(d.t, c, &r), comm); err != nil {
		return
	}
	err = d.ncclErr("ncclCommCuDevice", C.ddp_ncclCuDevice(d.t, c, &v), comm)
	return int(n), int(r), int(v), err
}

func (d *cdriver) ensureReady(comm uintptr) error {
	var n C.int
	return d.ncclErr("ncclCommCount", C.ddp_ncclCount(d.t, C.hnd(comm), &n), comm)
}

func (d *cdriver) ncclMemAlloc(ctx uintptr, n int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	r := C.ddp_ncclMemAlloc(d.t, C.hnd(ctx), C.size_t(n), &p)
	return p, d.ncclErr(fmt.Sprintf("ncclMemAlloc(%d bytes)", n), r, 0)
}

func (d *cdriver) ncclMemFree(ctx uintptr, p unsafe.Pointer) error {
	return d.ncclErr("ncclMemFree", C.ddp_ncclMemFree(d.t, C.hnd(ctx), C.uintptr_t(uintptr(p))), 0)
}

func (d *cdriver) register(ctx, comm, p uintptr, n int) (uintptr, error) {
	var h C.hnd
	r := C.ddp_ncclRegister(d.t, C.hnd(ctx), C.hnd(comm), C.uintptr_t(p), C.size_t(n), &h)
	return uintptr(h), d.ncclErr(fmt.Sprintf("ncclCommRegister(%d bytes)", n), r, comm)
}

func (d *cdriver) deregister(ctx, comm, h uintptr) error {
	return d.ncclErr("ncclCommDeregister", C.ddp_ncclDeregister(d.t, C.hnd(ctx), C.hnd(comm), C.hnd(h)), comm)
}

// launch issues ops, then post and events, on stream s (see
// ddp_launch). It returns NCCL's result (resultInProgress included) and,
// on failure, the index of the operation that failed or -1.
func (d *cdriver) launch(ctx, comm, s uintptr, ops, post []cop, events []uintptr, group bool) (Result, int, error) {
	var at C.int
	g := C.int(0)
	if group {
		g = 1
	}
	r := C.ddp_launch(d.t, C.hnd(ctx), C.hnd(comm), C.hnd(s), copPtr(ops), C.int(len(ops)), copPtr(post), C.int(len(post)),
		hndPtr(events), C.int(len(events)), g, &at)
	if r == 0 || r == resultInProgress {
		return Result(r), -1, nil
	}
	return Result(r), int(at), d.ncclErr("launch", r, comm)
}

// post issues the copies back and records the events of operations whose
// launch answered ncclInProgress, once NCCL has enqueued them.
func (d *cdriver) post(ctx, s uintptr, post []cop, events []uintptr) error {
	r := C.ddp_post(d.t, C.hnd(ctx), C.hnd(s), copPtr(post), C.int(len(post)), hndPtr(events), C.int(len(events)))
	return d.ncclErr("staging copies and events", r, 0)
}

func copPtr(ops []cop) *C.ddp_op {
	if len(ops) == 0 {
		return nil
	}
	return (*C.ddp_op)(unsafe.Pointer(&ops[0]))
}

func hndPtr(h []uintptr) *C.hnd {
	if len(h) == 0 {
		return nil
	}
	return (*C.hnd)(unsafe.Pointer(&h[0]))
}

func (d *cdriver) memAllocHost(ctx uintptr, n int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	r := C.ddp_cuMemAllocHost(d.t, C.hnd(ctx), C.size_t(n), &p)
	return p, d.cuErr(fmt.Sprintf("cuMemAllocHost_v2(%d bytes)", n), r)
}

func (d *cdriver) memFreeHost(ctx uintptr, p unsafe.Pointer) error {
	return d.cuErr("cuMemFreeHost", C.ddp_cuMemFreeHost(d.t, C.hnd(ctx), p))
}

// cop mirrors ddp_op; binding_test checks the layout.
type cop = C.ddp_op

func newCop(kind, dtype, op, peer int, send, recv uintptr, count int) cop {
	return cop{kind: C.int(kind), dtype: C.int(dtype), op: C.int(op), peer: C.int(peer),
		send: C.uint64_t(send), recv: C.uint64_t(recv), count: C.uint64_t(count)}
}

const (
	copHtoD          = C.K_HTOD
	copAllReduce     = C.K_ALLREDUCE
	copBroadcast     = C.K_BROADCAST
	copReduce        = C.K_REDUCE
	copAllGather     = C.K_ALLGATHER
	copReduceScatter = C.K_REDUCESCATTER
	copSend          = C.K_SEND
	copRecv          = C.K_RECV
	copDtoH          = C.K_DTOH
	copHostFn        = C.K_HOSTFN
)

func configLayout() (size, blockingOff uintptr) {
	var c C.ddp_config
	return unsafe.Sizeof(c), unsafe.Offsetof(c.blocking)
}
