package nccl

import "unsafe"

// driver is the binding: the libraries' functions, as the dispatch table
// of binding.c calls them. Handles (contexts, streams, events,
// modules, functions, communicators) are opaque integers; device
// addresses are integers too. Without cgo there is no driver, and Open
// fails with ErrNoCgo.
type driver interface {
	close()
	// standIn describes the test stand-in when it is what was loaded
	// (it exports ddpgo_standin), and is "" for real libraries.
	standIn() string

	ncclVersion() (int, error)
	driverVersion() (int, error)
	cuInit() error
	deviceCount() (int, error)
	deviceName(dev int) (string, error)
	deviceAttr(dev, attr int) (int, error)
	retainPrimary(dev int) (uintptr, error)
	releasePrimary(dev int) error

	streamCreate(ctx uintptr) (uintptr, error)
	streamDestroy(ctx, s uintptr) error
	streamQuery(ctx, s uintptr) (bool, error)
	streamSync(ctx, s uintptr) error
	streamWaitEvent(ctx, s, e uintptr) error
	waitOther(ctx, s, other, e uintptr) error
	eventCreate(ctx uintptr) (uintptr, error)
	eventDestroy(ctx, e uintptr) error
	eventRecord(ctx, e, s uintptr) error
	eventQuery(ctx, e uintptr) (bool, error)

	memAlloc(ctx uintptr, n int) (unsafe.Pointer, error)
	memFree(ctx uintptr, p unsafe.Pointer) error
	memAllocHost(ctx uintptr, n int) (unsafe.Pointer, error)
	memFreeHost(ctx uintptr, p unsafe.Pointer) error
	htod(ctx, dst uintptr, src unsafe.Pointer, n int, s uintptr) error
	dtoh(ctx uintptr, dst unsafe.Pointer, src uintptr, n int, s uintptr) error
	dtod(ctx, dst, src uintptr, n int, s uintptr) error
	memset(ctx, dst uintptr, v byte, n int, s uintptr) error
	moduleLoad(ctx uintptr, image string) (uintptr, error)
	moduleUnload(ctx, m uintptr) error
	function(ctx, m uintptr, name string) (uintptr, error)
	launchKernel(ctx, f uintptr, grid, block int, s uintptr, a0, a1, a2 uintptr, n int, x float32) error

	uniqueID() (UniqueID, error)
	commInit(ctxs []uintptr, nranks int, id UniqueID, ranks []int, blocking bool) ([]uintptr, Result, int, error)
	asyncError(comm uintptr) (Result, error)
	lastError(comm uintptr) string
	abort(ctx, comm uintptr) error
	destroy(ctx, comm uintptr) error
	commInfo(comm uintptr) (count, rank, dev int, err error)
	// ensureReady is ncclCommCount, called for the ncclCommEnsureReady it
	// runs first in every version (calls.go).
	ensureReady(comm uintptr) error
	ncclMemAlloc(ctx uintptr, n int) (unsafe.Pointer, error)
	ncclMemFree(ctx uintptr, p unsafe.Pointer) error
	register(ctx, comm, p uintptr, n int) (uintptr, error)
	deregister(ctx, comm, h uintptr) error
	launch(ctx, comm, s uintptr, ops, post []cop, events []uintptr, group bool) (Result, int, error)
	post(ctx, s uintptr, post []cop, events []uintptr) error
}

// symbol is one entry of the dispatch table.
type symbol struct {
	name     string
	nccl     bool // in libnccl.so.2, else libcuda.so.1
	since    int  // first NCCL version (NCCL_VERSION code) that has it; 0: every supported one
	required bool
	present  bool
}

// cudaErrorNotReady is CUDA_ERROR_NOT_READY (cuda.h): cuEventQuery's and
// cuStreamQuery's "not yet".
const cudaErrorNotReady = 600

// CUdevice_attribute values (cuda.h).
const (
	attrComputeMajor = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeMinor = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
)
