package nccl

import (
	"errors"
	"fmt"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrNoCgo: the package was built without cgo (CGO_ENABLED=0), so it
	// cannot call NCCL or CUDA.
	ErrNoCgo = errors.New("nccl: built without cgo (CGO_ENABLED=0); the NCCL backend calls libnccl.so.2 and libcuda.so.1 through cgo: rebuild with CGO_ENABLED=1 and a C compiler")
	// ErrNotFound: libnccl.so.2 or libcuda.so.1 could not be loaded, or a
	// required symbol is missing from it. The error is a *LoadError.
	ErrNotFound = errors.New("nccl: library not found")
	// ErrVersion: the NCCL library is older than this package needs, or a
	// feature needs a newer one.
	ErrVersion = errors.New("nccl: NCCL version too old")
)

// MinVersion is the oldest NCCL this package runs on: 2.14 introduced
// ncclCommInitRankConfig and non-blocking communicators. ncclMemAlloc and
// ncclCommRegister, which the device pool uses when present, need 2.19.
const MinVersion = 21400

// LoadError reports a library that could not be opened or lacks a
// required symbol. It wraps ErrNotFound.
type LoadError struct {
	Library string // the path or name given to dlopen
	Symbol  string // the missing symbol, or "" when the library itself failed to open
	Since   int    // the NCCL version that introduced Symbol, when known
	Reason  string // dlopen's or dlsym's message
	cuda    bool
}

func (e *LoadError) Error() string {
	var what string
	switch {
	case e.Symbol != "" && e.Since > 0:
		what = fmt.Sprintf("nccl: %s has no symbol %s (NCCL %s or newer has it)", e.Library, e.Symbol, VersionString(e.Since))
	case e.Symbol != "":
		what = fmt.Sprintf("nccl: %s has no symbol %s", e.Library, e.Symbol)
	default:
		what = fmt.Sprintf("nccl: cannot load %s: %s", e.Library, e.Reason)
	}
	if e.cuda {
		return what + "; libcuda.so.1 comes with the NVIDIA driver: install the driver (CUDA 12 or newer), or point " + EnvCUDA + " (Libraries.CUDA) at it"
	}
	return what + fmt.Sprintf("; install NCCL %s or newer (2.19 or newer for ncclMemAlloc and buffer registration), e.g. the libnccl2 package of NVIDIA's CUDA repository, "+
		"or pip's nvidia-nccl-cu12 and point %s (Libraries.NCCL) at its lib/libnccl.so.2", VersionString(MinVersion), EnvNCCL)
}

// Unwrap returns ErrNotFound.
func (e *LoadError) Unwrap() error { return ErrNotFound }

// Result is ncclResult_t (src/nccl.h.in).
type Result int

// The values of ncclResult_t. ncclTimeout (8) exists from NCCL 2.30 on.
const (
	ResultSuccess            Result = 0
	ResultUnhandledCudaError Result = 1
	ResultSystemError        Result = 2
	ResultInternalError      Result = 3
	ResultInvalidArgument    Result = 4
	ResultInvalidUsage       Result = 5
	ResultRemoteError        Result = 6
	ResultInProgress         Result = 7
	ResultTimeout            Result = 8
)

const resultInProgress = 7

func (r Result) String() string {
	switch r {
	case ResultSuccess:
		return "ncclSuccess"
	case ResultUnhandledCudaError:
		return "ncclUnhandledCudaError"
	case ResultSystemError:
		return "ncclSystemError"
	case ResultInternalError:
		return "ncclInternalError"
	case ResultInvalidArgument:
		return "ncclInvalidArgument"
	case ResultInvalidUsage:
		return "ncclInvalidUsage"
	case ResultRemoteError:
		return "ncclRemoteError"
	case ResultInProgress:
		return "ncclInProgress"
	case ResultTimeout:
		return "ncclTimeout"
	}
	return fmt.Sprintf("ncclResult_t(%d)", int(r))
}

// Error is a failed NCCL call: the call, its result, NCCL's text for the
// result and, where NCCL 2.13's ncclGetLastError is there, its last
// message.
type Error struct {
	Call   string
	Result Result
	Text   string // ncclGetErrorString
	Last   string // ncclGetLastError, may be empty
}

func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s: %v: %s", e.Call, e.Result, e.Text)
	if e.Last != "" {
		s += " (last error: " + e.Last + ")"
	}
	return s
}

// CUDAError is a failed CUDA driver call.
type CUDAError struct {
	Call string
	Code int    // CUresult
	Name string // cuGetErrorName, e.g. CUDA_ERROR_OUT_OF_MEMORY
	Text string // cuGetErrorString
}

func (e *CUDAError) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if e.Text != "" {
		return fmt.Sprintf("nccl: %s: %s: %s", e.Call, name, e.Text)
	}
	return fmt.Sprintf("nccl: %s: %s", e.Call, name)
}

// VersionString formats an NCCL version code (ncclGetVersion's, or
// NCCL_VERSION(X,Y,Z)) as "X.Y.Z".
func VersionString(v int) string {
	if v < 10000 { // before 2.9: X*1000 + Y*100 + Z
		return fmt.Sprintf("%d.%d.%d", v/1000, v%1000/100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
}

// DriverVersionString formats cuDriverGetVersion's value (1000*major +
// 10*minor) as "major.minor".
func DriverVersionString(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}
