//go:build cgo

// The C half of package nccl: the ABI of the CUDA driver API and of NCCL
// that the package calls, the dispatch table dlsym fills, and the wrappers
// binding_cgo.go calls (binding.c). The ABI is declared here rather than
// taken from headers, so that building needs neither CUDA nor NCCL. It was
// written from NCCL's src/nccl.h.in (v2.17.1-1 for ncclConfig_t; enums
// unchanged through v2.30.7-1) and CUDA 12.6's cuda.h (the _v2 names are
// the symbols its macros map to). testdata/abicheck/abicheck.c compiles
// these declarations against the real cuda.h and nccl.h where they are
// found (TestABIAgainstHeaders; make cuda-dev-deps).
//
// The C functions of this package share a binary with package mpi's
// (ddpbench with the mpi tag links both), so none may take a name that
// mpi/ddpmpi.h declares.

#ifndef DDPGO_NCCL_BINDING_H
#define DDPGO_NCCL_BINDING_H

#include <stddef.h>
#include <stdint.h>

// The types of cuda.h and nccl.h this package uses, by their own names.
// abicheck.c defines DDP_USE_CUDA_H or DDP_USE_NCCL_H after including the
// real header, which then supplies them instead, so that every function
// type below is compared with the real declaration.
#ifndef DDP_USE_CUDA_H
typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_attribute;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction;
typedef void (*CUhostFn)(void *);
#endif
#ifndef DDP_USE_NCCL_H
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *ncclComm_t;
typedef CUstream cudaStream_t;
typedef struct { char internal[128]; } ncclUniqueId;      // NCCL_UNIQUE_ID_BYTES
#endif

// ddp_config is ncclConfig_v21700, the prefix of every later ncclConfig_t
// that this package fills: NCCL reads min(size, its own sizeof) bytes.
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
} ddp_config;
#ifndef DDP_USE_NCCL_H
typedef ddp_config ncclConfig_t;
#endif

// The constants of the ABI that the wrappers pass or test, by the headers'
// names.
#define DDP_CU_STREAM_NON_BLOCKING 0x1    // CU_STREAM_NON_BLOCKING
#define DDP_CU_EVENT_DISABLE_TIMING 0x2   // CU_EVENT_DISABLE_TIMING
#define DDP_NCCL_SUCCESS 0                // ncclSuccess
#define DDP_NCCL_INVALID_ARGUMENT 4       // ncclInvalidArgument
#define DDP_NCCL_IN_PROGRESS 7            // ncclInProgress
#define DDP_NCCL_API_MAGIC 0xcafebeef     // NCCL_API_MAGIC
#define DDP_NCCL_CONFIG_VERSION 21700     // NCCL_VERSION(2,17,0): ddp_config's layout
#define DDP_NCCL_CONFIG_UNDEF_INT INT32_MIN // NCCL_CONFIG_UNDEF_INT

// The functions the package calls, one table per library:
// X(first NCCL version that has it or 0, required, symbol, return type,
// parameters as the header declares them).
#define DDP_CUDA_SYMS(X) \
	X(0, 1, cuInit, CUresult, (unsigned int)) \
	X(0, 1, cuDriverGetVersion, CUresult, (int *)) \
	X(0, 1, cuGetErrorName, CUresult, (CUresult, const char **)) \
	X(0, 1, cuGetErrorString, CUresult, (CUresult, const char **)) \
	X(0, 1, cuDeviceGetCount, CUresult, (int *)) \
	X(0, 1, cuDeviceGet, CUresult, (CUdevice *, int)) \
	X(0, 1, cuDeviceGetName, CUresult, (char *, int, CUdevice)) \
	X(0, 1, cuDeviceGetAttribute, CUresult, (int *, CUdevice_attribute, CUdevice)) \
	X(0, 1, cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice)) \
	X(0, 1, cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice)) \
	X(0, 1, cuCtxSetCurrent, CUresult, (CUcontext)) \
	X(0, 1, cuStreamCreate, CUresult, (CUstream *, unsigned int)) \
	X(0, 1, cuStreamDestroy_v2, CUresult, (CUstream)) \
	X(0, 1, cuStreamQuery, CUresult, (CUstream)) \
	X(0, 1, cuStreamSynchronize, CUresult, (CUstream)) \
	X(0, 1, cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int)) \
	X(0, 1, cuEventCreate, CUresult, (CUevent *, unsigned int)) \
	X(0, 1, cuEventDestroy_v2, CUresult, (CUevent)) \
	X(0, 1, cuEventRecord, CUresult, (CUevent, CUstream)) \
	X(0, 1, cuEventQuery, CUresult, (CUevent)) \
	X(0, 1, cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t)) \
	X(0, 1, cuMemFree_v2, CUresult, (CUdeviceptr)) \
	X(0, 1, cuMemcpyHtoDAsync_v2, CUresult, (CUdeviceptr, const void *, size_t, CUstream)) \
	X(0, 1, cuMemcpyDtoHAsync_v2, CUresult, (void *, CUdeviceptr, size_t, CUstream)) \
	X(0, 1, cuMemcpyAsync, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
	X(0, 1, cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream)) \
	X(0, 1, cuMemAllocHost_v2, CUresult, (void **, size_t)) \
	X(0, 1, cuMemFreeHost, CUresult, (void *)) \
	X(0, 1, cuLaunchHostFunc, CUresult, (CUstream, CUhostFn, void *)) \
	X(0, 1, cuModuleLoadData, CUresult, (CUmodule *, const void *)) \
	X(0, 1, cuModuleUnload, CUresult, (CUmodule)) \
	X(0, 1, cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *)) \
	X(0, 1, cuLaunchKernel, CUresult, (CUfunction, unsigned int, unsigned int, unsigned int, \
		unsigned int, unsigned int, unsigned int, unsigned int, CUstream, void **, void **))

#define DDP_NCCL_SYMS(X) \
	X(0, 1, ncclGetVersion, ncclResult_t, (int *)) \
	X(0, 1, ncclGetErrorString, const char *, (ncclResult_t)) \
	X(0, 1, ncclGetUniqueId, ncclResult_t, (ncclUniqueId *)) \
	X(21400, 1, ncclCommInitRankConfig, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *)) \
	X(0, 1, ncclCommAbort, ncclResult_t, (ncclComm_t)) \
	X(0, 1, ncclCommDestroy, ncclResult_t, (ncclComm_t)) \
	X(0, 1, ncclCommGetAsyncError, ncclResult_t, (ncclComm_t, ncclResult_t *)) \
	X(0, 1, ncclCommCount, ncclResult_t, (ncclComm_t, int *)) \
	X(0, 1, ncclCommUserRank, ncclResult_t, (ncclComm_t, int *)) \
	X(0, 1, ncclCommCuDevice, ncclResult_t, (ncclComm_t, int *)) \
	X(0, 1, ncclAllReduce, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)) \
	X(0, 1, ncclBroadcast, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)) \
	X(0, 1, ncclReduce, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t)) \
	X(0, 1, ncclAllGather, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)) \
	X(0, 1, ncclReduceScatter, ncclResult_t, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)) \
	X(20700, 1, ncclSend, ncclResult_t, (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)) \
	X(20700, 1, ncclRecv, ncclResult_t, (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)) \
	X(0, 1, ncclGroupStart, ncclResult_t, (void)) \
	X(0, 1, ncclGroupEnd, ncclResult_t, (void)) \
	X(21300, 0, ncclGetLastError, const char *, (ncclComm_t)) \
	X(21900, 0, ncclMemAlloc, ncclResult_t, (void **, size_t)) \
	X(21900, 0, ncclMemFree, ncclResult_t, (void *)) \
	X(21900, 0, ncclCommRegister, ncclResult_t, (ncclComm_t, void *, size_t, void **)) \
	X(21900, 0, ncclCommDeregister, ncclResult_t, (ncclComm_t, void *))

// pfn_<symbol> is each function's pointer type; the wrappers call through
// no other.
#define DDP_PFN(ver, req, name, ret, params) typedef ret (*pfn_##name) params;
DDP_CUDA_SYMS(DDP_PFN)
DDP_NCCL_SYMS(DDP_PFN)
#undef DDP_PFN

// S_<symbol> indexes the dispatch table: the CUDA symbols, then NCCL's.
#define DDP_ENUM(ver, req, name, ret, params) S_##name,
enum { DDP_CUDA_SYMS(DDP_ENUM) DDP_NCCL_SYMS(DDP_ENUM) S_COUNT };
#undef DDP_ENUM

// ddp_lib is the dispatch table: one function pointer per symbol, filled
// by dlsym, NULL where an optional symbol is absent.
typedef struct { void *f[S_COUNT]; } ddp_lib;

// Handles (contexts, streams, events, modules, functions, communicators)
// cross into Go as integers: Go keeps them, never dereferences them.
typedef uintptr_t hnd;

// An NCCL wrapper reports a failure of a CUDA call it makes (setting the
// context, a staging copy, an event) as DDP_CTXERR plus the CUDA result,
// apart from NCCL's own results.
#define DDP_CTXERR 1000000

// One operation of a launch: a copy that stages a host buffer, or an NCCL
// call. Addresses travel as integers.
typedef struct {
	int kind, dtype, op, peer;
	uint64_t send, recv, count;
} ddp_op;
enum { K_HTOD = 1, K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_SEND, K_RECV, K_DTOH, K_HOSTFN };

// ddp_hcopy is the argument of the host function a K_HOSTFN operation
// runs, kept in pinned memory that stays the operation's until its event
// completes: it copies n bytes from src to dst.
typedef struct { uint64_t dst, src, n; } ddp_hcopy;

// The symbol table, by index: name, library (0 CUDA, 1 NCCL), first NCCL
// version that has it (0: every supported one) and whether it is required.
int ddp_nsyms(void);
const char *ddp_sym_name(int i);
int ddp_sym_lib_of(int i);
int ddp_sym_ver_of(int i);
int ddp_sym_req_of(int i);

ddp_lib *ddp_lib_new(void);
void ddp_lib_free(ddp_lib *L);
void ddp_set(ddp_lib *L, int i, void *p);
int ddp_has(ddp_lib *L, int i);

// ddp_dlopen opens path with RTLD_NOW, or returns NULL with dlerror's text
// in err.
void *ddp_dlopen(const char *path, char *err, size_t errlen);
void *ddp_dlsym(void *h, const char *name);
// ddp_standin calls the stand-in's ddpgo_standin, which only the test
// stand-in exports, or returns NULL.
const char *ddp_standin(void *h);
void ddp_dlclose(void *h);

// The wrappers. Each that takes a context makes it current first (see
// binding.c); ctx 0 leaves the thread's current context as it is.
CUresult ddp_cuInit(ddp_lib *L);
CUresult ddp_cuDriverGetVersion(ddp_lib *L, int *v);
const char *ddp_cuErrName(ddp_lib *L, CUresult r);
const char *ddp_cuErrString(ddp_lib *L, CUresult r);
CUresult ddp_cuDeviceGetCount(ddp_lib *L, int *n);
CUresult ddp_cuDeviceName(ddp_lib *L, int ordinal, char *name, int len);
CUresult ddp_cuDeviceAttr(ddp_lib *L, int ordinal, int attr, int *v);
CUresult ddp_cuRetain(ddp_lib *L, int ordinal, hnd *ctx);
CUresult ddp_cuRelease(ddp_lib *L, int ordinal);
CUresult ddp_cuStreamCreate(ddp_lib *L, hnd ctx, hnd *s);
CUresult ddp_cuStreamDestroy(ddp_lib *L, hnd ctx, hnd s);
CUresult ddp_cuStreamQuery(ddp_lib *L, hnd ctx, hnd s);
CUresult ddp_cuStreamSync(ddp_lib *L, hnd ctx, hnd s);
CUresult ddp_cuStreamWaitEvent(ddp_lib *L, hnd ctx, hnd s, hnd e);
CUresult ddp_cuEventCreate(ddp_lib *L, hnd ctx, hnd *e);
CUresult ddp_cuEventDestroy(ddp_lib *L, hnd ctx, hnd e);
CUresult ddp_cuEventRecord(ddp_lib *L, hnd ctx, hnd e, hnd s);
CUresult ddp_cuEventQuery(ddp_lib *L, hnd ctx, hnd e);
CUresult ddp_cuWaitOther(ddp_lib *L, hnd ctx, hnd s, hnd other, hnd e);
CUresult ddp_cuMemAlloc(ddp_lib *L, hnd ctx, size_t n, void **p);
CUresult ddp_cuMemFree(ddp_lib *L, hnd ctx, CUdeviceptr p);
CUresult ddp_cuHtoD(ddp_lib *L, hnd ctx, CUdeviceptr d, uintptr_t h, size_t n, hnd s);
CUresult ddp_cuDtoH(ddp_lib *L, hnd ctx, uintptr_t h, CUdeviceptr d, size_t n, hnd s);
CUresult ddp_cuDtoD(ddp_lib *L, hnd ctx, CUdeviceptr d, CUdeviceptr src, size_t n, hnd s);
CUresult ddp_cuMemset(ddp_lib *L, hnd ctx, CUdeviceptr d, unsigned char v, size_t n, hnd s);
CUresult ddp_cuMemAllocHost(ddp_lib *L, hnd ctx, size_t n, void **p);
CUresult ddp_cuMemFreeHost(ddp_lib *L, hnd ctx, void *p);
CUresult ddp_cuModuleLoad(ddp_lib *L, hnd ctx, const char *image, hnd *m);
CUresult ddp_cuModuleUnload(ddp_lib *L, hnd ctx, hnd m);
CUresult ddp_cuFunction(ddp_lib *L, hnd ctx, hnd m, const char *name, hnd *f);
CUresult ddp_cuLaunch(ddp_lib *L, hnd ctx, hnd f, unsigned grid, unsigned block, hnd s,
	unsigned long long a0, unsigned long long a1, unsigned long long a2, unsigned long long n, float x);

ncclResult_t ddp_ncclGetVersion(ddp_lib *L, int *v);
const char *ddp_ncclErrString(ddp_lib *L, ncclResult_t r);
const char *ddp_ncclLastError(ddp_lib *L, hnd c);
ncclResult_t ddp_ncclUniqueId(ddp_lib *L, ncclUniqueId *id);
ncclResult_t ddp_ncclInit(ddp_lib *L, int n, hnd *ctxs, hnd *comms, int nranks, const ncclUniqueId *id, const int *ranks, int blocking, int *failed);
ncclResult_t ddp_ncclAsyncError(ddp_lib *L, hnd c, ncclResult_t *state);
ncclResult_t ddp_ncclAbort(ddp_lib *L, hnd ctx, hnd c);
ncclResult_t ddp_ncclDestroy(ddp_lib *L, hnd ctx, hnd c);
ncclResult_t ddp_ncclCount(ddp_lib *L, hnd c, int *n);
ncclResult_t ddp_ncclUserRank(ddp_lib *L, hnd c, int *n);
ncclResult_t ddp_ncclCuDevice(ddp_lib *L, hnd c, int *n);
ncclResult_t ddp_ncclMemAlloc(ddp_lib *L, hnd ctx, size_t n, void **p);
ncclResult_t ddp_ncclMemFree(ddp_lib *L, hnd ctx, uintptr_t p);
ncclResult_t ddp_ncclRegister(ddp_lib *L, hnd ctx, hnd c, uintptr_t p, size_t n, hnd *h);
ncclResult_t ddp_ncclDeregister(ddp_lib *L, hnd ctx, hnd c, hnd h);

// ddp_launch issues n operations on stream s: copies that stage host
// buffers, then NCCL calls, inside one ncclGroupStart/End when group is
// set, all in this one call because NCCL's group state belongs to the
// calling thread. On success it issues the npost copies that bring staged
// results back and records the events (where not 0), so each event
// completes when its operation, copies included, has. *at is the index of
// the operation that failed. ncclInProgress from a non-blocking
// communicator means NCCL is still enqueueing: the copies back and the
// events then wait for ddp_post, once ncclCommGetAsyncError reports
// success.
ncclResult_t ddp_launch(ddp_lib *L, hnd ctx, hnd c, hnd s, ddp_op *ops, int n, ddp_op *post, int npost, hnd *events, int nev, int group, int *at);
ncclResult_t ddp_post(ddp_lib *L, hnd ctx, hnd s, ddp_op *post, int npost, hnd *events, int nev);

#endif
