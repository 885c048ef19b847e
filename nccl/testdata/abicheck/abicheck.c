// binding.h against the real headers: compiled, never linked, by
// TestABIAgainstHeaders, with DDP_CHECK_CUDA (cuda.h) and with
// DDP_CHECK_NCCL as well (nccl.h, which includes CUDA's runtime headers).
// Each function of the binding gets one assertion that the pointer type
// its wrapper calls through is the type of the header's declaration (the
// _v2 names are what cuda.h's macros declare). The types binding.h
// declares for itself when it is built are replaced here by the headers'
// (DDP_USE_CUDA_H, DDP_USE_NCCL_H), so they are checked separately: same
// size, and the same kind of type. GO_* are the Go constants of the same
// values, passed by the test with -D.

#include <stddef.h>

#ifdef DDP_CHECK_CUDA
#include <cuda.h>
#define DDP_USE_CUDA_H 1
#endif
#ifdef DDP_CHECK_NCCL
#include <nccl.h>
#define DDP_USE_NCCL_H 1
#endif
#include "binding.h"

#define SAME(a, b) __builtin_types_compatible_p(a, b)
#define IS_POINTER(T) (__builtin_classify_type((T)0) == 5) // pointer_type_class
#define FN_MATCHES(ver, req, name, ret, params) \
	_Static_assert(SAME(__typeof__(&name), pfn_##name), #name ": pfn_" #name " of binding.h differs from the header");

#ifdef DDP_CHECK_CUDA
DDP_CUDA_SYMS(FN_MATCHES)

// binding.h's own CUDA types (int, int, int, unsigned long long, void *,
// void (*)(void *)).
_Static_assert(sizeof(CUresult) == sizeof(int), "CUresult is not int-sized");
_Static_assert(SAME(CUdevice, int), "CUdevice is not int");
_Static_assert(sizeof(CUdevice_attribute) == sizeof(int), "CUdevice_attribute is not int-sized");
_Static_assert(SAME(CUdeviceptr, unsigned long long), "CUdeviceptr is not unsigned long long");
_Static_assert(IS_POINTER(CUcontext) && IS_POINTER(CUstream) && IS_POINTER(CUevent) && IS_POINTER(CUmodule) && IS_POINTER(CUfunction),
	"a CUDA handle is not a pointer");
_Static_assert(SAME(CUhostFn, void (*)(void *)), "CUhostFn is not void (*)(void *)");

// The constants the wrappers pass and Go tests for.
_Static_assert(DDP_CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING, "CU_STREAM_NON_BLOCKING");
_Static_assert(DDP_CU_EVENT_DISABLE_TIMING == CU_EVENT_DISABLE_TIMING, "CU_EVENT_DISABLE_TIMING");
_Static_assert(GO_CUDA_ERROR_NOT_READY == CUDA_ERROR_NOT_READY, "Go's cudaErrorNotReady");
_Static_assert(GO_ATTR_COMPUTE_MAJOR == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "Go's attrComputeMajor");
_Static_assert(GO_ATTR_COMPUTE_MINOR == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "Go's attrComputeMinor");
#endif

#ifdef DDP_CHECK_NCCL
DDP_NCCL_SYMS(FN_MATCHES)

// binding.h's own NCCL types (int, int, int, void *, CUstream, 128 bytes).
_Static_assert(sizeof(ncclResult_t) == sizeof(int), "ncclResult_t is not int-sized");
_Static_assert(sizeof(ncclDataType_t) == sizeof(int), "ncclDataType_t is not int-sized");
_Static_assert(sizeof(ncclRedOp_t) == sizeof(int), "ncclRedOp_t is not int-sized");
_Static_assert(IS_POINTER(ncclComm_t), "ncclComm_t is not a pointer");
_Static_assert(SAME(cudaStream_t, CUstream), "cudaStream_t is not CUstream");
_Static_assert(sizeof(ncclUniqueId) == 128 && NCCL_UNIQUE_ID_BYTES == 128, "ncclUniqueId is not 128 bytes");

// ddp_config is a prefix of ncclConfig_t, field by field.
#define FIELD(f) \
	_Static_assert(offsetof(ddp_config, f) == offsetof(ncclConfig_t, f), "ncclConfig_t." #f " moved"); \
	_Static_assert(SAME(__typeof__(((ddp_config *)0)->f), __typeof__(((ncclConfig_t *)0)->f)), "ncclConfig_t." #f " changed type");
FIELD(size) FIELD(magic) FIELD(version) FIELD(blocking) FIELD(cgaClusterSize) FIELD(minCTAs) FIELD(maxCTAs) FIELD(netName)
_Static_assert(sizeof(ddp_config) <= sizeof(ncclConfig_t), "ncclConfig_t is shorter than ddp_config");

#ifdef NCCL_API_MAGIC // public from 2.29 on; a literal in NCCL_CONFIG_INITIALIZER before
_Static_assert(DDP_NCCL_API_MAGIC == NCCL_API_MAGIC, "NCCL_API_MAGIC");
#endif
_Static_assert(DDP_NCCL_CONFIG_UNDEF_INT == NCCL_CONFIG_UNDEF_INT, "NCCL_CONFIG_UNDEF_INT");
_Static_assert(DDP_NCCL_CONFIG_VERSION == NCCL_VERSION(2, 17, 0), "ddp_config's version");
_Static_assert(DDP_NCCL_SUCCESS == ncclSuccess && GO_NCCL_SUCCESS == ncclSuccess, "ncclSuccess");
_Static_assert(DDP_NCCL_INVALID_ARGUMENT == ncclInvalidArgument && GO_NCCL_INVALID_ARGUMENT == ncclInvalidArgument, "ncclInvalidArgument");
_Static_assert(DDP_NCCL_IN_PROGRESS == ncclInProgress && GO_NCCL_IN_PROGRESS == ncclInProgress, "ncclInProgress");
_Static_assert(GO_NCCL_UNHANDLED_CUDA_ERROR == ncclUnhandledCudaError && GO_NCCL_SYSTEM_ERROR == ncclSystemError &&
	GO_NCCL_INTERNAL_ERROR == ncclInternalError && GO_NCCL_INVALID_USAGE == ncclInvalidUsage &&
	GO_NCCL_REMOTE_ERROR == ncclRemoteError, "Go's Result values");
#endif
