//go:build cgo

package standin

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

static void *sym(void *h, const char *name) { return dlsym(h, name); }
static void *open_lib(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static const char *err(void) { return dlerror(); }

static void call_i(void *f, int a) { ((void (*)(int))f)(a); }
static void call_pi(void *f, uintptr_t p, int a) { ((void (*)(void *, int))f)((void *)p, a); }
static void call_pis(void *f, uintptr_t p, int a, const char *s) { ((void (*)(void *, int, const char *))f)((void *)p, a, s); }
static int call_ri_p(void *f, uintptr_t p) { return ((int (*)(void *))f)((void *)p); }
static long call_rl_i(void *f, int a) { return ((long (*)(int))f)(a); }
static long call_rl(void *f) { return ((long (*)(void))f)(); }
static uintptr_t call_rp_p(void *f, uintptr_t p) { return (uintptr_t)((void *(*)(void *))f)((void *)p); }
static void call_p(void *f, uintptr_t p) { ((void (*)(void *))f)((void *)p); }
static int call_ri(void *f) { return ((int (*)(void))f)(); }
static const char *call_rs_i(void *f, int a) { return ((const char *(*)(int))f)(a); }
static int call_ri_pbn(void *f, uintptr_t p, int *buf, int n) { return ((int (*)(void *, int *, int))f)((void *)p, buf, n); }
*/
import "C"

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"unsafe"
)

// Lib is a built stand-in: the paths to load it under and its controls.
type Lib struct {
	NCCL, CUDA string // both name the same shared object
	h          unsafe.Pointer
}

// Build compiles src (the stand-in's C file) with gcc into dir and links
// it there as libnccl.so.2 and libcuda.so.1.
func Build(dir, src string) (*Lib, error) {
	so := filepath.Join(dir, "libstandin.so")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	out, err := exec.Command(cc, "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-shared", "-fPIC", "-o", so, src, "-lpthread").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("standin: building %s with %s: %v\n%s", src, cc, err, out)
	}
	l := &Lib{NCCL: filepath.Join(dir, "libnccl.so.2"), CUDA: filepath.Join(dir, "libcuda.so.1")}
	for _, p := range []string{l.NCCL, l.CUDA} {
		if err := os.Symlink("libstandin.so", p); err != nil {
			return nil, err
		}
	}
	cs := C.CString(so)
	defer C.free(unsafe.Pointer(cs))
	if l.h = C.open_lib(cs); l.h == nil {
		return nil, fmt.Errorf("standin: dlopen %s: %s", so, C.GoString(C.err()))
	}
	return l, nil
}

func (l *Lib) fn(name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	f := C.sym(l.h, cs)
	if f == nil {
		panic("standin: no control " + name)
	}
	return f
}

// SetInProgress makes every later call of a non-blocking communicator
// that enqueues (and initialisation) answer ncclInProgress, and
// ncclCommGetAsyncError answer it polls more times before success; 0
// turns it off.
func (l *Lib) SetInProgress(polls int) { C.call_i(l.fn("standin_set_inprogress"), C.int(polls)) }

// SetDevices sets the number of devices cuDeviceGetCount reports.
func (l *Lib) SetDevices(n int) { C.call_i(l.fn("standin_set_devices"), C.int(n)) }

// AsyncError makes ncclCommGetAsyncError of comm report result, and
// ncclGetLastError msg.
func (l *Lib) AsyncError(comm uintptr, result int, msg string) {
	cs := C.CString(msg)
	defer C.free(unsafe.Pointer(cs))
	C.call_pis(l.fn("standin_async_error"), C.uintptr_t(comm), C.int(result), cs)
}

// Stall makes comm's next collectives never arrive (until it is aborted).
func (l *Lib) Stall(comm uintptr, on bool) {
	v := 0
	if on {
		v = 1
	}
	C.call_pi(l.fn("standin_stall"), C.uintptr_t(comm), C.int(v))
}

// Registrations returns comm's live ncclCommRegister registrations.
func (l *Lib) Registrations(comm uintptr) int {
	return int(C.call_ri_p(l.fn("standin_registrations"), C.uintptr_t(comm)))
}

// LiveAllocs returns the live allocations of cuMemAlloc (kind 0),
// ncclMemAlloc (1) or cuMemAllocHost (2).
func (l *Lib) LiveAllocs(kind int) int {
	return int(C.call_rl_i(l.fn("standin_live_allocs"), C.int(kind)))
}

// KernelLaunches returns how many kernels were launched.
func (l *Lib) KernelLaunches() int { return int(C.call_rl(l.fn("standin_kernel_launches"))) }

// Gate holds stream s (a CUstream) until Open.
func (l *Lib) Gate(s uintptr) Gate {
	return Gate{l: l, g: uintptr(C.call_rp_p(l.fn("standin_gate"), C.uintptr_t(s)))}
}

// Gate is a point in a stream that it does not pass until opened.
type Gate struct {
	l *Lib
	g uintptr
}

// Open lets the stream go on.
func (g Gate) Open() { C.call_p(g.l.fn("standin_open"), C.uintptr_t(g.g)) }

// Env names the NCCL whose completion rule the stand-in follows, as a
// version ("2.21", "2.25", "2.26.6"); empty means 2.26. It is read when
// the stand-in is loaded.
const Env = "DDPGO_STANDIN_NCCL"

// The completion rules the stand-in models (Model).
const (
	Immediate = 21 // 2.14-2.22: a launch enqueues at once
	LazyJoin  = 25 // 2.23-2.25: a group job per launch, kept in the launching thread's storage, joined by the communicator's next call
	Join      = 26 // 2.26: as 2.23-2.25, but ncclCommGetAsyncError joins the job
	Heap      = 27 // 2.27 and newer: ncclCommGetAsyncError joins the job, which no longer lives in the thread's storage
)

// Model returns the completion rule the stand-in follows (Immediate,
// LazyJoin, Join or Heap), or -1 when Env names none.
func (l *Lib) Model() int { return int(C.call_ri(l.fn("standin_model"))) }

// AsyncMode reports whether every enqueue of a non-blocking communicator
// of several ranks answers ncclInProgress and is enqueued by a group job
// (NCCL 2.23 and newer), rather than at once.
func (l *Lib) AsyncMode() bool { return C.call_ri(l.fn("standin_async_mode")) != 0 }

// Violations returns what the stand-in recorded that real NCCL would not
// survive (overlapping calls into one communicator, CUDA work on a
// communicator's stream while it is ncclInProgress, ...), in order.
func (l *Lib) Violations() []string {
	n := int(C.call_ri(l.fn("standin_violations")))
	v := make([]string, n)
	for i := range v {
		v[i] = C.GoString(C.call_rs_i(l.fn("standin_violation"), C.int(i)))
	}
	return v
}

// FailStreamCreate makes the nth next cuStreamCreate fail (0: none).
func (l *Lib) FailStreamCreate(nth int) { C.call_i(l.fn("standin_fail_stream_create"), C.int(nth)) }

// CommBlocking reports whether comm was made blocking (ncclConfig_t.blocking).
func (l *Lib) CommBlocking(comm uintptr) bool {
	return C.call_ri_p(l.fn("standin_comm_blocking"), C.uintptr_t(comm)) != 0
}

// StreamFlags returns the flags stream s (a CUstream) was created with.
func (l *Lib) StreamFlags(s uintptr) int {
	return int(C.call_ri_p(l.fn("standin_stream_flags"), C.uintptr_t(s)))
}

// Launches returns how many operations of comm each launch carried, in
// order: 1 for a collective outside a group, the group's count of comm's
// operations for a group.
func (l *Lib) Launches(comm uintptr) []int {
	buf := make([]C.int, 4096)
	n := int(C.call_ri_pbn(l.fn("standin_launches"), C.uintptr_t(comm), &buf[0], C.int(len(buf))))
	out := make([]int, min(n, len(buf)))
	for i := range out {
		out[i] = int(buf[i])
	}
	return out
}
