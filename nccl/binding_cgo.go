//go:build cgo

package nccl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The ABI, declared here rather than taken from headers so that building
// needs neither CUDA nor NCCL. Checked against NCCL's src/nccl.h.in
// (v2.17.1-1 for ncclConfig_t; enums unchanged through v2.30.7-1) and
// CUDA 12.6's cuda.h (the _v2 names are the symbols its macros map to).
typedef int ncclResult_t;
typedef void *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;      // NCCL_UNIQUE_ID_BYTES
typedef struct {                                           // ncclConfig_v21700
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
} ddp_config;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction;

// X(library, first NCCL version that has it or 0, required, symbol)
#define DDP_SYMS(X) \
	X(0, 0, 1, cuInit) \
	X(0, 0, 1, cuDriverGetVersion) \
	X(0, 0, 1, cuGetErrorName) \
	X(0, 0, 1, cuGetErrorString) \
	X(0, 0, 1, cuDeviceGetCount) \
	X(0, 0, 1, cuDeviceGet) \
	X(0, 0, 1, cuDeviceGetName) \
	X(0, 0, 1, cuDeviceGetAttribute) \
	X(0, 0, 1, cuDevicePrimaryCtxRetain) \
	X(0, 0, 1, cuDevicePrimaryCtxRelease_v2) \
	X(0, 0, 1, cuCtxSetCurrent) \
	X(0, 0, 1, cuStreamCreate) \
	X(0, 0, 1, cuStreamDestroy_v2) \
	X(0, 0, 1, cuStreamQuery) \
	X(0, 0, 1, cuStreamSynchronize) \
	X(0, 0, 1, cuStreamWaitEvent) \
	X(0, 0, 1, cuEventCreate) \
	X(0, 0, 1, cuEventDestroy_v2) \
	X(0, 0, 1, cuEventRecord) \
	X(0, 0, 1, cuEventQuery) \
	X(0, 0, 1, cuMemAlloc_v2) \
	X(0, 0, 1, cuMemFree_v2) \
	X(0, 0, 1, cuMemcpyHtoDAsync_v2) \
	X(0, 0, 1, cuMemcpyDtoHAsync_v2) \
	X(0, 0, 1, cuMemcpyAsync) \
	X(0, 0, 1, cuMemsetD8Async) \
	X(0, 0, 1, cuMemAllocHost_v2) \
	X(0, 0, 1, cuMemFreeHost) \
	X(0, 0, 1, cuLaunchHostFunc) \
	X(0, 0, 1, cuModuleLoadData) \
	X(0, 0, 1, cuModuleUnload) \
	X(0, 0, 1, cuModuleGetFunction) \
	X(0, 0, 1, cuLaunchKernel) \
	X(1, 0, 1, ncclGetVersion) \
	X(1, 0, 1, ncclGetErrorString) \
	X(1, 0, 1, ncclGetUniqueId) \
	X(1, 21400, 1, ncclCommInitRankConfig) \
	X(1, 0, 1, ncclCommAbort) \
	X(1, 0, 1, ncclCommDestroy) \
	X(1, 0, 1, ncclCommGetAsyncError) \
	X(1, 0, 1, ncclCommCount) \
	X(1, 0, 1, ncclCommUserRank) \
	X(1, 0, 1, ncclCommCuDevice) \
	X(1, 0, 1, ncclAllReduce) \
	X(1, 0, 1, ncclBroadcast) \
	X(1, 0, 1, ncclReduce) \
	X(1, 0, 1, ncclAllGather) \
	X(1, 0, 1, ncclReduceScatter) \
	X(1, 20700, 1, ncclSend) \
	X(1, 20700, 1, ncclRecv) \
	X(1, 0, 1, ncclGroupStart) \
	X(1, 0, 1, ncclGroupEnd) \
	X(1, 21300, 0, ncclGetLastError) \
	X(1, 21900, 0, ncclMemAlloc) \
	X(1, 21900, 0, ncclMemFree) \
	X(1, 21900, 0, ncclCommRegister) \
	X(1, 21900, 0, ncclCommDeregister)

#define DDP_ENUM(lib, ver, req, name) S_##name,
enum { DDP_SYMS(DDP_ENUM) S_COUNT };
#define DDP_NAME(lib, ver, req, name) #name,
static const char *ddp_sym_names[] = { DDP_SYMS(DDP_NAME) };
#define DDP_LIB(lib, ver, req, name) lib,
static const int ddp_sym_lib[] = { DDP_SYMS(DDP_LIB) };
#define DDP_VER(lib, ver, req, name) ver,
static const int ddp_sym_ver[] = { DDP_SYMS(DDP_VER) };
#define DDP_REQ(lib, ver, req, name) req,
static const int ddp_sym_req[] = { DDP_SYMS(DDP_REQ) };

static int ddp_nsyms(void) { return S_COUNT; }
static const char *ddp_sym_name(int i) { return ddp_sym_names[i]; }
static int ddp_sym_lib_of(int i) { return ddp_sym_lib[i]; }
static int ddp_sym_ver_of(int i) { return ddp_sym_ver[i]; }
static int ddp_sym_req_of(int i) { return ddp_sym_req[i]; }

// ddp_lib is the dispatch table: one function pointer per symbol, filled
// by dlsym, NULL where an optional symbol is absent.
typedef struct { void *f[S_COUNT]; } ddp_lib;

static ddp_lib *ddp_new(void) { return calloc(1, sizeof(ddp_lib)); }
static void ddp_free(ddp_lib *L) { free(L); }
static void ddp_set(ddp_lib *L, int i, void *p) { L->f[i] = p; }
static int ddp_has(ddp_lib *L, int i) { return L->f[i] != NULL; }

// RTLD_NOW: every symbol the library itself needs is resolved at once, so
// a broken installation fails here, not in the middle of a collective.
static void *ddp_dlopen(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		strncpy(err, e ? e : "unknown dlopen error", errlen - 1);
		err[errlen - 1] = 0;
	}
	return h;
}
static void *ddp_dlsym(void *h, const char *name) { return dlsym(h, name); }
// ddp_standin calls the stand-in's ddpgo_standin, which only the test
// stand-in exports, or returns NULL.
static const char *ddp_standin(void *h) {
	const char *(*f)(void) = (const char *(*)(void))dlsym(h, "ddpgo_standin");
	return f ? f() : NULL;
}
static void ddp_dlclose(void *h) { dlclose(h); }

#define F(T, name) ((T)L->f[S_##name])
typedef CUresult (*cu_v)(void);
typedef CUresult (*cu_u)(unsigned int);
typedef CUresult (*cu_pi)(int *);
typedef CUresult (*cu_err)(CUresult, const char **);
typedef CUresult (*cu_dev)(int *, int);
typedef CUresult (*cu_name)(char *, int, int);
typedef CUresult (*cu_attr)(int *, int, int);
typedef CUresult (*cu_retain)(CUcontext *, int);
typedef CUresult (*cu_i)(int);
typedef CUresult (*cu_ctx)(CUcontext);
typedef CUresult (*cu_mk)(void **, unsigned int);
typedef CUresult (*cu_h)(void *);
typedef CUresult (*cu_hh)(void *, void *);
typedef CUresult (*cu_hhu)(void *, void *, unsigned int);
typedef CUresult (*cu_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*cu_free)(CUdeviceptr);
typedef CUresult (*cu_htod)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*cu_dtoh)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*cu_dtod)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*cu_set8)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*cu_load)(CUmodule *, const void *);
typedef CUresult (*cu_getf)(CUfunction *, CUmodule, const char *);
typedef CUresult (*cu_hostalloc)(void **, size_t);
typedef CUresult (*cu_hostfn)(CUstream, void (*)(void *), void *);
typedef CUresult (*cu_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);

typedef ncclResult_t (*nc_pi)(int *);
typedef const char *(*nc_str)(ncclResult_t);
typedef const char *(*nc_last)(ncclComm_t);
typedef ncclResult_t (*nc_uid)(ncclUniqueId *);
typedef ncclResult_t (*nc_init)(ncclComm_t *, int, ncclUniqueId, int, ddp_config *);
typedef ncclResult_t (*nc_c)(ncclComm_t);
typedef ncclResult_t (*nc_cr)(ncclComm_t, ncclResult_t *);
typedef ncclResult_t (*nc_ci)(ncclComm_t, int *);
typedef ncclResult_t (*nc_v)(void);
typedef ncclResult_t (*nc_allreduce)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
typedef ncclResult_t (*nc_bcast)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
typedef ncclResult_t (*nc_reduce)(const void *, void *, size_t, int, int, int, ncclComm_t, CUstream);
typedef ncclResult_t (*nc_allgather)(const void *, void *, size_t, int, ncclComm_t, CUstream);
typedef ncclResult_t (*nc_send)(const void *, size_t, int, int, ncclComm_t, CUstream);
typedef ncclResult_t (*nc_recv)(void *, size_t, int, int, ncclComm_t, CUstream);
typedef ncclResult_t (*nc_memalloc)(void **, size_t);
typedef ncclResult_t (*nc_memfree)(void *);
typedef ncclResult_t (*nc_reg)(ncclComm_t, void *, size_t, void **);
typedef ncclResult_t (*nc_dereg)(ncclComm_t, void *);

// Every call that needs a context makes the caller's current first: a
// goroutine may run on any OS thread, and a CUDA context is current per
// thread, so the context travels with each call instead.
#define H(x) ((void *)(uintptr_t)(x))
#define SETCTX(ctx) do { if (ctx) { CUresult r_ = F(cu_ctx, cuCtxSetCurrent)(H(ctx)); if (r_) return r_; } } while (0)
// An NCCL wrapper reports a failure to make the context current as
// DDP_CTXERR plus the CUDA result, apart from NCCL's own results.
#define DDP_CTXERR 1000000
#define SETCTXN(ctx) do { if (ctx) { CUresult r_ = F(cu_ctx, cuCtxSetCurrent)(H(ctx)); if (r_) return DDP_CTXERR + r_; } } while (0)
// Handles (contexts, streams, events, modules, functions, communicators)
// cross into Go as integers: Go keeps them, never dereferences them.
typedef uintptr_t hnd;

static CUresult ddp_cuInit(ddp_lib *L) { return F(cu_u, cuInit)(0); }
static CUresult ddp_cuDriverGetVersion(ddp_lib *L, int *v) { return F(cu_pi, cuDriverGetVersion)(v); }
static const char *ddp_cuErrName(ddp_lib *L, CUresult r) { const char *s = NULL; if (F(cu_err, cuGetErrorName)(r, &s)) return NULL; return s; }
static const char *ddp_cuErrString(ddp_lib *L, CUresult r) { const char *s = NULL; if (F(cu_err, cuGetErrorString)(r, &s)) return NULL; return s; }
static CUresult ddp_cuDeviceGetCount(ddp_lib *L, int *n) { return F(cu_pi, cuDeviceGetCount)(n); }
static CUresult ddp_cuDeviceName(ddp_lib *L, int ordinal, char *name, int len) {
	int d; CUresult r = F(cu_dev, cuDeviceGet)(&d, ordinal); if (r) return r;
	return F(cu_name, cuDeviceGetName)(name, len, d);
}
static CUresult ddp_cuDeviceAttr(ddp_lib *L, int ordinal, int attr, int *v) {
	int d; CUresult r = F(cu_dev, cuDeviceGet)(&d, ordinal); if (r) return r;
	return F(cu_attr, cuDeviceGetAttribute)(v, attr, d);
}
static CUresult ddp_cuRetain(ddp_lib *L, int ordinal, hnd *ctx) {
	int d; CUresult r = F(cu_dev, cuDeviceGet)(&d, ordinal); if (r) return r;
	CUcontext c = NULL; r = F(cu_retain, cuDevicePrimaryCtxRetain)(&c, d); *ctx = (hnd)c; return r;
}
static CUresult ddp_cuRelease(ddp_lib *L, int ordinal) {
	int d; CUresult r = F(cu_dev, cuDeviceGet)(&d, ordinal); if (r) return r;
	return F(cu_i, cuDevicePrimaryCtxRelease_v2)(d);
}
// CU_STREAM_NON_BLOCKING (0x1): no implicit ordering with the legacy
// default stream, so other work of the process cannot delay collectives.
static CUresult ddp_cuStreamCreate(ddp_lib *L, hnd ctx, hnd *s) { SETCTX(ctx); void *x = NULL; CUresult r = F(cu_mk, cuStreamCreate)(&x, 0x1); *s = (hnd)x; return r; }
static CUresult ddp_cuStreamDestroy(ddp_lib *L, hnd ctx, hnd s) { SETCTX(ctx); return F(cu_h, cuStreamDestroy_v2)(H(s)); }
static CUresult ddp_cuStreamQuery(ddp_lib *L, hnd ctx, hnd s) { SETCTX(ctx); return F(cu_h, cuStreamQuery)(H(s)); }
static CUresult ddp_cuStreamSync(ddp_lib *L, hnd ctx, hnd s) { SETCTX(ctx); return F(cu_h, cuStreamSynchronize)(H(s)); }
static CUresult ddp_cuStreamWaitEvent(ddp_lib *L, hnd ctx, hnd s, hnd e) { SETCTX(ctx); return F(cu_hhu, cuStreamWaitEvent)(H(s), H(e), 0); }
// CU_EVENT_DISABLE_TIMING (0x2): the cheapest event to record and query.
static CUresult ddp_cuEventCreate(ddp_lib *L, hnd ctx, hnd *e) { SETCTX(ctx); void *x = NULL; CUresult r = F(cu_mk, cuEventCreate)(&x, 0x2); *e = (hnd)x; return r; }
static CUresult ddp_cuEventDestroy(ddp_lib *L, hnd ctx, hnd e) { SETCTX(ctx); return F(cu_h, cuEventDestroy_v2)(H(e)); }
static CUresult ddp_cuEventRecord(ddp_lib *L, hnd ctx, hnd e, hnd s) { SETCTX(ctx); return F(cu_hh, cuEventRecord)(H(e), H(s)); }
static CUresult ddp_cuEventQuery(ddp_lib *L, hnd ctx, hnd e) { SETCTX(ctx); return F(cu_h, cuEventQuery)(H(e)); }
// ddp_cuWaitOther makes stream s wait for the work issued so far on
// stream other, through event e: both in one call, so that nothing can
// be recorded on e between the two.
static CUresult ddp_cuWaitOther(ddp_lib *L, hnd ctx, hnd s, hnd other, hnd e) {
	SETCTX(ctx);
	CUresult r = F(cu_hh, cuEventRecord)(H(e), H(other)); if (r) return r;
	return F(cu_hhu, cuStreamWaitEvent)(H(s), H(e), 0);
}
// Device addresses reach Go as pointers (they are never dereferenced
// there; with unified addressing they lie outside Go's heap) so that they
// fit allocator.Region and comm.Buffer without integer-to-pointer casts.
static CUresult ddp_cuMemAlloc(ddp_lib *L, hnd ctx, size_t n, void **p) { SETCTX(ctx); CUdeviceptr d = 0; CUresult r = F(cu_alloc, cuMemAlloc_v2)(&d, n); *p = H(d); return r; }
static CUresult ddp_cuMemFree(ddp_lib *L, hnd ctx, CUdeviceptr p) { SETCTX(ctx); return F(cu_free, cuMemFree_v2)(p); }
static CUresult ddp_cuHtoD(ddp_lib *L, hnd ctx, CUdeviceptr d, uintptr_t h, size_t n, hnd s) { SETCTX(ctx); return F(cu_htod, cuMemcpyHtoDAsync_v2)(d, (const void *)h, n, H(s)); }
static CUresult ddp_cuDtoH(ddp_lib *L, hnd ctx, uintptr_t h, CUdeviceptr d, size_t n, hnd s) { SETCTX(ctx); return F(cu_dtoh, cuMemcpyDtoHAsync_v2)((void *)h, d, n, H(s)); }
static CUresult ddp_cuDtoD(ddp_lib *L, hnd ctx, CUdeviceptr d, CUdeviceptr src, size_t n, hnd s) { SETCTX(ctx); return F(cu_dtod, cuMemcpyAsync)(d, src, n, H(s)); }
static CUresult ddp_cuMemset(ddp_lib *L, hnd ctx, CUdeviceptr d, unsigned char v, size_t n, hnd s) { SETCTX(ctx); return F(cu_set8, cuMemsetD8Async)(d, v, n, H(s)); }
// Pinned host memory stages host buffers: copies between it and the
// device are asynchronous on a stream, which copies from pageable memory
// need not be.
static CUresult ddp_cuMemAllocHost(ddp_lib *L, hnd ctx, size_t n, void **p) { SETCTX(ctx); return F(cu_hostalloc, cuMemAllocHost_v2)(p, n); }
static CUresult ddp_cuMemFreeHost(ddp_lib *L, hnd ctx, void *p) { SETCTX(ctx); return F(cu_h, cuMemFreeHost)(p); }
static CUresult ddp_cuModuleLoad(ddp_lib *L, hnd ctx, const char *image, hnd *m) { SETCTX(ctx); CUmodule x = NULL; CUresult r = F(cu_load, cuModuleLoadData)(&x, image); *m = (hnd)x; return r; }
static CUresult ddp_cuModuleUnload(ddp_lib *L, hnd ctx, hnd m) { SETCTX(ctx); return F(cu_h, cuModuleUnload)(H(m)); }
static CUresult ddp_cuFunction(ddp_lib *L, hnd ctx, hnd m, const char *name, hnd *f) { SETCTX(ctx); CUfunction x = NULL; CUresult r = F(cu_getf, cuModuleGetFunction)(&x, H(m), name); *f = (hnd)x; return r; }

// Every kernel of kernels.ptx takes (u64, u64, u64, u64 n, f32 s).
static CUresult ddp_cuLaunch(ddp_lib *L, hnd ctx, hnd f, unsigned grid, unsigned block, hnd s,
	unsigned long long a0, unsigned long long a1, unsigned long long a2, unsigned long long n, float x) {
	SETCTX(ctx);
	void *params[5] = { &a0, &a1, &a2, &n, &x };
	return F(cu_launch, cuLaunchKernel)(H(f), grid, 1, 1, block, 1, 1, 0, H(s), params, NULL);
}

static ncclResult_t ddp_ncclGetVersion(ddp_lib *L, int *v) { return F(nc_pi, ncclGetVersion)(v); }
static const char *ddp_ncclErrString(ddp_lib *L, ncclResult_t r) { return F(nc_str, ncclGetErrorString)(r); }
static const char *ddp_ncclLastError(ddp_lib *L, hnd c) { return L->f[S_ncclGetLastError] ? F(nc_last, ncclGetLastError)(H(c)) : NULL; }
static ncclResult_t ddp_ncclUniqueId(ddp_lib *L, ncclUniqueId *id) { return F(nc_uid, ncclGetUniqueId)(id); }

static void ddp_config_init(ddp_config *c, int blocking) {
	memset(c, 0, sizeof *c);
	c->size = sizeof *c;           // 40: NCCL copies min(size, its own sizeof)
	c->magic = 0xcafebeef;         // NCCL_API_MAGIC
	c->version = 21700;            // NCCL_VERSION(2,17,0): the layout above
	c->blocking = blocking;
	c->cgaClusterSize = INT32_MIN; // NCCL_CONFIG_UNDEF_INT: NCCL's default
	c->minCTAs = INT32_MIN;
	c->maxCTAs = INT32_MIN;
	c->netName = NULL;             // NCCL_CONFIG_UNDEF_PTR
}

// ddp_ncclInit initializes n communicators of one clique in one call,
// inside ncclGroupStart/End when n > 1 (one thread may then drive several
// devices); NCCL's group state is per thread, so the whole group is one
// cgo call. ctxs[i] is current while comms[i] is created.
static ncclResult_t ddp_ncclInit(ddp_lib *L, int n, hnd *ctxs, hnd *comms, int nranks, const ncclUniqueId *id, const int *ranks, int blocking, int *failed) {
	ddp_config cfg;
	ncclResult_t r = 0, e = 0;
	*failed = -1;
	if (n > 1 && (r = F(nc_v, ncclGroupStart)())) return r;
	for (int i = 0; i < n; i++) {
		CUresult cr = F(cu_ctx, cuCtxSetCurrent)(H(ctxs[i]));
		if (cr) { *failed = i; r = DDP_CTXERR + cr; break; }
		ddp_config_init(&cfg, blocking);
		ncclComm_t c = NULL;
		r = F(nc_init, ncclCommInitRankConfig)(&c, nranks, *id, ranks[i], &cfg);
		comms[i] = (hnd)c;
		if (r != 0 && r != 7) { *failed = i; break; }
	}
	if (n > 1) {
		e = F(nc_v, ncclGroupEnd)();
		if (r == 0 || r == 7) r = e;
	}
	return r;
}

static ncclResult_t ddp_ncclAsyncError(ddp_lib *L, hnd c, ncclResult_t *state) { return F(nc_cr, ncclCommGetAsyncError)(H(c), state); }
static ncclResult_t ddp_ncclAbort(ddp_lib *L, hnd ctx, hnd c) { SETCTXN(ctx); return F(nc_c, ncclCommAbort)(H(c)); }
static ncclResult_t ddp_ncclDestroy(ddp_lib *L, hnd ctx, hnd c) { SETCTXN(ctx); return F(nc_c, ncclCommDestroy)(H(c)); }
static ncclResult_t ddp_ncclCount(ddp_lib *L, hnd c, int *n) { return F(nc_ci, ncclCommCount)(H(c), n); }
static ncclResult_t ddp_ncclUserRank(ddp_lib *L, hnd c, int *n) { return F(nc_ci, ncclCommUserRank)(H(c), n); }
static ncclResult_t ddp_ncclCuDevice(ddp_lib *L, hnd c, int *n) { return F(nc_ci, ncclCommCuDevice)(H(c), n); }
static ncclResult_t ddp_ncclMemAlloc(ddp_lib *L, hnd ctx, size_t n, void **p) { SETCTXN(ctx); return F(nc_memalloc, ncclMemAlloc)(p, n); }
static ncclResult_t ddp_ncclMemFree(ddp_lib *L, hnd ctx, uintptr_t p) { SETCTXN(ctx); return F(nc_memfree, ncclMemFree)(H(p)); }
static ncclResult_t ddp_ncclRegister(ddp_lib *L, hnd ctx, hnd c, uintptr_t p, size_t n, hnd *h) { SETCTXN(ctx); void *x = NULL; ncclResult_t r = F(nc_reg, ncclCommRegister)(H(c), H(p), n, &x); *h = (hnd)x; return r; }
static ncclResult_t ddp_ncclDeregister(ddp_lib *L, hnd ctx, hnd c, hnd h) { SETCTXN(ctx); return F(nc_dereg, ncclCommDeregister)(H(c), H(h)); }

// One operation of a launch: a copy that stages a host buffer, or an NCCL
// call. Addresses travel as integers.
typedef struct {
	int kind, dtype, op, peer;
	uint64_t send, recv, count;
} ddp_op;
enum { K_HTOD = 1, K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_SEND, K_RECV, K_DTOH, K_HOSTFN };

// ddp_hcopy is the argument of ddp_hostcopy, kept in pinned memory that
// stays the operation's until its event completes.
typedef struct { uint64_t dst, src, n; } ddp_hcopy;

// ddp_hostcopy runs on the driver's thread, in stream order
// (cuLaunchHostFunc), between pinned staging memory and the caller's host
// buffer. It calls no CUDA function, as host functions must not.
static void ddp_hostcopy(void *arg) {
	ddp_hcopy *h = arg;
	memcpy(H(h->dst), H(h->src), h->n);
}

static ncclResult_t ddp_one(ddp_lib *L, hnd c, hnd s, ddp_op *o) {
	const void *sb = H(o->send);
	void *rb = H(o->recv);
	switch (o->kind) {
	case K_HTOD: {
		CUresult r = F(cu_htod, cuMemcpyHtoDAsync_v2)((CUdeviceptr)o->recv, sb, o->count, H(s));
		return r ? DDP_CTXERR + r : 0;
	}
	case K_DTOH: {
		CUresult r = F(cu_dtoh, cuMemcpyDtoHAsync_v2)(rb, (CUdeviceptr)o->send, o->count, H(s));
		return r ? DDP_CTXERR + r : 0;
	}
	case K_HOSTFN: {
		CUresult r = F(cu_hostfn, cuLaunchHostFunc)(H(s), ddp_hostcopy, H(o->send));
		return r ? DDP_CTXERR + r : 0;
	}
	case K_ALLREDUCE: return F(nc_allreduce, ncclAllReduce)(sb, rb, o->count, o->dtype, o->op, H(c), H(s));
	case K_BROADCAST: return F(nc_bcast, ncclBroadcast)(sb, rb, o->count, o->dtype, o->peer, H(c), H(s));
	case K_REDUCE: return F(nc_reduce, ncclReduce)(sb, rb, o->count, o->dtype, o->op, o->peer, H(c), H(s));
	case K_ALLGATHER: return F(nc_allgather, ncclAllGather)(sb, rb, o->count, o->dtype, H(c), H(s));
	case K_REDUCESCATTER: return F(nc_allreduce, ncclReduceScatter)(sb, rb, o->count, o->dtype, o->op, H(c), H(s));
	case K_SEND: return F(nc_send, ncclSend)(sb, o->count, o->dtype, o->peer, H(c), H(s));
	case K_RECV: return F(nc_recv, ncclRecv)(rb, o->count, o->dtype, o->peer, H(c), H(s));
	}
	return 4; // ncclInvalidArgument
}

// ddp_launch issues n operations on stream s: copies that stage host
// buffers, then NCCL calls, inside one ncclGroupStart/End when group is
// set, all in this one call because NCCL's group state belongs to the
// calling thread. On success it issues the npost copies that bring staged
// results back and records the events (where not 0), so each event
// completes when its operation, copies included, has. *at is the index of
// the operation that failed. ncclInProgress (7) from a non-blocking
// communicator means NCCL is still enqueueing: the copies back and the
// events then wait for ddp_post, once ncclCommGetAsyncError reports
// success.
static ncclResult_t ddp_post(ddp_lib *L, hnd ctx, hnd s, ddp_op *post, int npost, hnd *events, int nev);

static ncclResult_t ddp_launch(ddp_lib *L, hnd ctx, hnd c, hnd s, ddp_op *ops, int n, ddp_op *post, int npost, hnd *events, int nev, int group, int *at) {
	SETCTXN(ctx);
	ncclResult_t r = 0, e;
	int grouped = 0;
	*at = -1;
	for (int i = 0; i < n; i++) {
		if (group && !grouped && ops[i].kind != K_HTOD && ops[i].kind != K_HOSTFN) {
			if ((r = F(nc_v, ncclGroupStart)())) return r;
			grouped = 1;
		}
		r = ddp_one(L, c, s, &ops[i]);
		if (r != 0 && r != 7) { *at = i; break; }
	}
	if (grouped) {
		e = F(nc_v, ncclGroupEnd)();
		if (r == 0 || r == 7) r = e;
	}
	if (r != 0) return r;
	return ddp_post(L, 0, s, post, npost, events, nev);
}

static ncclResult_t ddp_post(ddp_lib *L, hnd ctx, hnd s, ddp_op *post, int npost, hnd *events, int nev) {
	SETCTXN(ctx);
	for (int i = 0; i < npost; i++) {
		ncclResult_t r = ddp_one(L, 0, s, &post[i]);
		if (r) return r;
	}
	for (int i = 0; i < nev; i++) {
		if (!events[i]) continue;
		CUresult cr = F(cu_hh, cuEventRecord)(H(events[i]), H(s));
		if (cr) return DDP_CTXERR + cr;
	}
	return 0;
}
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
	d := &cdriver{t: C.ddp_new()}
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
		C.ddp_free(d.t)
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
