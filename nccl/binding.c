//go:build cgo

#include "binding.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define DDP_NAME(ver, req, name, ret, params) #name,
static const char *const sym_names[] = { DDP_CUDA_SYMS(DDP_NAME) DDP_NCCL_SYMS(DDP_NAME) };
#define DDP_LIB0(ver, req, name, ret, params) 0,
#define DDP_LIB1(ver, req, name, ret, params) 1,
static const int sym_lib[] = { DDP_CUDA_SYMS(DDP_LIB0) DDP_NCCL_SYMS(DDP_LIB1) };
#define DDP_VER(ver, req, name, ret, params) ver,
static const int sym_ver[] = { DDP_CUDA_SYMS(DDP_VER) DDP_NCCL_SYMS(DDP_VER) };
#define DDP_REQ(ver, req, name, ret, params) req,
static const int sym_req[] = { DDP_CUDA_SYMS(DDP_REQ) DDP_NCCL_SYMS(DDP_REQ) };

int ddp_nsyms(void) { return S_COUNT; }
const char *ddp_sym_name(int i) { return sym_names[i]; }
int ddp_sym_lib_of(int i) { return sym_lib[i]; }
int ddp_sym_ver_of(int i) { return sym_ver[i]; }
int ddp_sym_req_of(int i) { return sym_req[i]; }

ddp_lib *ddp_lib_new(void) { return calloc(1, sizeof(ddp_lib)); }
void ddp_lib_free(ddp_lib *L) { free(L); }
void ddp_set(ddp_lib *L, int i, void *p) { L->f[i] = p; }
int ddp_has(ddp_lib *L, int i) { return L->f[i] != NULL; }

// RTLD_NOW: every symbol the library itself needs is resolved at once, so
// a broken installation fails here, not in the middle of a collective.
void *ddp_dlopen(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		strncpy(err, e ? e : "unknown dlopen error", errlen - 1);
		err[errlen - 1] = 0;
	}
	return h;
}
void *ddp_dlsym(void *h, const char *name) { return dlsym(h, name); }
const char *ddp_standin(void *h) {
	const char *(*f)(void) = (const char *(*)(void))dlsym(h, "ddpgo_standin");
	return f ? f() : NULL;
}
void ddp_dlclose(void *h) { dlclose(h); }

// CALL(symbol) is the table's pointer for symbol, as its own type.
#define CALL(name) ((pfn_##name)L->f[S_##name])

// Every call that needs a context makes the caller's current first: a
// goroutine may run on any OS thread, and a CUDA context is current per
// thread, so the context travels with each call instead.
#define H(x) ((void *)(uintptr_t)(x))
#define SETCTX(ctx) do { if (ctx) { CUresult r_ = CALL(cuCtxSetCurrent)(H(ctx)); if (r_) return r_; } } while (0)
// An NCCL wrapper reports a failure to make the context current as
// DDP_CTXERR plus the CUDA result, apart from NCCL's own results.
#define SETCTXN(ctx) do { if (ctx) { CUresult r_ = CALL(cuCtxSetCurrent)(H(ctx)); if (r_) return DDP_CTXERR + r_; } } while (0)

CUresult ddp_cuInit(ddp_lib *L) { return CALL(cuInit)(0); }
CUresult ddp_cuDriverGetVersion(ddp_lib *L, int *v) { return CALL(cuDriverGetVersion)(v); }
const char *ddp_cuErrName(ddp_lib *L, CUresult r) { const char *s = NULL; if (CALL(cuGetErrorName)(r, &s)) return NULL; return s; }
const char *ddp_cuErrString(ddp_lib *L, CUresult r) { const char *s = NULL; if (CALL(cuGetErrorString)(r, &s)) return NULL; return s; }
CUresult ddp_cuDeviceGetCount(ddp_lib *L, int *n) { return CALL(cuDeviceGetCount)(n); }
CUresult ddp_cuDeviceName(ddp_lib *L, int ordinal, char *name, int len) {
	CUdevice d; CUresult r = CALL(cuDeviceGet)(&d, ordinal); if (r) return r;
	return CALL(cuDeviceGetName)(name, len, d);
}
CUresult ddp_cuDeviceAttr(ddp_lib *L, int ordinal, int attr, int *v) {
	CUdevice d; CUresult r = CALL(cuDeviceGet)(&d, ordinal); if (r) return r;
	return CALL(cuDeviceGetAttribute)(v, attr, d);
}
CUresult ddp_cuRetain(ddp_lib *L, int ordinal, hnd *ctx) {
	CUdevice d; CUresult r = CALL(cuDeviceGet)(&d, ordinal); if (r) return r;
	CUcontext c = NULL; r = CALL(cuDevicePrimaryCtxRetain)(&c, d); *ctx = (hnd)c; return r;
}
CUresult ddp_cuRelease(ddp_lib *L, int ordinal) {
	CUdevice d; CUresult r = CALL(cuDeviceGet)(&d, ordinal); if (r) return r;
	return CALL(cuDevicePrimaryCtxRelease_v2)(d);
}
// CU_STREAM_NON_BLOCKING: no implicit ordering with the legacy default
// stream, so other work of the process cannot delay collectives.
CUresult ddp_cuStreamCreate(ddp_lib *L, hnd ctx, hnd *s) { SETCTX(ctx); CUstream x = NULL; CUresult r = CALL(cuStreamCreate)(&x, DDP_CU_STREAM_NON_BLOCKING); *s = (hnd)x; return r; }
CUresult ddp_cuStreamDestroy(ddp_lib *L, hnd ctx, hnd s) { SETCTX(ctx); return CALL(cuStreamDestroy_v2)(H(s)); }
CUresult ddp_cuStreamQuery(ddp_lib *L, hnd ctx, hnd s) { SETCTX(ctx); return CALL(cuStreamQuery)(H(s)); }
CUresult ddp_cuStreamSync(ddp_lib *L, hnd ctx, hnd s) { SETCTX(ctx); return CALL(cuStreamSynchronize)(H(s)); }
CUresult ddp_cuStreamWaitEvent(ddp_lib *L, hnd ctx, hnd s, hnd e) { SETCTX(ctx); return CALL(cuStreamWaitEvent)(H(s), H(e), 0); }
// CU_EVENT_DISABLE_TIMING: the cheapest event to record and query.
CUresult ddp_cuEventCreate(ddp_lib *L, hnd ctx, hnd *e) { SETCTX(ctx); CUevent x = NULL; CUresult r = CALL(cuEventCreate)(&x, DDP_CU_EVENT_DISABLE_TIMING); *e = (hnd)x; return r; }
CUresult ddp_cuEventDestroy(ddp_lib *L, hnd ctx, hnd e) { SETCTX(ctx); return CALL(cuEventDestroy_v2)(H(e)); }
CUresult ddp_cuEventRecord(ddp_lib *L, hnd ctx, hnd e, hnd s) { SETCTX(ctx); return CALL(cuEventRecord)(H(e), H(s)); }
CUresult ddp_cuEventQuery(ddp_lib *L, hnd ctx, hnd e) { SETCTX(ctx); return CALL(cuEventQuery)(H(e)); }
// ddp_cuWaitOther makes stream s wait for the work issued so far on
// stream other, through event e: both in one call, so that nothing can
// be recorded on e between the two.
CUresult ddp_cuWaitOther(ddp_lib *L, hnd ctx, hnd s, hnd other, hnd e) {
	SETCTX(ctx);
	CUresult r = CALL(cuEventRecord)(H(e), H(other)); if (r) return r;
	return CALL(cuStreamWaitEvent)(H(s), H(e), 0);
}
// Device addresses reach Go as pointers (they are never dereferenced
// there; with unified addressing they lie outside Go's heap) so that they
// fit allocator.Region and comm.Buffer without integer-to-pointer casts.
CUresult ddp_cuMemAlloc(ddp_lib *L, hnd ctx, size_t n, void **p) { SETCTX(ctx); CUdeviceptr d = 0; CUresult r = CALL(cuMemAlloc_v2)(&d, n); *p = H(d); return r; }
CUresult ddp_cuMemFree(ddp_lib *L, hnd ctx, CUdeviceptr p) { SETCTX(ctx); return CALL(cuMemFree_v2)(p); }
CUresult ddp_cuHtoD(ddp_lib *L, hnd ctx, CUdeviceptr d, uintptr_t h, size_t n, hnd s) { SETCTX(ctx); return CALL(cuMemcpyHtoDAsync_v2)(d, (const void *)h, n, H(s)); }
CUresult ddp_cuDtoH(ddp_lib *L, hnd ctx, uintptr_t h, CUdeviceptr d, size_t n, hnd s) { SETCTX(ctx); return CALL(cuMemcpyDtoHAsync_v2)((void *)h, d, n, H(s)); }
CUresult ddp_cuDtoD(ddp_lib *L, hnd ctx, CUdeviceptr d, CUdeviceptr src, size_t n, hnd s) { SETCTX(ctx); return CALL(cuMemcpyAsync)(d, src, n, H(s)); }
CUresult ddp_cuMemset(ddp_lib *L, hnd ctx, CUdeviceptr d, unsigned char v, size_t n, hnd s) { SETCTX(ctx); return CALL(cuMemsetD8Async)(d, v, n, H(s)); }
// Pinned host memory stages host buffers: copies between it and the
// device are asynchronous on a stream, which copies from pageable memory
// need not be.
CUresult ddp_cuMemAllocHost(ddp_lib *L, hnd ctx, size_t n, void **p) { SETCTX(ctx); return CALL(cuMemAllocHost_v2)(p, n); }
CUresult ddp_cuMemFreeHost(ddp_lib *L, hnd ctx, void *p) { SETCTX(ctx); return CALL(cuMemFreeHost)(p); }
CUresult ddp_cuModuleLoad(ddp_lib *L, hnd ctx, const char *image, hnd *m) { SETCTX(ctx); CUmodule x = NULL; CUresult r = CALL(cuModuleLoadData)(&x, image); *m = (hnd)x; return r; }
CUresult ddp_cuModuleUnload(ddp_lib *L, hnd ctx, hnd m) { SETCTX(ctx); return CALL(cuModuleUnload)(H(m)); }
CUresult ddp_cuFunction(ddp_lib *L, hnd ctx, hnd m, const char *name, hnd *f) { SETCTX(ctx); CUfunction x = NULL; CUresult r = CALL(cuModuleGetFunction)(&x, H(m), name); *f = (hnd)x; return r; }

// Every kernel of kernels.ptx takes (u64, u64, u64, u64 n, f32 s).
CUresult ddp_cuLaunch(ddp_lib *L, hnd ctx, hnd f, unsigned grid, unsigned block, hnd s,
	unsigned long long a0, unsigned long long a1, unsigned long long a2, unsigned long long n, float x) {
	SETCTX(ctx);
	void *params[5] = { &a0, &a1, &a2, &n, &x };
	return CALL(cuLaunchKernel)(H(f), grid, 1, 1, block, 1, 1, 0, H(s), params, NULL);
}

ncclResult_t ddp_ncclGetVersion(ddp_lib *L, int *v) { return CALL(ncclGetVersion)(v); }
const char *ddp_ncclErrString(ddp_lib *L, ncclResult_t r) { return CALL(ncclGetErrorString)(r); }
const char *ddp_ncclLastError(ddp_lib *L, hnd c) { return L->f[S_ncclGetLastError] ? CALL(ncclGetLastError)(H(c)) : NULL; }
ncclResult_t ddp_ncclUniqueId(ddp_lib *L, ncclUniqueId *id) { return CALL(ncclGetUniqueId)(id); }

static void ddp_config_init(ddp_config *c, int blocking) {
	memset(c, 0, sizeof *c);
	c->size = sizeof *c;                       // 40: NCCL copies min(size, its own sizeof)
	c->magic = DDP_NCCL_API_MAGIC;
	c->version = DDP_NCCL_CONFIG_VERSION;      // the layout of ddp_config
	c->blocking = blocking;
	c->cgaClusterSize = DDP_NCCL_CONFIG_UNDEF_INT; // NCCL's default
	c->minCTAs = DDP_NCCL_CONFIG_UNDEF_INT;
	c->maxCTAs = DDP_NCCL_CONFIG_UNDEF_INT;
	c->netName = NULL;                         // NCCL_CONFIG_UNDEF_PTR
}

// ddp_ncclInit initializes n communicators of one clique in one call,
// inside ncclGroupStart/End when n > 1 (one thread may then drive several
// devices); NCCL's group state is per thread, so the whole group is one
// cgo call. ctxs[i] is current while comms[i] is created.
ncclResult_t ddp_ncclInit(ddp_lib *L, int n, hnd *ctxs, hnd *comms, int nranks, const ncclUniqueId *id, const int *ranks, int blocking, int *failed) {
	ddp_config cfg;
	ncclResult_t r = 0, e = 0;
	*failed = -1;
	if (n > 1 && (r = CALL(ncclGroupStart)())) return r;
	for (int i = 0; i < n; i++) {
		CUresult cr = CALL(cuCtxSetCurrent)(H(ctxs[i]));
		if (cr) { *failed = i; r = DDP_CTXERR + cr; break; }
		ddp_config_init(&cfg, blocking);
		ncclComm_t c = NULL;
		r = CALL(ncclCommInitRankConfig)(&c, nranks, *id, ranks[i], &cfg);
		comms[i] = (hnd)c;
		if (r != DDP_NCCL_SUCCESS && r != DDP_NCCL_IN_PROGRESS) { *failed = i; break; }
	}
	if (n > 1) {
		e = CALL(ncclGroupEnd)();
		if (r == DDP_NCCL_SUCCESS || r == DDP_NCCL_IN_PROGRESS) r = e;
	}
	return r;
}

ncclResult_t ddp_ncclAsyncError(ddp_lib *L, hnd c, ncclResult_t *state) { return CALL(ncclCommGetAsyncError)(H(c), state); }
ncclResult_t ddp_ncclAbort(ddp_lib *L, hnd ctx, hnd c) { SETCTXN(ctx); return CALL(ncclCommAbort)(H(c)); }
ncclResult_t ddp_ncclDestroy(ddp_lib *L, hnd ctx, hnd c) { SETCTXN(ctx); return CALL(ncclCommDestroy)(H(c)); }
ncclResult_t ddp_ncclCount(ddp_lib *L, hnd c, int *n) { return CALL(ncclCommCount)(H(c), n); }
ncclResult_t ddp_ncclUserRank(ddp_lib *L, hnd c, int *n) { return CALL(ncclCommUserRank)(H(c), n); }
ncclResult_t ddp_ncclCuDevice(ddp_lib *L, hnd c, int *n) { return CALL(ncclCommCuDevice)(H(c), n); }
ncclResult_t ddp_ncclMemAlloc(ddp_lib *L, hnd ctx, size_t n, void **p) { SETCTXN(ctx); return CALL(ncclMemAlloc)(p, n); }
ncclResult_t ddp_ncclMemFree(ddp_lib *L, hnd ctx, uintptr_t p) { SETCTXN(ctx); return CALL(ncclMemFree)(H(p)); }
ncclResult_t ddp_ncclRegister(ddp_lib *L, hnd ctx, hnd c, uintptr_t p, size_t n, hnd *h) { SETCTXN(ctx); void *x = NULL; ncclResult_t r = CALL(ncclCommRegister)(H(c), H(p), n, &x); *h = (hnd)x; return r; }
ncclResult_t ddp_ncclDeregister(ddp_lib *L, hnd ctx, hnd c, hnd h) { SETCTXN(ctx); return CALL(ncclCommDeregister)(H(c), H(h)); }

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
		CUresult r = CALL(cuMemcpyHtoDAsync_v2)((CUdeviceptr)o->recv, sb, o->count, H(s));
		return r ? DDP_CTXERR + r : 0;
	}
	case K_DTOH: {
		CUresult r = CALL(cuMemcpyDtoHAsync_v2)(rb, (CUdeviceptr)o->send, o->count, H(s));
		return r ? DDP_CTXERR + r : 0;
	}
	case K_HOSTFN: {
		CUresult r = CALL(cuLaunchHostFunc)(H(s), ddp_hostcopy, H(o->send));
		return r ? DDP_CTXERR + r : 0;
	}
	case K_ALLREDUCE: return CALL(ncclAllReduce)(sb, rb, o->count, o->dtype, o->op, H(c), H(s));
	case K_BROADCAST: return CALL(ncclBroadcast)(sb, rb, o->count, o->dtype, o->peer, H(c), H(s));
	case K_REDUCE: return CALL(ncclReduce)(sb, rb, o->count, o->dtype, o->op, o->peer, H(c), H(s));
	case K_ALLGATHER: return CALL(ncclAllGather)(sb, rb, o->count, o->dtype, H(c), H(s));
	case K_REDUCESCATTER: return CALL(ncclReduceScatter)(sb, rb, o->count, o->dtype, o->op, H(c), H(s));
	case K_SEND: return CALL(ncclSend)(sb, o->count, o->dtype, o->peer, H(c), H(s));
	case K_RECV: return CALL(ncclRecv)(rb, o->count, o->dtype, o->peer, H(c), H(s));
	}
	return DDP_NCCL_INVALID_ARGUMENT;
}

ncclResult_t ddp_launch(ddp_lib *L, hnd ctx, hnd c, hnd s, ddp_op *ops, int n, ddp_op *post, int npost, hnd *events, int nev, int group, int *at) {
	SETCTXN(ctx);
	ncclResult_t r = 0, e;
	int grouped = 0;
	*at = -1;
	for (int i = 0; i < n; i++) {
		if (group && !grouped && ops[i].kind != K_HTOD && ops[i].kind != K_HOSTFN) {
			if ((r = CALL(ncclGroupStart)())) return r;
			grouped = 1;
		}
		r = ddp_one(L, c, s, &ops[i]);
		if (r != DDP_NCCL_SUCCESS && r != DDP_NCCL_IN_PROGRESS) { *at = i; break; }
	}
	if (grouped) {
		e = CALL(ncclGroupEnd)();
		if (r == DDP_NCCL_SUCCESS || r == DDP_NCCL_IN_PROGRESS) r = e;
	}
	if (r != 0) return r;
	return ddp_post(L, 0, s, post, npost, events, nev);
}

ncclResult_t ddp_post(ddp_lib *L, hnd ctx, hnd s, ddp_op *post, int npost, hnd *events, int nev) {
	SETCTXN(ctx);
	for (int i = 0; i < npost; i++) {
		ncclResult_t r = ddp_one(L, 0, s, &post[i]);
		if (r) return r;
	}
	for (int i = 0; i < nev; i++) {
		if (!events[i]) continue;
		CUresult cr = CALL(cuEventRecord)(H(events[i]), H(s));
		if (cr) return DDP_CTXERR + cr;
	}
	return 0;
}
