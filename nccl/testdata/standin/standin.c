/*
 * A stand-in for libnccl.so.2 and libcuda.so.1, for testing ddpgo's binding
 * on a machine without a GPU. It is NOT NCCL and NOT CUDA, and nothing
 * measured over it says anything about a GPU.
 *
 * One shared object exports the subset of both ABIs that package nccl
 * uses (declared as in NCCL's src/nccl.h.in, 2.17 config layout, and
 * CUDA 12.6's cuda.h, _v2 names where cuda.h maps to them), so the tests
 * load it under both names. "Device" memory is host memory. A stream is a
 * worker thread running its queue in order; an event completes when the
 * stream reaches it; cuStreamWaitEvent holds a stream until an event of
 * another stream completes. Collectives run across the communicators of
 * one process that share a unique id: each rank's stream thread arrives at
 * the collective, waits for the others, computes its own result from all
 * inputs, waits again, and writes it. Kernels cannot run: PTX is only
 * scanned for its entry points and their parameter lists, and a launch
 * runs a C emulation chosen by the kernel's name, which checks how the
 * binding marshals arguments, not the PTX.
 *
 * It follows the completion rule of the NCCL that DDPGO_STANDIN_NCCL
 * names by version when it is loaded ("2.25", "2.26.6"; see model). From
 * 2.23 on, on a non-blocking communicator of more than one rank, every
 * enqueue (a collective, or a group's ncclGroupEnd) starts a group job on
 * a thread of its own and answers ncclInProgress; the job puts the
 * operations on their streams a little later. Then:
 *   2.23-2.25 ("2.25"): ncclCommGetAsyncError reports ncclSuccess once
 *     the job has enqueued, without joining it; the communicator's next
 *     call (ncclCommEnsureReady: a collective, ncclGroupEnd,
 *     ncclCommCount, ...) joins it, from whatever thread makes it, and
 *     clears the launching thread's storage.
 *   2.26 ("2.26", the default): ncclCommGetAsyncError joins the job before
 *     it reports ncclSuccess.
 *   In both the job lives in the launching thread's storage
 *   (ncclGroupJobMain is __thread up to 2.26), so a second group launched
 *   from the same thread before the first is joined loses the first.
 *   2.27 and newer ("2.28"): as 2.26, but the job is no longer kept in the
 *     thread's storage.
 * Up to 2.22 ("2.21") a launch enqueues at once. One-rank collectives run
 * at once in every mode, as NCCL 2.19 and newer launch them.
 *
 * Where real NCCL would hang, corrupt or fail in ways a test cannot see,
 * the stand-in records a violation (standin_violations) and prints it:
 * two threads in one communicator at once, a call after
 * ncclCommDestroy/Abort, a communicator used or its stream given CUDA work
 * while its enqueue is still ncclInProgress, a thread's group job
 * overwritten, a deregistration on a failed communicator, a communicator
 * aborted with another device's context current, memory freed while work
 * queued on a stream still uses it, a DDPGO_STANDIN_NCCL that names no
 * version (standin_model). Package nccl's tests fail on any violation.
 *
 * Tests steer it through the standin_* functions: ncclInProgress from
 * non-blocking calls, an asynchronous error, a rank that stalls, failures
 * of stream creation, and counters of live allocations, registrations,
 * launches and their group sizes, communicator and stream flags.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- CUDA driver ABI (cuda.h, CUDA 12.6) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_LAUNCH_FAILED = 719,
};

/* ---- NCCL ABI (src/nccl.h.in) ---- */
typedef int ncclResult_t;
enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
};
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
enum {
	ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4,
	ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
};
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
} ncclConfig_v21700;

/* The NCCL it claims to be: see model. */
static int standin_version = 22606; /* 2.26.6 */
#define STANDIN_DRIVER 12060  /* claims CUDA 12.6 */
#define MAX_DEV 16

/* ---- global state ---- */
static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gcv = PTHREAD_COND_INITIALIZER; /* events, groups, mailboxes */
static int initialized;
static int ndevices = 4;
static long live_dev_allocs, live_nccl_allocs, kernel_launches;

typedef struct ctx { int dev; int refs; } ctx_t;
static ctx_t ctxs[MAX_DEV];
static __thread ctx_t *cur;

static void lock(void) { pthread_mutex_lock(&gmu); }
static void unlock(void) { pthread_mutex_unlock(&gmu); }

/* model: which NCCL's completion rule the stand-in follows (see the top),
 * chosen by DDPGO_STANDIN_NCCL when it is loaded. async_mode: every
 * enqueue of a non-blocking communicator of several ranks goes through a
 * group job and answers ncclInProgress (2.23 and newer). */
enum {
	M_IMMEDIATE = 21, /* 2.14-2.22: launches enqueue at once */
	M_LAZY = 25,      /* 2.23-2.25: the job joined by the communicator's next call */
	M_JOIN = 26,      /* 2.26: ncclCommGetAsyncError joins the job */
	M_HEAP = 27,      /* 2.27 and newer: the job is no longer thread-local */
};
static int model = M_JOIN;
static int async_mode = 1;
static int job_delay_us = 100; /* how long a group job takes to enqueue */
static char bad_model[64];     /* a DDPGO_STANDIN_NCCL that names no model */

/* The patch release each minor version claims, as NCCL tagged them. */
static int patch_of(int minor) {
	switch (minor) {
	case 21: return 5;
	case 22: return 3;
	case 23: return 4;
	case 24: return 3;
	case 25: return 1;
	case 26: return 6;
	case 27: return 7;
	case 28: return 9;
	}
	return 1;
}

__attribute__((constructor)) static void standin_load(void) {
	const char *v = getenv("DDPGO_STANDIN_NCCL");
	if (!v || !*v)
		return;
	int major = 0, minor = 0, patch = -1;
	char tail;
	int n = sscanf(v, "%d.%d.%d%c", &major, &minor, &patch, &tail);
	if (n < 2 || n > 3 || major != 2 || minor < 14 || minor > 99 || (n == 3 && (patch < 0 || patch > 99))) {
		snprintf(bad_model, sizeof bad_model, "%.40s", v);
		return;
	}
	if (n == 2)
		patch = patch_of(minor);
	standin_version = 20000 + minor * 100 + patch;
	model = minor <= 22 ? M_IMMEDIATE : minor <= 25 ? M_LAZY : minor == 26 ? M_JOIN : M_HEAP;
	async_mode = model != M_IMMEDIATE;
}

/* thread_local_jobs: NCCL 2.14-2.26 keep the group job in the launching
 * thread's storage (ncclGroupJobMain is __thread in src/group.cc). */
static int thread_local_jobs(void) { return model == M_LAZY || model == M_JOIN; }

/* ---- violations: what real NCCL would not survive ---- */
#define MAXVIOL 64
static pthread_mutex_t vmu = PTHREAD_MUTEX_INITIALIZER;
static char violations[MAXVIOL][320];
static int nviol;

__attribute__((format(printf, 1, 2))) static void violation(const char *fmt, ...) {
	char msg[320];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&vmu);
	if (nviol < MAXVIOL)
		snprintf(violations[nviol], sizeof violations[nviol], "%s", msg);
	nviol++;
	pthread_mutex_unlock(&vmu);
	fprintf(stderr, "stand-in: VIOLATION: %s\n", msg);
}

EXPORT int standin_violations(void) {
	pthread_mutex_lock(&vmu);
	int n = nviol;
	pthread_mutex_unlock(&vmu);
	return n;
}

EXPORT const char *standin_violation(int i) {
	pthread_mutex_lock(&vmu);
	const char *m = i >= 0 && i < nviol && i < MAXVIOL ? violations[i] : "";
	pthread_mutex_unlock(&vmu);
	return m;
}

/* ---- streams ---- */
struct comm;
typedef struct op {
	int kind;
	struct op *next;
	void *dst;
	const void *src;
	size_t n;
	int byte;
	struct event *ev;
	unsigned long long gen;
	/* collectives */
	struct comm *comm;
	int coll, dtype, redop, root;
	size_t count;
	/* host functions */
	void (*fn)(void *);
	/* kernels */
	int kernel;
	unsigned long long a[4];
	float s;
} op_t;

enum { OP_COPY = 1, OP_SET, OP_RECORD, OP_WAIT, OP_COLL, OP_KERNEL, OP_HOSTFN, OP_STOP };

typedef struct stream {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	op_t *head, *tail;
	int busy;
	int dev;
	unsigned flags; /* cuStreamCreate's */
	struct stream *next; /* every live stream, guarded by gmu */
} stream_t;

static stream_t *streams;

typedef struct event {
	unsigned long long recorded, done;
	int dev;
	int destroyed; /* freed when its last record completes */
} event_t;

static void run_op(stream_t *s, op_t *o);
static void run_gate(op_t *o);
static void busy_stream(stream_t *s, const char *fn);

static void *stream_main(void *arg) {
	stream_t *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->head)
			pthread_cond_wait(&s->cv, &s->mu);
		op_t *o = s->head;
		s->busy = 1;
		pthread_mutex_unlock(&s->mu);
		int stop = o->kind == OP_STOP;
		if (!stop)
			run_op(s, o);
		pthread_mutex_lock(&s->mu);
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		s->busy = 0;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		free(o);
		if (stop) {
			/* Destroyed: the queue before the stop has run. */
			lock();
			for (stream_t **q = &streams; *q; q = &(*q)->next)
				if (*q == s) {
					*q = s->next;
					break;
				}
			unlock();
			pthread_mutex_destroy(&s->mu);
			pthread_cond_destroy(&s->cv);
			free(s);
			return NULL;
		}
	}
}

static void enqueue(stream_t *s, op_t *o) {
	o->next = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static op_t *newop(int kind) {
	op_t *o = calloc(1, sizeof *o);
	o->kind = kind;
	return o;
}

#define NEED_CTX() do { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; if (!cur) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

EXPORT CUresult cuInit(unsigned int flags) {
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	initialized = 1;
	unlock();
	return ndevices > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = STANDIN_DRIVER;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
	switch (r) {
	case CUDA_SUCCESS: *s = "no error"; break;
	case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
	case CUDA_ERROR_NOT_INITIALIZED: *s = "initialization error"; break;
	case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
	case CUDA_ERROR_INVALID_DEVICE: *s = "invalid device ordinal"; break;
	case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; break;
	case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; break;
	case CUDA_ERROR_INVALID_HANDLE: *s = "invalid resource handle"; break;
	case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
	case CUDA_ERROR_NOT_READY: *s = "device not ready"; break;
	default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
	switch (r) {
	case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
	case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
	case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
	case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
	case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
	case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
	case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
	case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
	case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
	case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
	default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*n = ndevices;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0 || d >= ndevices || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, len, "stand-in device %d (not a GPU)", d);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0 || d >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attr) {
	case 75: *v = 9; return CUDA_SUCCESS; /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
	case 76: *v = 0; return CUDA_SUCCESS; /* ..._MINOR */
	}
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(void **pctx, CUdevice d) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0 || d >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	lock();
	ctxs[d].dev = d;
	ctxs[d].refs++;
	unlock();
	*pctx = &ctxs[d];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	if (d < 0 || d >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	lock();
	int ok = ctxs[d].refs > 0;
	if (ok)
		ctxs[d].refs--;
	unlock();
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuCtxSetCurrent(void *c) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	ctx_t *x = c;
	if (x && (x < ctxs || x >= ctxs + MAX_DEV || x->refs == 0))
		return CUDA_ERROR_INVALID_CONTEXT;
	cur = x;
	return CUDA_SUCCESS;
}

static int fail_stream_create; /* the nth next cuStreamCreate fails */

EXPORT CUresult cuStreamCreate(stream_t **ps, unsigned int flags) {
	NEED_CTX();
	if (flags > 1)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	int fail = fail_stream_create > 0 && --fail_stream_create == 0;
	unlock();
	if (fail)
		return CUDA_ERROR_OUT_OF_MEMORY;
	stream_t *s = calloc(1, sizeof *s);
	s->flags = flags;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->dev = cur->dev;
	pthread_create(&s->th, NULL, stream_main, s);
	lock();
	s->next = streams;
	streams = s;
	unlock();
	*ps = s;
	return CUDA_SUCCESS;
}

static int stream_idle(stream_t *s) { return !s->head && !s->busy; }

EXPORT CUresult cuStreamSynchronize(stream_t *s) {
	NEED_CTX();
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	while (!stream_idle(s))
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamQuery(stream_t *s) {
	NEED_CTX();
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	int idle = stream_idle(s);
	pthread_mutex_unlock(&s->mu);
	return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* cuStreamDestroy returns at once and the stream's work still completes,
 * as in CUDA: the thread stops, and frees the stream, once its queue has
 * run. */
EXPORT CUresult cuStreamDestroy_v2(stream_t *s) {
	NEED_CTX();
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_detach(s->th);
	enqueue(s, newop(OP_STOP));
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(event_t **pe, unsigned int flags) {
	NEED_CTX();
	if (flags & ~0x7u)
		return CUDA_ERROR_INVALID_VALUE;
	event_t *e = calloc(1, sizeof *e);
	e->dev = cur->dev;
	*pe = e;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(event_t *e) {
	NEED_CTX();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	/* CUDA defers the release until the event completes: the pending
	 * record frees it. */
	lock();
	int pending = e->done < e->recorded;
	e->destroyed = 1;
	unlock();
	if (!pending)
		free(e);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(event_t *e, stream_t *s) {
	NEED_CTX();
	if (!e || !s)
		return CUDA_ERROR_INVALID_HANDLE;
	busy_stream(s, "cuEventRecord");
	op_t *o = newop(OP_RECORD);
	o->ev = e;
	lock();
	o->gen = ++e->recorded;
	unlock();
	enqueue(s, o);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(event_t *e) {
	NEED_CTX();
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	lock();
	int done = e->done >= e->recorded;
	unlock();
	return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuStreamWaitEvent(stream_t *s, event_t *e, unsigned int flags) {
	NEED_CTX();
	if (!e || !s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	busy_stream(s, "cuStreamWaitEvent");
	op_t *o = newop(OP_WAIT);
	o->ev = e;
	lock();
	o->gen = e->recorded; /* the event's state now, as in CUDA */
	unlock();
	enqueue(s, o);
	return CUDA_SUCCESS;
}

/* Device memory is host memory, 512-byte aligned as cuMemAlloc's is. */
/* ---- memory still in use by a stream ----
 * Every allocation is remembered with its size, so that freeing it while
 * an operation queued on a stream (or held for a group job) still reads
 * or writes it is a violation: CUDA would block in the free, or the work
 * would write freed memory. Such memory is then leaked, not freed. */
typedef struct alloc { char *p; size_t n; struct alloc *next; } alloc_t;
static alloc_t *allocs;

static void remember(void *p, size_t n) {
	alloc_t *a = malloc(sizeof *a);
	a->p = p;
	a->n = n;
	lock();
	a->next = allocs;
	allocs = a;
	unlock();
}

static int in_range(unsigned long long x, const char *lo, size_t n) {
	return x >= (uintptr_t)lo && x < (uintptr_t)lo + n;
}

static int overlaps(const void *p, size_t len, const char *lo, size_t n) {
	return p && (uintptr_t)p < (uintptr_t)lo + n && (uintptr_t)p + (len ? len : 1) > (uintptr_t)lo;
}

static size_t dsize(int dt);

/* op_uses reports whether o reads or writes [lo, lo+n). */
static int op_uses(const op_t *o, const char *lo, size_t n) {
	switch (o->kind) {
	case OP_COPY:
		return overlaps(o->dst, o->n, lo, n) || overlaps(o->src, o->n, lo, n);
	case OP_SET:
		return overlaps(o->dst, o->n, lo, n);
	case OP_HOSTFN:
		return in_range((uintptr_t)o->dst, lo, n);
	case OP_KERNEL:
		return in_range(o->a[0], lo, n) || in_range(o->a[1], lo, n) || in_range(o->a[2], lo, n);
	case OP_COLL: {
		size_t b = o->count * dsize(o->dtype);
		return overlaps(o->src, b, lo, n) || overlaps(o->dst, b, lo, n);
	}
	}
	return 0;
}

static const op_t *held_use(const char *lo, size_t n);

/* release_alloc forgets p and reports whether it may be freed: not if
 * queued work still uses it. */
static int release_alloc(void *p, const char *fn) {
	lock();
	size_t n = 0;
	for (alloc_t **q = &allocs; *q; q = &(*q)->next)
		if ((*q)->p == p) {
			alloc_t *a = *q;
			n = a->n;
			*q = a->next;
			free(a);
			break;
		}
	int used = 0;
	for (stream_t *s = streams; s && n && !used; s = s->next) {
		pthread_mutex_lock(&s->mu);
		for (op_t *o = s->head; o && !used; o = o->next)
			used = op_uses(o, p, n);
		pthread_mutex_unlock(&s->mu);
	}
	if (n && !used)
		used = held_use(p, n) != NULL;
	unlock();
	if (used)
		violation("%s of %zu bytes at %p while work queued on a stream still uses them", fn, n, p);
	return !used;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	void *m = aligned_alloc(512, (n + 511) / 512 * 512);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	memset(m, 0xa5, n); /* device memory is not zeroed */
	remember(m, n);
	lock();
	live_dev_allocs++;
	unlock();
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	if (release_alloc((void *)(uintptr_t)p, "cuMemFree"))
		free((void *)(uintptr_t)p);
	lock();
	live_dev_allocs--;
	unlock();
	return CUDA_SUCCESS;
}

static CUresult copy_async(void *dst, const void *src, size_t n, stream_t *s) {
	NEED_CTX();
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	busy_stream(s, "cuMemcpyAsync");
	if (n && (!dst || !src))
		return CUDA_ERROR_INVALID_VALUE;
	op_t *o = newop(OP_COPY);
	o->dst = dst;
	o->src = src;
	o->n = n;
	enqueue(s, o);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, stream_t *s) {
	return copy_async((void *)(uintptr_t)dst, src, n, s);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, stream_t *s) {
	return copy_async(dst, (const void *)(uintptr_t)src, n, s);
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, stream_t *s) {
	return copy_async((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, s);
}

static long live_host_allocs;

EXPORT CUresult cuMemAllocHost_v2(void **p, size_t n) {
	NEED_CTX();
	if (!p || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	*p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
	if (!*p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	remember(*p, n);
	lock();
	live_host_allocs++;
	unlock();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p) {
	NEED_CTX();
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	if (release_alloc(p, "cuMemFreeHost"))
		free(p);
	lock();
	live_host_allocs--;
	unlock();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchHostFunc(stream_t *s, void (*fn)(void *), void *arg) {
	NEED_CTX();
	if (!s || !fn)
		return CUDA_ERROR_INVALID_VALUE;
	busy_stream(s, "cuLaunchHostFunc");
	op_t *o = newop(OP_HOSTFN);
	o->fn = fn;
	o->dst = arg;
	enqueue(s, o);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, stream_t *s) {
	NEED_CTX();
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	busy_stream(s, "cuMemsetD8Async");
	op_t *o = newop(OP_SET);
	o->dst = (void *)(uintptr_t)dst;
	o->byte = v;
	o->n = n;
	enqueue(s, o);
	return CUDA_SUCCESS;
}

/* ---- modules and kernels ---- */
enum { K_SCALE = 1, K_ADD, K_COMPRESS_F16, K_COMPRESS_BF16, K_DECOMPRESS_F16, K_DECOMPRESS_BF16, K_OVERFLOWS_F16, K_OVERFLOWS_BF16 };
static const char *knames[] = {
	[K_SCALE] = "ddpgo_scale_f32",
	[K_ADD] = "ddpgo_add_f32",
	[K_COMPRESS_F16] = "ddpgo_compress_f16",
	[K_COMPRESS_BF16] = "ddpgo_compress_bf16",
	[K_DECOMPRESS_F16] = "ddpgo_decompress_f16",
	[K_DECOMPRESS_BF16] = "ddpgo_decompress_bf16",
	[K_OVERFLOWS_F16] = "ddpgo_overflows_f16",
	[K_OVERFLOWS_BF16] = "ddpgo_overflows_bf16",
};
#define NKERNELS 9

typedef struct module { char *ptx; } module_t;
typedef struct function { module_t *m; int kernel; } function_t;

/* The binding launches every kernel with the parameters (u64, u64, u64,
 * u64, f32); entry_ok checks that the PTX declares exactly that list. */
static int entry_ok(const char *ptx, const char *name) {
	char pat[128];
	snprintf(pat, sizeof pat, ".entry %s(", name);
	const char *p = strstr(ptx, pat);
	if (!p)
		return 0;
	p += strlen(pat);
	const char *end = strchr(p, ')');
	if (!end)
		return 0;
	static const char *want[] = {".u64", ".u64", ".u64", ".u64", ".f32"};
	for (int i = 0; i < 5; i++) {
		const char *q = strstr(p, ".param");
		if (!q || q > end)
			return 0;
		q += strlen(".param");
		while (*q == ' ' || *q == '\t')
			q++;
		if (strncmp(q, want[i], strlen(want[i])) != 0)
			return 0;
		p = q;
	}
	return strstr(p, ".param") == NULL || strstr(p, ".param") > end;
}

EXPORT CUresult cuModuleLoadData(module_t **pm, const void *image) {
	NEED_CTX();
	const char *s = image;
	if (!s || !strstr(s, ".version") || !strstr(s, ".target") || !strstr(s, ".address_size 64"))
		return CUDA_ERROR_INVALID_IMAGE;
	module_t *m = calloc(1, sizeof *m);
	m->ptx = strdup(s);
	*pm = m;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(module_t *m) {
	NEED_CTX();
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	free(m->ptx);
	free(m);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(function_t **pf, module_t *m, const char *name) {
	NEED_CTX();
	if (!m || !name)
		return CUDA_ERROR_INVALID_HANDLE;
	for (int k = 1; k < NKERNELS; k++) {
		if (strcmp(name, knames[k]) == 0) {
			if (!entry_ok(m->ptx, name))
				return CUDA_ERROR_NOT_FOUND;
			function_t *f = calloc(1, sizeof *f);
			f->m = m;
			f->kernel = k;
			*pf = f; /* leaked with the module, as a handful per process */
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuLaunchKernel(function_t *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			       unsigned shmem, stream_t *s, void **params, void **extra) {
	NEED_CTX();
	if (!f || !s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!params || extra || gx == 0 || gy != 1 || gz != 1 || bx == 0 || bx > 1024 || by != 1 || bz != 1 || shmem != 0)
		return CUDA_ERROR_INVALID_VALUE;
	busy_stream(s, "cuLaunchKernel");
	op_t *o = newop(OP_KERNEL);
	o->kernel = f->kernel;
	for (int i = 0; i < 4; i++)
		o->a[i] = *(unsigned long long *)params[i];
	o->s = *(float *)params[4];
	enqueue(s, o);
	lock();
	kernel_launches++;
	unlock();
	return CUDA_SUCCESS;
}

/* Rounding as package fp16 does: nearest even, subnormals kept, NaN quiet
 * with its top payload bits (x86 F16C). */
static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint32_t shift_even(uint32_t x, uint32_t s) {
	uint32_t q = x >> s, rem = x & ((1u << s) - 1), half = 1u << (s - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

static uint16_t to_half(float f) {
	uint32_t u = fbits(f), a = u & 0x7fffffff;
	uint16_t sign = (u >> 16) & 0x8000;
	if (a > 0x7f800000)
		return sign | 0x7e00 | ((a >> 13) & 0x3ff);
	if (a >= 0x477ff000)
		return sign | 0x7c00;
	if (a >= 0x38800000)
		return sign | shift_even(a - (112u << 23), 13);
	if (a < 0x33000000)
		return sign;
	uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
	return sign | shift_even(m, 126 - e);
}

static float from_half(uint16_t h) {
	uint32_t a = h & 0x7fff, u = (a + (112u << 10)) << 13;
	if (a < 0x400)
		u = fbits((float)a * 0x1p-24f);
	if (a >= 0x7c00) {
		u = 0x7f800000 | a << 13;
		if (a > 0x7c00)
			u |= 0x400000;
	}
	return bitsf(((uint32_t)(h & 0x8000) << 16) | u);
}

static uint16_t to_bf16(float f) {
	uint32_t u = fbits(f);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (u >> 16) | 0x40;
	uint32_t hi = u >> 16, lo = u & 0xffff;
	if (lo > 0x8000 || (lo == 0x8000 && (hi & 1)))
		hi++;
	return hi;
}

static int nonfinite(uint32_t bits, uint32_t mask) { return (bits & mask) == mask; }

static void run_kernel(op_t *o) {
	size_t n = o->a[3];
	float *f0 = (float *)(uintptr_t)o->a[0], *f1 = (float *)(uintptr_t)o->a[1];
	uint16_t *h0 = (uint16_t *)(uintptr_t)o->a[0], *h1 = (uint16_t *)(uintptr_t)o->a[1];
	switch (o->kernel) {
	case K_SCALE:
		for (size_t i = 0; i < n; i++)
			f0[i] *= o->s;
		break;
	case K_ADD:
		for (size_t i = 0; i < n; i++)
			f0[i] += f1[i];
		break;
	case K_COMPRESS_F16:
		for (size_t i = 0; i < n; i++)
			h0[i] = to_half(f1[i] * o->s);
		break;
	case K_COMPRESS_BF16:
		for (size_t i = 0; i < n; i++)
			h0[i] = to_bf16(f1[i] * o->s);
		break;
	case K_DECOMPRESS_F16:
		for (size_t i = 0; i < n; i++)
			f0[i] = from_half(h1[i]);
		break;
	case K_DECOMPRESS_BF16:
		for (size_t i = 0; i < n; i++)
			f0[i] = bitsf((uint32_t)h1[i] << 16);
		break;
	case K_OVERFLOWS_F16:
	case K_OVERFLOWS_BF16: {
		unsigned long long *count = (unsigned long long *)(uintptr_t)o->a[0];
		uint16_t *w = (uint16_t *)(uintptr_t)o->a[1];
		float *in = (float *)(uintptr_t)o->a[2];
		uint32_t mask = o->kernel == K_OVERFLOWS_F16 ? 0x7c00 : 0x7f80;
		for (size_t i = 0; i < n; i++)
			if (nonfinite(w[i], mask) && !nonfinite(fbits(in[i]), 0x7f800000))
				(*count)++;
		break;
	}
	}
}

/* ---- NCCL ---- */
typedef struct group {
	char id[128];
	int nranks, joined, refs;
	struct comm **ranks;
	/* the collective in progress, by sequence number */
	unsigned long long seq;
	int arrived, computed, left;
	/* mailboxes for send/recv: msgs[src*nranks+dst] */
	struct msg **box;
	struct group *next;
} group_t;

typedef struct msg { struct msg *next; size_t n; char data[]; } msg_t;

typedef struct comm {
	group_t *g;
	int rank, dev, blocking;
	volatile int aborted;
	int async;          /* the result ncclCommGetAsyncError reports */
	int inprogress;     /* polls still to answer ncclInProgress */
	op_t *held;         /* ops whose enqueue waits out inprogress */
	int stall;          /* the next collective never arrives */
	int running;        /* ops of this comm executing on a stream */
	unsigned long long seq;
	char lasterr[256];
	const void *send;   /* this rank's arguments of the collective in progress */
	void *recv;
	op_t *cur;
	void *result;
	int regs;
	int destroyed;
	int calls;          /* threads inside an NCCL call of this comm */
	const char *in_fn;  /* the call one of them is in */
	struct job *job;    /* the group job not yet completed (async mode) */
	int *launches;      /* the size of each launch: ops of this comm per group */
	int nlaunch, caplaunch;
} comm_t;

/* A group job of async mode: the operations of one ncclGroupEnd (or of
 * one collective outside a group), put on their streams by the job's
 * thread. refs: the launching thread's slot and each comm not yet
 * completed. */
typedef struct job {
	op_t *ops;
	comm_t **comms;
	int ncomms;
	stream_t **streams;
	int nstreams;
	int enqueued, joined, refs;
	pthread_t th;
	struct job **slot; /* the launching thread's slot, while it holds the job */
} job_t;

/* The launching thread's group job, as NCCL 2.14-2.26 keep it: a cell
 * per thread on the heap (never freed), so that a join from another
 * thread can clear it, as ncclGroupJobComplete resets the launching
 * thread's ncclGroupJobMain. Guarded by gmu. */
static __thread job_t **thread_job;

static job_t **job_slot(void) {
	if (!thread_job)
		thread_job = calloc(1, sizeof *thread_job);
	return thread_job;
}

/* enter and leave bracket every NCCL call that takes a communicator. */
static void enter(comm_t *c, const char *fn) {
	int prev = __atomic_fetch_add(&c->calls, 1, __ATOMIC_ACQ_REL);
	if (prev > 0)
		violation("%s and %s in the communicator of rank %d at once, from two threads", fn, c->in_fn ? c->in_fn : "?", c->rank);
	if (c->destroyed)
		violation("%s on the communicator of rank %d after ncclCommDestroy or ncclCommAbort", fn, c->rank);
	c->in_fn = fn;
}

static void leave(comm_t *c) { __atomic_fetch_sub(&c->calls, 1, __ATOMIC_ACQ_REL); }

static group_t *groups;
static ncclResult_t in_use_violation(comm_t *c, const char *fn);
static ncclResult_t ensure_ready(comm_t *c, const char *fn);
static int in_progress(comm_t *c);
static int inject_inprogress; /* the next non-blocking calls answer ncclInProgress this many polls */
static unsigned long long next_id = 1;
static __thread int group_depth;
static __thread op_t *group_ops;
static __thread comm_t *group_init_comms[64];
static __thread int group_ninit;
static char global_lasterr[256];

EXPORT ncclResult_t ncclGetVersion(int *v) {
	if (!v)
		return ncclInvalidArgument;
	*v = standin_version;
	return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	}
	return "unknown result code";
}

EXPORT const char *ncclGetLastError(comm_t *c) {
	return c && c->lasterr[0] ? c->lasterr : global_lasterr;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	if (!id)
		return ncclInvalidArgument;
	memset(id, 0, sizeof *id);
	lock();
	unsigned long long n = next_id++;
	unlock();
	snprintf(id->internal, sizeof id->internal, "stand-in %d/%llu", (int)getpid(), n);
	return ncclSuccess;
}

static group_t *find_group(const ncclUniqueId *id, int nranks) {
	for (group_t *g = groups; g; g = g->next)
		if (memcmp(g->id, id->internal, 128) == 0 && g->joined < g->nranks)
			return g;
	group_t *g = calloc(1, sizeof *g);
	memcpy(g->id, id->internal, 128);
	g->nranks = nranks;
	g->ranks = calloc(nranks, sizeof *g->ranks);
	g->box = calloc((size_t)nranks * nranks, sizeof *g->box);
	g->next = groups;
	groups = g;
	return g;
}

static int all_joined(comm_t *c) { return c->g->joined == c->g->nranks; }

/* Blocking init waits for every rank; non-blocking init returns
 * ncclInProgress and ncclCommGetAsyncError reports success once every
 * rank has joined. Called with gmu held. */
static ncclResult_t init_rank(comm_t **out, int nranks, ncclUniqueId id, int rank, int blocking, int wait) {
	if (!initialized || !cur) {
		snprintf(global_lasterr, sizeof global_lasterr, "stand-in: no current CUDA context on the calling thread");
		return ncclUnhandledCudaError;
	}
	if (nranks < 1 || rank < 0 || rank >= nranks) {
		snprintf(global_lasterr, sizeof global_lasterr, "stand-in: rank %d of %d", rank, nranks);
		return ncclInvalidArgument;
	}
	if (strncmp(id.internal, "stand-in ", 9) != 0) {
		snprintf(global_lasterr, sizeof global_lasterr, "stand-in: unique id not from ncclGetUniqueId");
		return ncclInvalidArgument;
	}
	group_t *g = find_group(&id, nranks);
	if (g->nranks != nranks || g->ranks[rank]) {
		snprintf(global_lasterr, sizeof global_lasterr, "stand-in: rank %d joined twice or nranks differ (%d, %d)", rank, g->nranks, nranks);
		return ncclInvalidUsage;
	}
	comm_t *c = calloc(1, sizeof *c);
	c->g = g;
	c->rank = rank;
	c->dev = cur->dev;
	c->blocking = blocking;
	g->ranks[rank] = c;
	g->joined++;
	g->refs++;
	pthread_cond_broadcast(&gcv);
	*out = c;
	if (!blocking) {
		c->inprogress = inject_inprogress;
		c->async = ncclInProgress;
		return ncclInProgress;
	}
	if (wait)
		while (!all_joined(c))
			pthread_cond_wait(&gcv, &gmu);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRankConfig(comm_t **out, int nranks, ncclUniqueId id, int rank, ncclConfig_v21700 *cfg) {
	int blocking = 1;
	if (cfg) {
		if (cfg->magic != 0xcafebeef || cfg->size < 24 || cfg->version < 21400) {
			snprintf(global_lasterr, sizeof global_lasterr, "stand-in: ncclConfig_t not initialized (size %zu, magic %#x, version %u)", cfg->size, cfg->magic, cfg->version);
			return ncclInvalidArgument;
		}
		if (cfg->size != sizeof(ncclConfig_v21700) || cfg->version != 21700) {
			snprintf(global_lasterr, sizeof global_lasterr, "stand-in: expects the 2.17 ncclConfig_t layout (40 bytes, version 21700), got %zu bytes, version %u", cfg->size, cfg->version);
			return ncclInvalidArgument;
		}
		if (cfg->blocking != (int)0x80000000)
			blocking = cfg->blocking;
		if (cfg->cgaClusterSize != (int)0x80000000 || cfg->minCTAs != (int)0x80000000 || cfg->maxCTAs != (int)0x80000000) {
			snprintf(global_lasterr, sizeof global_lasterr, "stand-in: config fields left undefined were set (%d %d %d)", cfg->cgaClusterSize, cfg->minCTAs, cfg->maxCTAs);
			return ncclInvalidArgument;
		}
	}
	lock();
	ncclResult_t r;
	if (group_depth > 0) {
		/* Inside a group: join now, wait at ncclGroupEnd. */
		r = init_rank(out, nranks, id, rank, blocking, 0);
		if (r == ncclSuccess || r == ncclInProgress)
			group_init_comms[group_ninit++] = *out;
		if (r == ncclInProgress)
			r = ncclSuccess;
	} else {
		r = init_rank(out, nranks, id, rank, blocking, 1);
	}
	unlock();
	return r;
}

static void comm_failed(comm_t *c, int r, const char *msg) {
	if (c->async == ncclSuccess || c->async == ncclInProgress) {
		c->async = r;
		snprintf(c->lasterr, sizeof c->lasterr, "%s", msg);
	}
}

static void release_held(comm_t *c);

static void job_unref(job_t *j) {
	if (--j->refs > 0)
		return;
	free(j->comms);
	free(j->streams);
	free(j);
}

/* The job's thread: it enqueues a little after the launch returned, so
 * that work the binding puts on a stream meanwhile goes first, as it
 * would on a GPU. */
static void *job_main(void *arg) {
	job_t *j = arg;
	usleep(job_delay_us);
	lock();
	for (op_t *o = j->ops, *n; o; o = n) {
		n = o->next;
		enqueue((stream_t *)o->ev, o);
	}
	j->ops = NULL;
	j->enqueued = 1;
	pthread_cond_broadcast(&gcv);
	unlock();
	return NULL;
}

/* log_launch records how many operations of c one launch carried. Called
 * with gmu held. */
static void log_launch(comm_t *c, int n) {
	if (c->nlaunch == c->caplaunch) {
		c->caplaunch = c->caplaunch ? 2 * c->caplaunch : 16;
		c->launches = realloc(c->launches, c->caplaunch * sizeof *c->launches);
	}
	c->launches[c->nlaunch++] = n;
}

/* start_job launches ops (a list, o->ev their streams) as one group job
 * and answers ncclInProgress. Called with gmu held. */
static ncclResult_t start_job(op_t *ops) {
	job_t **slot = job_slot();
	job_t *old = *slot;
	if (old && !old->joined && thread_local_jobs()) {
		violation("a thread launched a group while its previous group job (%d communicator(s)) was incomplete: NCCL 2.14-2.26 keep the job in the thread's storage, and the first is lost",
			  old->ncomms);
		for (int i = 0; i < old->ncomms; i++)
			comm_failed(old->comms[i], ncclInternalError, "stand-in: group job overwritten by a later group of the same thread");
	}
	job_t *j = calloc(1, sizeof *j);
	j->ops = ops;
	for (op_t *o = ops; o; o = o->next) {
		comm_t *c = o->comm;
		int seen = 0;
		for (int i = 0; i < j->ncomms; i++)
			seen |= j->comms[i] == c;
		if (!seen) {
			j->comms = realloc(j->comms, (j->ncomms + 1) * sizeof *j->comms);
			j->comms[j->ncomms++] = c;
		}
		stream_t *st = (stream_t *)o->ev;
		seen = 0;
		for (int i = 0; i < j->nstreams; i++)
			seen |= j->streams[i] == st;
		if (!seen) {
			j->streams = realloc(j->streams, (j->nstreams + 1) * sizeof *j->streams);
			j->streams[j->nstreams++] = st;
		}
	}
	for (int i = 0; i < j->ncomms; i++) {
		comm_t *c = j->comms[i];
		c->async = ncclInProgress;
		c->inprogress = inject_inprogress;
		c->job = j;
	}
	j->refs = j->ncomms;
	if (thread_local_jobs()) {
		if (old) {
			old->slot = NULL;
			job_unref(old);
		}
		j->refs++;
		j->slot = slot;
		*slot = j;
	}
	pthread_create(&j->th, NULL, job_main, j);
	return ncclInProgress;
}

/* complete_job is ncclGroupJobComplete: it joins the job's thread,
 * clears the launching thread's storage (from whichever thread it runs
 * on) and unlinks the job from its communicators. Called with gmu held;
 * drops it while joining. */
static void complete_job(job_t *j) {
	if (!j->joined) {
		j->joined = 1;
		unlock();
		usleep(50); /* NCCL joins a thread here: a window another caller may hit */
		pthread_join(j->th, NULL);
		lock();
	}
	if (j->slot) {
		if (*j->slot == j)
			*j->slot = NULL;
		j->slot = NULL;
		job_unref(j);
	}
	for (int i = 0; i < j->ncomms; i++) {
		comm_t *c = j->comms[i];
		if (c->job == j) {
			c->job = NULL;
			if (c->async == ncclInProgress && c->inprogress == 0)
				c->async = ncclSuccess;
			job_unref(j);
		}
	}
}

/* held_use finds an operation that a group job or a communicator's held
 * list has yet to put on a stream and that uses [lo, lo+n). Called with
 * gmu held. */
static const op_t *held_use(const char *lo, size_t n) {
	for (group_t *g = groups; g; g = g->next)
		for (int r = 0; r < g->nranks; r++) {
			comm_t *c = g->ranks[r];
			if (!c)
				continue;
			for (const op_t *o = c->held; o; o = o->next)
				if (op_uses(o, lo, n))
					return o;
			if (c->job)
				for (const op_t *o = c->job->ops; o; o = o->next)
					if (op_uses(o, lo, n))
						return o;
		}
	return NULL;
}

/* busy_stream reports CUDA work put on a stream of a communicator whose
 * enqueue has not reported ncclSuccess yet, which NCCL forbids. */
static void busy_stream(stream_t *s, const char *fn) {
	lock();
	for (group_t *g = groups; g; g = g->next)
		for (int r = 0; r < g->nranks; r++) {
			comm_t *c = g->ranks[r];
			if (!c || !c->job || c->async != ncclInProgress)
				continue;
			for (int i = 0; i < c->job->nstreams; i++)
				if (c->job->streams[i] == s)
					violation("%s on the stream of rank %d while its enqueue is ncclInProgress", fn, c->rank);
		}
	unlock();
}

EXPORT ncclResult_t ncclCommGetAsyncError(comm_t *c, ncclResult_t *r) {
	if (!c || !r)
		return ncclInvalidArgument;
	enter(c, "ncclCommGetAsyncError");
	lock();
	if (c->async == ncclInProgress) {
		if (c->inprogress > 0) {
			c->inprogress--;
		} else if (c->job) {
			/* 2.26 and newer: ncclCommGetAsyncError completes the
			 * group job. 2.23-2.25 only report the job's result: the
			 * communicator's next call joins it (ensure_ready). */
			if (c->job->enqueued && model == M_LAZY)
				c->async = ncclSuccess;
			else if (c->job->enqueued)
				complete_job(c->job);
		} else if (all_joined(c)) {
			c->async = ncclSuccess;
			release_held(c);
		}
	}
	*r = c->async;
	unlock();
	leave(c);
	return ncclSuccess;
}

/* comm_attr answers ncclCommCount, ncclCommUserRank and
 * ncclCommCuDevice, each after ncclCommEnsureReady. */
static ncclResult_t comm_attr(comm_t *c, int *out, int which, const char *fn) {
	if (!c || !out)
		return ncclInvalidArgument;
	enter(c, fn);
	lock();
	ncclResult_t r = c->async;
	if (r == ncclSuccess || r == ncclInProgress)
		r = ensure_ready(c, fn);
	if (r == ncclSuccess)
		*out = which == 0 ? c->g->nranks : which == 1 ? c->rank : c->dev;
	unlock();
	leave(c);
	return r;
}

EXPORT ncclResult_t ncclCommCount(comm_t *c, int *n) { return comm_attr(c, n, 0, "ncclCommCount"); }
EXPORT ncclResult_t ncclCommUserRank(comm_t *c, int *r) { return comm_attr(c, r, 1, "ncclCommUserRank"); }
EXPORT ncclResult_t ncclCommCuDevice(comm_t *c, int *d) { return comm_attr(c, d, 2, "ncclCommCuDevice"); }

static void group_unref(group_t *g) {
	if (--g->refs > 0)
		return;
	for (group_t **p = &groups; *p; p = &(*p)->next)
		if (*p == g) {
			*p = g->next;
			break;
		}
	for (int i = 0; i < g->nranks * g->nranks; i++)
		for (msg_t *m = g->box[i], *n; m; m = n) {
			n = m->next;
			free(m);
		}
	free(g->box);
	free(g->ranks);
	free(g);
}

/* Destroy and abort wait until no op of the comm is executing on a
 * stream; abort first makes a waiting collective give up. Queued ops of
 * an aborted or destroyed comm are skipped when their stream reaches
 * them, as NCCL's kernels exit on abort. */
static ncclResult_t finish(comm_t *c, int abort) {
	if (!c)
		return ncclInvalidArgument;
	enter(c, abort ? "ncclCommAbort" : "ncclCommDestroy");
	lock();
	if (c->destroyed) {
		/* enter recorded it; the group may be gone. */
		unlock();
		leave(c);
		return ncclInvalidUsage;
	}
	if (cur && cur->dev != c->dev)
		violation("%s of rank %d (device %d) with device %d's context current", abort ? "ncclCommAbort" : "ncclCommDestroy", c->rank, c->dev, cur->dev);
	if (!abort && in_progress(c))
		violation("ncclCommDestroy of rank %d while its enqueue is ncclInProgress", c->rank);
	if (abort)
		c->aborted = 1;
	/* The group job, if any, is abandoned: wait for its thread. */
	if (c->job) {
		job_t *j = c->job;
		while (!j->enqueued)
			pthread_cond_wait(&gcv, &gmu);
		complete_job(j);
	}
	pthread_cond_broadcast(&gcv);
	while (c->running)
		pthread_cond_wait(&gcv, &gmu);
	for (op_t *o = c->held, *n; o; o = n) {
		n = o->next;
		free(o);
	}
	c->held = NULL;
	c->destroyed = 1;
	if (abort)
		c->regs = 0; /* ncclCommAbort releases the registrations */
	group_t *g = c->g;
	/* NCCL releases what is still registered; regs keeps the count after
	 * ncclCommDestroy so that tests see what the binding left. */
	group_unref(g);
	unlock();
	leave(c);
	/* The comm itself is leaked on purpose: ops still queued on a stream
	 * point to it and find it destroyed. */
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(comm_t *c) { return finish(c, 0); }
EXPORT ncclResult_t ncclCommAbort(comm_t *c) { return finish(c, 1); }

EXPORT ncclResult_t ncclCommFinalize(comm_t *c) { (void)c; return ncclSuccess; }

EXPORT ncclResult_t ncclMemAlloc(void **p, size_t n) {
	if (!p || n == 0)
		return ncclInvalidArgument;
	if (!initialized || !cur)
		return ncclUnhandledCudaError;
	void *m = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
	if (!m)
		return ncclSystemError;
	memset(m, 0x5a, n);
	remember(m, n);
	lock();
	live_nccl_allocs++;
	unlock();
	*p = m;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclMemFree(void *p) {
	if (!p)
		return ncclInvalidArgument;
	if (release_alloc(p, "ncclMemFree"))
		free(p);
	lock();
	live_nccl_allocs--;
	unlock();
	return ncclSuccess;
}

typedef struct reg { comm_t *c; void *p; size_t n; } reg_t;

EXPORT ncclResult_t ncclCommRegister(comm_t *c, void *p, size_t n, void **h) {
	if (!c || !p || !h || n == 0)
		return ncclInvalidArgument;
	enter(c, "ncclCommRegister");
	lock();
	if (async_mode && in_progress(c)) {
		ncclResult_t r = in_use_violation(c, "ncclCommRegister");
		unlock();
		leave(c);
		return r;
	}
	int dead = c->destroyed || c->aborted;
	if (!dead)
		c->regs++;
	unlock();
	leave(c);
	if (dead)
		return ncclInvalidUsage;
	reg_t *r = malloc(sizeof *r);
	r->c = c;
	r->p = p;
	r->n = n;
	*h = r;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDeregister(comm_t *c, void *h) {
	reg_t *r = h;
	if (!c || !r || r->c != c)
		return ncclInvalidArgument;
	enter(c, "ncclCommDeregister");
	lock();
	if (async_mode && in_progress(c)) {
		ncclResult_t res = in_use_violation(c, "ncclCommDeregister");
		unlock();
		leave(c);
		return res;
	}
	if (c->async != ncclSuccess && c->async != ncclInProgress)
		violation("ncclCommDeregister on the communicator of rank %d, which has failed (%d): abort it instead", c->rank, c->async);
	int dead = c->destroyed;
	if (!dead)
		c->regs--;
	unlock();
	leave(c);
	if (dead)
		return ncclInvalidUsage;
	free(r);
	return ncclSuccess;
}

/* ---- collectives ---- */
enum { C_ALLREDUCE = 1, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER, C_SEND, C_RECV };

static size_t dsize(int dt) {
	switch (dt) {
	case ncclInt8: case ncclUint8: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	}
	return 0;
}

static double load(int dt, const void *p, size_t i) {
	switch (dt) {
	case ncclInt8: return ((const int8_t *)p)[i];
	case ncclUint8: return ((const uint8_t *)p)[i];
	case ncclInt32: return ((const int32_t *)p)[i];
	case ncclUint32: return ((const uint32_t *)p)[i];
	case ncclInt64: return (double)((const int64_t *)p)[i];
	case ncclUint64: return (double)((const uint64_t *)p)[i];
	case ncclFloat16: return from_half(((const uint16_t *)p)[i]);
	case ncclBfloat16: return bitsf((uint32_t)((const uint16_t *)p)[i] << 16);
	case ncclFloat32: return ((const float *)p)[i];
	case ncclFloat64: return ((const double *)p)[i];
	}
	return 0;
}

static void store(int dt, void *p, size_t i, double v) {
	switch (dt) {
	case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
	case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
	case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
	case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
	case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
	case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
	case ncclFloat16: ((uint16_t *)p)[i] = to_half((float)v); break;
	case ncclBfloat16: ((uint16_t *)p)[i] = to_bf16((float)v); break;
	case ncclFloat32: ((float *)p)[i] = (float)v; break;
	case ncclFloat64: ((double *)p)[i] = v; break;
	}
}

static int is_float(int dt) { return dt == ncclFloat16 || dt == ncclBfloat16 || dt == ncclFloat32 || dt == ncclFloat64; }

/* reduce combines element i of every rank's send buffer (at byte offset
 * off). Sums are exact in double for the values tests use and round once
 * to the element type; Avg divides the exact sum once (with truncation for
 * integers). NCCL's ncclAvg instead pre-multiplies each contribution by
 * 1/N in the element type, which rounds more often: the stand-in checks
 * how the binding passes ops, not NCCL's arithmetic. */
static double reduce(group_t *g, int dt, int op, size_t off, size_t i) {
	double acc = 0;
	for (int r = 0; r < g->nranks; r++) {
		double v = load(dt, (const char *)g->ranks[r]->send + off, i);
		if (r == 0) { acc = v; continue; }
		switch (op) {
		case ncclSum: case ncclAvg: acc += v; break;
		case ncclProd: acc *= v; break;
		case ncclMax: if (v > acc) acc = v; break;
		case ncclMin: if (v < acc) acc = v; break;
		}
	}
	if (op == ncclAvg) {
		acc /= g->nranks;
		if (!is_float(dt))
			acc = acc < 0 ? -(double)(long long)(-acc) : (double)(long long)acc;
	}
	return acc;
}

static int peer_gone(comm_t *c) {
	group_t *g = c->g;
	for (int r = 0; r < g->nranks; r++)
		if (g->ranks[r] && (g->ranks[r]->aborted || g->ranks[r]->destroyed)) {
			char msg[96];
			snprintf(msg, sizeof msg, "stand-in: rank %d of the communicator was aborted or destroyed", r);
			comm_failed(c, ncclRemoteError, msg);
			return 1;
		}
	return 0;
}

/* wait_all waits with gmu held until the group's counter *ctr reaches
 * nranks, or c is aborted, or a peer is gone (which a network transport
 * reports as ncclRemoteError; over NVLink NCCL would rather hang). */
static int wait_all(comm_t *c, int *ctr, int arriving) {
	group_t *g = c->g;
	while (*ctr < g->nranks && !c->aborted && !peer_gone(c))
		pthread_cond_wait(&gcv, &gmu);
	/* A peer that arrived and was then aborted has not really joined: a
	 * peer cannot have finished the collective without this rank, so a
	 * peer gone by now was aborted. (Once every rank has computed, a peer
	 * may finish and be closed, so the second wait does not ask.) */
	if (arriving && *ctr >= g->nranks && !c->aborted && peer_gone(c))
		return 0;
	return *ctr >= g->nranks && !c->aborted;
}

static void run_coll(op_t *o) {
	comm_t *c = o->comm;
	lock();
	if (c->aborted || c->destroyed) {
		unlock();
		return;
	}
	c->running++;
	group_t *g = c->g;
	size_t es = dsize(o->dtype), n = o->count;
	if (o->coll == C_SEND) {
		msg_t *m = malloc(sizeof *m + n * es);
		m->next = NULL;
		m->n = n * es;
		memcpy(m->data, o->src, n * es);
		msg_t **q = &g->box[c->rank * g->nranks + o->root];
		while (*q)
			q = &(*q)->next;
		*q = m;
		pthread_cond_broadcast(&gcv);
		goto out;
	}
	if (o->coll == C_RECV) {
		msg_t **q = &g->box[o->root * g->nranks + c->rank];
		while (!*q && !c->aborted)
			pthread_cond_wait(&gcv, &gmu);
		if (c->aborted)
			goto out;
		msg_t *m = *q;
		*q = m->next;
		if (m->n != n * es)
			comm_failed(c, ncclInvalidUsage, "stand-in: recv size differs from the matching send");
		else
			memcpy(o->dst, m->data, m->n);
		free(m);
		goto out;
	}
	if (c->stall) {
		/* A rank that never arrives: it holds its stream until abort. */
		while (!c->aborted)
			pthread_cond_wait(&gcv, &gmu);
		goto out;
	}
	/* Arrive. Every rank executes its collectives in order, so the group
	 * has one collective in progress at a time. */
	c->seq++;
	while (g->arrived > 0 && g->seq != c->seq && !c->aborted)
		pthread_cond_wait(&gcv, &gmu);
	if (c->aborted)
		goto out;
	g->seq = c->seq;
	c->send = o->src;
	c->recv = o->dst;
	c->cur = o;
	g->arrived++;
	pthread_cond_broadcast(&gcv);
	if (!wait_all(c, &g->arrived, 1))
		goto out;
	/* Every rank agrees or the group fails, rather than reading past a
	 * buffer: real NCCL would hang or corrupt memory instead. */
	for (int r = 0; r < g->nranks; r++) {
		op_t *p = g->ranks[r]->cur;
		if (p->coll != o->coll || p->count != o->count || p->dtype != o->dtype || p->redop != o->redop || p->root != o->root) {
			comm_failed(c, ncclInvalidUsage, "stand-in: ranks called different collectives");
			break;
		}
	}
	size_t outn = 0;
	void *res = NULL;
	if (c->async == ncclSuccess || c->async == ncclInProgress) {
		int R = g->nranks, me = c->rank;
		switch (o->coll) {
		case C_ALLREDUCE:
			outn = n * es;
			res = malloc(outn + 1);
			for (size_t i = 0; i < n; i++)
				store(o->dtype, res, i, reduce(g, o->dtype, o->redop, 0, i));
			break;
		case C_REDUCE:
			if (me == o->root) {
				outn = n * es;
				res = malloc(outn + 1);
				for (size_t i = 0; i < n; i++)
					store(o->dtype, res, i, reduce(g, o->dtype, o->redop, 0, i));
			}
			break;
		case C_BROADCAST:
			outn = n * es;
			res = malloc(outn + 1);
			memcpy(res, g->ranks[o->root]->send, outn);
			break;
		case C_ALLGATHER:
			outn = n * es * R;
			res = malloc(outn + 1);
			for (int r = 0; r < R; r++)
				memcpy((char *)res + r * n * es, g->ranks[r]->send, n * es);
			break;
		case C_REDUCESCATTER:
			outn = n * es;
			res = malloc(outn + 1);
			for (size_t i = 0; i < n; i++)
				store(o->dtype, res, i, reduce(g, o->dtype, o->redop, me * n * es, i));
			break;
		}
	}
	g->computed++;
	pthread_cond_broadcast(&gcv);
	if (!wait_all(c, &g->computed, 0)) {
		free(res);
		goto out;
	}
	if (res && outn)
		memcpy(o->dst, res, outn);
	free(res);
	g->left++;
	if (g->left == g->nranks) {
		g->arrived = g->computed = g->left = 0;
		for (int r = 0; r < g->nranks; r++)
			g->ranks[r]->cur = NULL;
	}
	pthread_cond_broadcast(&gcv);
out:
	c->running--;
	pthread_cond_broadcast(&gcv);
	unlock();
}

static void run_op(stream_t *s, op_t *o) {
	(void)s;
	switch (o->kind) {
	case OP_COPY:
		if (o->n)
			memmove(o->dst, o->src, o->n);
		break;
	case OP_SET:
		memset(o->dst, o->byte, o->n);
		break;
	case OP_RECORD: {
		lock();
		event_t *e = o->ev;
		if (o->gen > e->done)
			e->done = o->gen;
		int gone = e->destroyed && e->done >= e->recorded;
		pthread_cond_broadcast(&gcv);
		unlock();
		if (gone)
			free(e);
		break;
	}
	case OP_WAIT:
		lock();
		while (o->ev->done < o->gen)
			pthread_cond_wait(&gcv, &gmu);
		unlock();
		break;
	case OP_KERNEL:
		run_kernel(o);
		break;
	case OP_HOSTFN:
		o->fn(o->dst);
		break;
	case OP_COLL:
		run_coll(o);
		break;
	case 100: /* OP_GATE */
		run_gate(o);
		break;
	}
}

/* release_held puts the ops held while the comm was in progress on their
 * streams, in order. Called with gmu held. */
static void release_held(comm_t *c) {
	op_t *o = c->held;
	c->held = NULL;
	while (o) {
		op_t *n = o->next;
		enqueue((stream_t *)o->ev, o);
		o = n;
	}
}

static const char *coll_name(int kind) {
	switch (kind) {
	case C_ALLREDUCE: return "ncclAllReduce";
	case C_BROADCAST: return "ncclBroadcast";
	case C_REDUCE: return "ncclReduce";
	case C_ALLGATHER: return "ncclAllGather";
	case C_REDUCESCATTER: return "ncclReduceScatter";
	case C_SEND: return "ncclSend";
	case C_RECV: return "ncclRecv";
	}
	return "collective";
}

/* jobbed reports whether c's enqueues go through a group job: async mode,
 * non-blocking, more than one rank. */
static int jobbed(comm_t *c) { return async_mode && !c->blocking && c->g->nranks > 1; }

/* in_use_violation reports a communicator used while its enqueue (or its
 * initialisation) has not reported ncclSuccess, which ncclCommEnsureReady
 * answers with ncclInvalidArgument. Called with gmu held. */
static ncclResult_t in_use_violation(comm_t *c, const char *fn) {
	violation("%s on the communicator of rank %d before its previous operation reported ncclSuccess", fn, c->rank);
	snprintf(c->lasterr, sizeof c->lasterr, "Attempt to use communicator before the previous operation returned ncclSuccess");
	return ncclInvalidArgument;
}

/* in_progress reports whether c's last enqueue (or initialisation) has
 * not reported ncclSuccess yet. Called with gmu held. */
static int in_progress(comm_t *c) { return c->async == ncclInProgress || (c->job && !c->job->enqueued); }

/* ensure_ready is ncclCommEnsureReady, which a collective, ncclGroupEnd
 * and ncclCommCount, ncclCommUserRank and ncclCommCuDevice make first: a
 * communicator still in progress is misused (ncclInvalidArgument), and
 * a group job whose result was reported but not joined (2.23-2.25) is
 * joined here, on the calling thread, which clears the launching
 * thread's storage. Called with gmu held. */
static ncclResult_t ensure_ready(comm_t *c, const char *fn) {
	if (!async_mode)
		return ncclSuccess;
	if (in_progress(c))
		return in_use_violation(c, fn);
	if (c->job)
		complete_job(c->job);
	return ncclSuccess;
}

static ncclResult_t coll_checked(int kind, const void *send, void *recv, size_t count, int dt, int op, int root, comm_t *c, stream_t *s);

static ncclResult_t coll(int kind, const void *send, void *recv, size_t count, int dt, int op, int root, comm_t *c, stream_t *s) {
	if (!c || !s)
		return ncclInvalidArgument;
	enter(c, coll_name(kind));
	ncclResult_t r = coll_checked(kind, send, recv, count, dt, op, root, c, s);
	leave(c);
	return r;
}

static ncclResult_t coll_checked(int kind, const void *send, void *recv, size_t count, int dt, int op, int root, comm_t *c, stream_t *s) {
	if (!dsize(dt) || op < 0 || op > ncclAvg) {
		snprintf(c->lasterr, sizeof c->lasterr, "stand-in: invalid dtype %d or op %d", dt, op);
		return ncclInvalidArgument;
	}
	/* NCCL's checks: recvbuff is only used on the root of a Reduce. */
	int needs_recv = kind != C_SEND && (kind != C_REDUCE || c->rank == root);
	if (count && ((kind != C_RECV && !send) || (needs_recv && !recv))) {
		snprintf(c->lasterr, sizeof c->lasterr, "stand-in: null buffer for %zu elements", count);
		return ncclInvalidArgument;
	}
	if (root < 0 || root >= c->g->nranks) {
		snprintf(c->lasterr, sizeof c->lasterr, "stand-in: root or peer %d of %d ranks", root, c->g->nranks);
		return ncclInvalidArgument;
	}
	if (!cur || cur->dev != c->dev || s->dev != c->dev) {
		snprintf(c->lasterr, sizeof c->lasterr, "stand-in: the current context or the stream is not the communicator's device %d", c->dev);
		return ncclUnhandledCudaError;
	}
	op_t *o = newop(OP_COLL);
	o->coll = kind;
	o->src = send;
	o->dst = recv;
	o->count = count;
	o->dtype = dt;
	o->redop = op;
	o->root = root;
	o->comm = c;
	o->ev = (void *)s; /* the stream, while the op waits in a group, a job or the held list */
	if (group_depth > 0) {
		o->next = NULL;
		op_t **q = &group_ops;
		while (*q)
			q = &(*q)->next;
		*q = o;
		return ncclSuccess;
	}
	lock();
	ncclResult_t r = c->async;
	if (r != ncclSuccess && r != ncclInProgress) {
		unlock();
		free(o);
		return r;
	}
	if ((r = ensure_ready(c, coll_name(kind))) != ncclSuccess) {
		unlock();
		free(o);
		return r;
	}
	log_launch(c, 1);
	if (jobbed(c)) {
		o->next = NULL;
		r = start_job(o);
		unlock();
		return r;
	}
	if (!c->blocking && (r == ncclInProgress || inject_inprogress > 0)) {
		/* 2.21 with ncclInProgress injected: the op reaches its stream
		 * when ncclCommGetAsyncError next reports success. */
		if (r == ncclSuccess) {
			c->async = ncclInProgress;
			c->inprogress = inject_inprogress;
		}
		op_t **q = &c->held;
		while (*q)
			q = &(*q)->next;
		o->next = NULL;
		*q = o;
		unlock();
		return ncclInProgress;
	}
	unlock();
	enqueue(s, o);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, comm_t *c, stream_t *st) { return coll(C_ALLREDUCE, s, r, n, dt, op, 0, c, st); }
EXPORT ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, comm_t *c, stream_t *st) { return coll(C_BROADCAST, s, r, n, dt, ncclSum, root, c, st); }
EXPORT ncclResult_t ncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, comm_t *c, stream_t *st) { return coll(C_REDUCE, s, r, n, dt, op, root, c, st); }
EXPORT ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int dt, comm_t *c, stream_t *st) { return coll(C_ALLGATHER, s, r, n, dt, ncclSum, 0, c, st); }
EXPORT ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, comm_t *c, stream_t *st) { return coll(C_REDUCESCATTER, s, r, n, dt, op, 0, c, st); }
EXPORT ncclResult_t ncclSend(const void *s, size_t n, int dt, int peer, comm_t *c, stream_t *st) { return coll(C_SEND, s, NULL, n, dt, ncclSum, peer, c, st); }
EXPORT ncclResult_t ncclRecv(void *r, size_t n, int dt, int peer, comm_t *c, stream_t *st) { return coll(C_RECV, NULL, r, n, dt, ncclSum, peer, c, st); }

EXPORT ncclResult_t ncclGroupStart(void) {
	group_depth++;
	return ncclSuccess;
}

/* ncclGroupEnd launches the group's ops. Within a group, a rank's sends
 * go before its receives so that a ring of send/recv pairs cannot
 * deadlock, as NCCL's grouped point-to-point calls progress together. */
EXPORT ncclResult_t ncclGroupEnd(void) {
	if (group_depth <= 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	ncclResult_t res = ncclSuccess;
	lock();
	for (int i = 0; i < group_ninit; i++) {
		comm_t *c = group_init_comms[i];
		if (c->blocking)
			while (!all_joined(c))
				pthread_cond_wait(&gcv, &gmu);
		else
			res = ncclInProgress;
	}
	group_ninit = 0;
	op_t *ops = group_ops;
	group_ops = NULL;
	op_t *sends = NULL, **st = &sends, *rest = NULL, **rt = &rest;
	for (op_t *o = ops, *n; o; o = n) {
		n = o->next;
		o->next = NULL;
		if (o->coll == C_SEND) { *st = o; st = &o->next; }
		else { *rt = o; rt = &o->next; }
	}
	*st = rest;
	/* Every communicator of the group is entered for the launch, and
	 * logs how many of its operations the launch carries. */
	comm_t *in[64];
	int nin = 0, count[64] = {0};
	for (op_t *o = sends; o; o = o->next) {
		int k = 0;
		while (k < nin && in[k] != o->comm)
			k++;
		if (k == nin && nin < 64) {
			in[nin++] = o->comm;
			unlock();
			enter(o->comm, "ncclGroupEnd");
			lock();
		}
		if (k < 64)
			count[k]++;
	}
	for (int i = 0; i < nin; i++)
		log_launch(in[i], count[i]);
	op_t *jobops = NULL, **jt = &jobops;
	for (op_t *o = sends, *n; o; o = n) {
		n = o->next;
		o->next = NULL;
		comm_t *c = o->comm;
		if (c->async != ncclSuccess && c->async != ncclInProgress) {
			res = c->async;
			free(o);
			continue;
		}
		ncclResult_t er = ensure_ready(c, "ncclGroupEnd");
		if (er != ncclSuccess) {
			res = er;
			free(o);
			continue;
		}
		if (jobbed(c)) {
			*jt = o;
			jt = &o->next;
			continue;
		}
		if (!async_mode && !c->blocking && (c->async == ncclInProgress || inject_inprogress > 0)) {
			if (c->async == ncclSuccess) {
				c->async = ncclInProgress;
				c->inprogress = inject_inprogress;
			}
			op_t **q = &c->held;
			while (*q)
				q = &(*q)->next;
			o->next = NULL;
			*q = o;
			if (res == ncclSuccess)
				res = ncclInProgress;
			continue;
		}
		enqueue((stream_t *)o->ev, o);
	}
	if (jobops && (res == ncclSuccess || res == ncclInProgress))
		res = start_job(jobops);
	else if (jobops)
		for (op_t *o = jobops, *n; o; o = n) {
			n = o->next;
			free(o);
		}
	unlock();
	for (int i = 0; i < nin; i++)
		leave(in[i]);
	return res;
}

/* ---- controls for tests ---- */
/* ddpgo_standin identifies this library as the stand-in (package nccl
 * looks for it in both libraries it loads and reports it), so that no
 * figure measured over it can be taken for NCCL's on a GPU. */
EXPORT const char *ddpgo_standin(void) {
	return "ddpgo's test stand-in for libnccl.so.2 and libcuda.so.1: not NCCL, not CUDA, no GPU";
}

EXPORT void standin_set_inprogress(int polls) { lock(); inject_inprogress = polls; unlock(); }
EXPORT int standin_async_mode(void) { return async_mode; }
/* standin_model returns the completion rule followed (21, 25, 26 or 27:
 * see model), or -1 when DDPGO_STANDIN_NCCL names none. */
EXPORT int standin_model(void) { return bad_model[0] ? -1 : model; }
EXPORT void standin_fail_stream_create(int nth) { lock(); fail_stream_create = nth; unlock(); }
EXPORT int standin_comm_blocking(comm_t *c) { lock(); int b = c->blocking; unlock(); return b; }
EXPORT int standin_stream_flags(stream_t *s) { return (int)s->flags; }
/* standin_launches copies up to max launch sizes of c into buf and
 * returns how many launches c has had. */
EXPORT int standin_launches(comm_t *c, int *buf, int max) {
	lock();
	int n = c->nlaunch;
	for (int i = 0; i < n && i < max; i++)
		buf[i] = c->launches[i];
	unlock();
	return n;
}
EXPORT void standin_set_devices(int n) { lock(); ndevices = n; unlock(); }
EXPORT void standin_async_error(comm_t *c, int r, const char *msg) {
	lock();
	comm_failed(c, r, msg);
	unlock();
}
EXPORT void standin_stall(comm_t *c, int on) { lock(); c->stall = on; pthread_cond_broadcast(&gcv); unlock(); }
EXPORT int standin_registrations(comm_t *c) { lock(); int n = c->regs; unlock(); return n; }
EXPORT long standin_live_allocs(int kind) { lock(); long n = kind == 1 ? live_nccl_allocs : kind == 2 ? live_host_allocs : live_dev_allocs; unlock(); return n; }
EXPORT long standin_kernel_launches(void) { lock(); long n = kernel_launches; unlock(); return n; }
EXPORT int standin_ctx_refs(int dev) { lock(); int n = dev >= 0 && dev < MAX_DEV ? ctxs[dev].refs : -1; unlock(); return n; }

/* A gate holds a stream until the test opens it. */
typedef struct gate { int open; } gate_t;
enum { OP_GATE = 100 };
EXPORT void *standin_gate(stream_t *s) {
	gate_t *g = calloc(1, sizeof *g);
	op_t *o = newop(OP_GATE);
	o->dst = g;
	enqueue(s, o);
	return g;
}
EXPORT void standin_open(void *g) {
	lock();
	((gate_t *)g)->open = 1;
	pthread_cond_broadcast(&gcv);
	unlock();
}
static void run_gate(op_t *o) {
	gate_t *g = o->dst;
	lock();
	while (!g->open)
		pthread_cond_wait(&gcv, &gmu);
	unlock();
	free(g);
}
