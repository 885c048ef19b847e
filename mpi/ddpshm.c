//go:build mpi

// The all-reduce over memory the ranks of one machine share (see "Shared
// memory" in the package documentation). MPI carries every message: the
// descriptors, the agreement and the final barrier. Only the reduction
// itself reads and writes the peers' buffers directly.

#define _GNU_SOURCE
#include "ddpmpi.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- this process's slabs ----------------------------------------------
//
// Each slab is a memfd mapped shared; the peers open it through
// /proc/<pid>/fd/<fd> and map it too. A slab has an id never reused in
// this process, so a peer's cached mapping can never be taken for a later
// slab at the same address.

struct slab {
	uintptr_t base;
	size_t size;
	int fd;
	uint64_t id;
	uint64_t ino;
};

static pthread_mutex_t slab_mu = PTHREAD_MUTEX_INITIALIZER;
static struct slab *slabs;
static int nslabs, capslabs;
static uint64_t next_id = 1;
static uint64_t frees; // slabs freed so far, which tells the peers to drop stale mappings

void *ddp_shm_alloc(size_t size, int *err) {
	*err = 0;
	int fd = memfd_create("ddpgo-commpool", MFD_CLOEXEC);
	if (fd < 0) {
		*err = errno;
		return NULL;
	}
	if (ftruncate(fd, (off_t)size) != 0) {
		*err = errno;
		close(fd);
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		*err = errno;
		close(fd);
		return NULL;
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		*err = errno;
		close(fd);
		return NULL;
	}
	pthread_mutex_lock(&slab_mu);
	if (nslabs == capslabs) {
		int n = capslabs ? 2 * capslabs : 16;
		struct slab *s = realloc(slabs, n * sizeof *s);
		if (s == NULL) {
			pthread_mutex_unlock(&slab_mu);
			munmap(p, size);
			close(fd);
			*err = ENOMEM;
			return NULL;
		}
		slabs = s;
		capslabs = n;
	}
	slabs[nslabs++] = (struct slab){(uintptr_t)p, size, fd, next_id++, (uint64_t)st.st_ino};
	pthread_mutex_unlock(&slab_mu);
	return p;
}

int ddp_shm_free(void *p, size_t size, int *err) {
	uintptr_t addr = (uintptr_t)p;
	*err = 0;
	pthread_mutex_lock(&slab_mu);
	int i = 0;
	while (i < nslabs && slabs[i].base != addr)
		i++;
	if (i == nslabs || slabs[i].size != size) {
		pthread_mutex_unlock(&slab_mu);
		*err = EINVAL;
		return -1;
	}
	int fd = slabs[i].fd;
	slabs[i] = slabs[--nslabs];
	frees++;
	pthread_mutex_unlock(&slab_mu);
	// A peer's mapping of the slab keeps its pages until the peer drops
	// it (at its next all-reduce with this process, which carries the new
	// count of frees); nothing of this process refers to them any more.
	int rc = munmap((void *)addr, size);
	if (rc != 0)
		*err = errno;
	close(fd);
	return rc;
}

// A descriptor is what a rank tells its peers about the buffers of one
// call, in its part of the control segment (the call itself is in its
// header there).
struct desc {
	int32_t ok; // 1: both buffers lie in this process's slabs
	int32_t pid;
	uint64_t boot;  // the machine (boot_id), 0 if unknown
	uint64_t frees; // this process's slabs freed so far
	struct part {
		int32_t fd;
		int32_t pad;
		uint64_t id, ino, base, size, off;
	} send, recv;
};
_Static_assert(sizeof(struct desc) <= 128, "a descriptor fits its two lines of the control segment");

// find fills part with the slab holding [p, p+bytes); 0 if none does.
// slab_mu is held.
static int find(uintptr_t p, size_t bytes, struct part *part) {
	for (int i = 0; i < nslabs; i++) {
		struct slab *s = &slabs[i];
		if (p >= s->base && p - s->base <= s->size && bytes <= s->size - (p - s->base)) {
			*part = (struct part){s->fd, 0, s->id, s->ino, s->base, s->size, p - s->base};
			return 1;
		}
	}
	return 0;
}

// ---- the peers' slabs, as mapped here (owner thread only) ---------------

struct peermap {
	int32_t pid;
	uint64_t id, base, size; // base: the address in the peer's process
	void *here;
	uint64_t used; // the call that used it last
};

#define MAXMAPS 256

static struct peermap maps[MAXMAPS];
static int nmaps;
static uint64_t calls;

static void unmap_at(int i) {
	munmap(maps[i].here, maps[i].size);
	maps[i] = maps[--nmaps];
}

static int fail_attach; // tests: attach fails

void ddp_shm_test_fail(int on) { fail_attach = on; }

static int exit_after; // tests: the phase after which the process exits (0: none)

void ddp_shm_test_exit(int ph) { exit_after = ph; }

// attach returns part's slab of process pid mapped here, or NULL with
// errno set; bytes from part's offset must lie in the slab.
static void *attach(int32_t pid, const struct part *part, size_t bytes) {
	if (part->off > part->size || bytes > part->size - part->off) {
		errno = EINVAL;
		return NULL;
	}
	if (fail_attach) {
		errno = EPERM;
		return NULL;
	}
	for (int i = 0; i < nmaps; i++)
		if (maps[i].pid == pid && maps[i].id == part->id) {
			maps[i].used = calls;
			return maps[i].here;
		}
	// A slab of pid that overlaps this one in pid's address space has been
	// freed there: drop its mapping.
	for (int i = 0; i < nmaps;)
		if (maps[i].pid == pid && maps[i].base < part->base + part->size && part->base < maps[i].base + maps[i].size)
			unmap_at(i);
		else
			i++;
	if (nmaps == MAXMAPS) { // drop the least recently used, not one of this call
		int lru = -1;
		for (int i = 0; i < nmaps; i++)
			if (maps[i].used != calls && (lru < 0 || maps[i].used < maps[lru].used))
				lru = i;
		if (lru < 0) {
			errno = EMFILE; // this call alone needs more mappings than are kept
			return NULL;
		}
		unmap_at(lru);
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)part->fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return NULL;
	}
	if ((uint64_t)st.st_ino != part->ino || (uint64_t)st.st_size < part->size) {
		close(fd);
		errno = ESTALE; // not the file the peer described
		return NULL;
	}
	// Not MAP_POPULATE: that would allocate every page of the slab, used
	// or not; the pages this process touches fault in once.
	void *p = mmap(NULL, part->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED) {
		errno = e;
		return NULL;
	}
	maps[nmaps++] = (struct peermap){pid, part->id, part->base, part->size, p, calls};
	return p;
}

// drop_stale unmaps pid's slabs that the current call does not use: pid
// has freed a slab since its last call, which may be one of them.
static void drop_stale(int32_t pid) {
	for (int i = 0; i < nmaps;)
		if (maps[i].pid == pid && maps[i].used != calls)
			unmap_at(i);
		else
			i++;
}

void ddp_shm_detach_all(void) {
	while (nmaps > 0)
		unmap_at(nmaps - 1);
}

int ddp_shm_mapped(void) { return nmaps; }

// ---- the all-reduce ----------------------------------------------------

// The reduction goes through a chunk small enough to stay in cache: each
// rank's slice of the buffer is read once from every rank and written
// once to every rank.
#define CHUNK (64 << 10)

static _Alignas(64) unsigned char chunk[CHUNK];

// The two kernels below are compiled three times, for AVX-512F, for AVX2
// and for the baseline, and run with the widest vectors the CPU has: with
// the baseline's 16-byte loop, a two-rank staged all-reduce of 4 KiB took
// about a fifth longer (docs/small-messages.md).
// Lanes only, fp-contract=off (no fused multiply-add): every width gives
// the same bits, but for which NaN a sum of two NaNs returns (x86 returns
// its first operand's, and the compiler orders the operands of the vector
// body and of the tail as it likes). Ranks that share memory run on one
// CPU and pick the same kernel, so they agree bit for bit.
#define KERNEL static inline __attribute__((always_inline))
#define WIDE(t) __attribute__((target(t), optimize("O3", "fp-contract=off")))
#define BASE __attribute__((optimize("O3", "fp-contract=off")))

KERNEL void acc2_body(float *restrict d, const float *restrict x, long n, int avg) {
	if (avg) {
		for (long i = 0; i < n; i++)
			d[i] = x[i] * 0.5f + d[i] * 0.5f;
		return;
	}
	for (long i = 0; i < n; i++)
		d[i] = x[i] + d[i];
}

KERNEL void sum2_body(float *restrict d, const float *restrict a, const float *restrict b, long n, int avg) {
	if (avg) {
		for (long i = 0; i < n; i++)
			d[i] = b[i] * 0.5f + a[i] * 0.5f;
		return;
	}
	for (long i = 0; i < n; i++)
		d[i] = b[i] + a[i];
}

WIDE("avx512f") static void acc2_512(float *restrict d, const float *restrict x, long n, int avg) { acc2_body(d, x, n, avg); }
WIDE("avx2") static void acc2_256(float *restrict d, const float *restrict x, long n, int avg) { acc2_body(d, x, n, avg); }
BASE static void acc2_128(float *restrict d, const float *restrict x, long n, int avg) { acc2_body(d, x, n, avg); }
WIDE("avx512f") static void sum2_512(float *restrict d, const float *restrict a, const float *restrict b, long n, int avg) {
	sum2_body(d, a, b, n, avg);
}
WIDE("avx2") static void sum2_256(float *restrict d, const float *restrict a, const float *restrict b, long n, int avg) {
	sum2_body(d, a, b, n, avg);
}
BASE static void sum2_128(float *restrict d, const float *restrict a, const float *restrict b, long n, int avg) {
	sum2_body(d, a, b, n, avg);
}

// The kernels by width: 0 the baseline, 1 AVX2, 2 AVX-512F.
static void (*const acc2_at[])(float *restrict, const float *restrict, long, int) = {acc2_128, acc2_256, acc2_512};
static void (*const sum2_at[])(float *restrict, const float *restrict, const float *restrict, long, int) = {sum2_128, sum2_256, sum2_512};

// width is the widest the CPU has.
static int width(void) { return __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0; }

// acc2_f32 writes x + d (or x*0.5 + d*0.5) into d.
static void acc2_f32(float *restrict d, const float *restrict x, long n, int avg) { acc2_at[width()](d, x, n, avg); }

// ddp_sum2_f32 writes b + a (or b*0.5 + a*0.5) into d: what
// ddp_reduce_local(in b, inout a) computes, bit for bit but for which of
// two NaNs a sum returns.
void ddp_sum2_f32(float *restrict d, const float *restrict a, const float *restrict b, long n, int avg) {
	sum2_at[width()](d, a, b, n, avg);
}

int ddp_test_pair_kernel(int w, int acc, float *d, const float *a, const float *b, long n, int avg) {
	if (w < 0 || w > width())
		return 0;
	if (acc) {
		memcpy(d, b, (size_t)n * sizeof *d);
		acc2_at[w](d, a, n, avg);
	} else
		sum2_at[w](d, a, b, n, avg);
	return 1;
}

// sum2_nt_f32 writes b + a (or b*0.5 + a*0.5) into both d0 and d1, in one
// pass, with non-temporal stores: for two ranks out of place, the one
// kernel that moves only the bytes it must (read two buffers, write two).
// With ordinary stores each output line is first read for ownership
// (6 streams of memory traffic to 4), and a single-thread loop of sum2
// then memcpy ran at 0.34-0.57x an in-place loop of the same sizes from
// 16 MiB up (docs/small-messages.md). d0 and d1 are 16-byte aligned; the caller
// fences (sfence) before it publishes.
__attribute__((optimize("O3", "fp-contract=off"))) static void sum2_nt_f32(float *d0, float *d1, const float *a, const float *b,
                                                                           long n, int avg) {
	long i = 0;
	const __m128 h = _mm_set1_ps(0.5f);
	for (; i + 16 <= n; i += 16)
		for (int j = 0; j < 16; j += 4) {
			__m128 x = _mm_loadu_ps(b + i + j), y = _mm_loadu_ps(a + i + j);
			__m128 v = avg ? _mm_add_ps(_mm_mul_ps(x, h), _mm_mul_ps(y, h)) : _mm_add_ps(x, y);
			_mm_stream_ps(d0 + i + j, v);
			_mm_stream_ps(d1 + i + j, v);
		}
	for (; i < n; i++)
		d0[i] = d1[i] = avg ? b[i] * 0.5f + a[i] * 0.5f : b[i] + a[i];
}

// sum2_nt512_f32 is sum2_nt_f32 with AVX-512: each store a whole line,
// which streams closer to the in-place loop's speed (64 MiB on one thread:
// 1.05x against 0.92x with 16-byte stores, docs/small-messages.md). d0 and
// d1 are 64-byte aligned.
__attribute__((target("avx512f"), optimize("O3", "fp-contract=off"))) static void sum2_nt512_f32(float *d0, float *d1, const float *a,
                                                                                               const float *b, long n, int avg) {
	long i = 0;
	const __m512 h = _mm512_set1_ps(0.5f);
	for (; i + 16 <= n; i += 16) {
		__m512 x = _mm512_loadu_ps(b + i), y = _mm512_loadu_ps(a + i);
		__m512 v = avg ? _mm512_add_ps(_mm512_mul_ps(x, h), _mm512_mul_ps(y, h)) : _mm512_add_ps(x, y);
		_mm512_stream_ps(d0 + i, v);
		_mm512_stream_ps(d1 + i, v);
	}
	for (; i < n; i++)
		d0[i] = d1[i] = avg ? b[i] * 0.5f + a[i] * 0.5f : b[i] + a[i];
}

// nt_min is the size of a rank's slice from which the two-rank
// out-of-place kernel streams its outputs past the cache: below it, the
// buffers stay in cache from one call to the next, and streaming them out
// cost more than the reads for ownership it saves (docs/small-messages.md).
// From 512 KiB slices (a 1 MiB all-reduce) whole-line streaming was 9%
// faster than ordinary stores, 16-byte streaming no slower.
static long nt_min = 512 << 10;

long ddp_shm_set_nt_min(long n) {
	long old = nt_min;
	nt_min = n;
	return old;
}

// fused2_f32 writes x1 + x0 (or x1*0.5 + x0*0.5, rounded once: the pair
// average of ddpmpi.c; both commutative, bit for bit) into d0 and d1, one
// buffer by a reducing pass, the other by copying the block while it is in
// cache. Each rank's call may be in place or not, so d0 may be x0 and d1
// may be x1; the two ranks' buffers are different memory, and a rank's
// send and recv do not overlap otherwise (the contract). Writing both
// outputs in one loop with ordinary stores measured up to 4x slower on
// large buffers (a 256 MiB all-reduce: 100 against 21-23 ms, 2 ranks); with
// non-temporal stores (sum2_nt_f32, above) it is the fastest from 1 MiB
// slices.
static void fused2_f32(const float *x0, const float *x1, float *d0, float *d1, long n, int avg, int nt) {
	if (nt && d0 != x0 && d1 != x1 && (((uintptr_t)d0 | (uintptr_t)d1) & 15) == 0) {
		if (width() == 2 && (((uintptr_t)d0 | (uintptr_t)d1) & 63) == 0)
			sum2_nt512_f32(d0, d1, x0, x1, n, avg);
		else
			sum2_nt_f32(d0, d1, x0, x1, n, avg);
	} else if (d0 == x0) {
		acc2_f32(d0, x1, n, avg);
		memcpy(d1, d0, n * sizeof *d0);
	} else if (d1 == x1) {
		acc2_f32(d1, x0, n, avg);
		memcpy(d0, d1, n * sizeof *d0);
	} else {
		ddp_sum2_f32(d0, x0, x1, n, avg);
		memcpy(d1, d0, n * sizeof *d0);
	}
}

static void **srcs, **dsts;
static uint64_t *seen_frees; // each rank's frees at its last call
static int ndescs;
static int32_t pid; // this process's, taken once (getpid is a system call)
static char failure[256];
static int broken; // a rank could not map a peer's memory: every later call goes to MPI

const char *ddp_shm_failure(void) { return failure; }

int ddp_shm_taken, ddp_shm_broken;

int ddp_shm_prepare(int size) {
	pid = getpid();
	ddp_boot_id(); // read once here, on the owner thread
	broken = 0;
	if (size <= ndescs)
		return 0;
	void **s = realloc(srcs, size * sizeof *s);
	if (s != NULL)
		srcs = s;
	void **t = realloc(dsts, size * sizeof *t);
	if (t != NULL)
		dsts = t;
	uint64_t *f = realloc(seen_frees, size * sizeof *f);
	if (f != NULL)
		seen_frees = f;
	if (s == NULL || t == NULL || f == NULL)
		return -1;
	for (int k = ndescs; k < size; k++)
		seen_frees[k] = UINT64_MAX;
	ndescs = size;
	return 0;
}

// phase publishes phase ph of all-reduce k and waits until every rank has
// published it too; the wait has no deadline (the communicator's watchdog
// has one), and fails only when a peer has exited, closed its
// communicator or aborted the job.
static int phase(ddp_ctl *x, uint32_t k, int ph) {
	int p = k & 1;
	uint32_t t = k * 4 + ph;
	ddp_ctl_publish(x, p, t);
	__atomic_store_n(&x->target, t, __ATOMIC_RELEASE);
	int rc = ddp_ctl_wait(x, p, t, -1, 1);
	__atomic_store_n(&x->target, 0, __ATOMIC_RELEASE);
	return rc;
}

int ddp_shm_allreduce(ddp_ctl *x, int op, int dt, int esize, int count, uintptr_t send, uintptr_t recv) {
	ddp_shm_taken = 0;
	ddp_shm_broken = 0;
	calls++;
	int rank = x->rank, size = x->size;
	if (size > ndescs)
		return MPI_ERR_INTERN; // Open prepares for the communicator's size
	uint32_t k = ++x->k;
	int p = k & 1;
	size_t bytes = (size_t)count * esize;
	struct hdr *h = ddp_ctl_hdr(x, rank, p);
	h->count = count;
	h->dt = (uint8_t)dt;
	h->op = (uint8_t)op;
	h->esize = (uint8_t)esize;
	h->direct = 1;
	h->ok = 0;
	struct desc *mine = ddp_ctl_desc(x, rank, p);
	memset(mine, 0, sizeof *mine);
	mine->pid = pid;
	mine->boot = ddp_boot_id();
	pthread_mutex_lock(&slab_mu);
	mine->frees = frees;
	mine->ok = mine->boot != 0 && find(send, bytes, &mine->send) && find(recv, bytes, &mine->recv);
	pthread_mutex_unlock(&slab_mu);
	// A rank publishes its call only once its input is in place, so after
	// this phase every input is final.
	int rc = phase(x, k, 1);
	if (rc != MPI_SUCCESS)
		return rc;
	// Every rank reads the same headers and descriptors, so every rank
	// decides alike: all fail a call the ranks disagree on, and all leave
	// the call to MPI if one rank's buffers are not all shared (or the
	// ranks are not on one machine), or once a rank could not map.
	if ((rc = ddp_ctl_judge(x, p)) != MPI_SUCCESS)
		return rc;
	if (broken)
		return MPI_SUCCESS;
	for (int j = 0; j < size; j++) {
		const struct desc *d = ddp_ctl_desc(x, j, p);
		if (!d->ok || d->boot != mine->boot)
			return MPI_SUCCESS;
	}
	int ok = 1;
	for (int j = 0; j < size; j++) {
		if (j == rank) {
			srcs[j] = (void *)send;
			dsts[j] = (void *)recv;
			continue;
		}
		const struct desc *d = ddp_ctl_desc(x, j, p);
		unsigned char *s = attach(d->pid, &d->send, bytes);
		unsigned char *t = s ? attach(d->pid, &d->recv, bytes) : NULL;
		if (s == NULL || t == NULL) {
			if (failure[0] == 0)
				snprintf(failure, sizeof failure, "rank %d could not map rank %d's memory (/proc/%d/fd/%d): %s",
				         rank, j, (int)d->pid, (int)(s ? d->recv.fd : d->send.fd), strerror(errno));
			ok = 0;
			break;
		}
		srcs[j] = s + d->send.off;
		dsts[j] = t + d->recv.off;
		if (d->frees != seen_frees[j]) {
			drop_stale(d->pid);
			seen_frees[j] = d->frees;
		}
	}
	// Whether a mapping worked is each rank's own news: the ranks agree,
	// so that all map every peer or all leave the call to MPI. A failure
	// is not passing: they then leave every later call to MPI too,
	// without trying again.
	h->ok = ok;
	if ((rc = phase(x, k, 2)) != MPI_SUCCESS)
		return rc;
	if (exit_after == 2)
		_exit(3); // tests: a rank that dies while its peers read and write its buffers
	for (int j = 0; j < size; j++)
		ok &= ddp_ctl_hdr(x, j, p)->ok;
	if (!ok) {
		broken = 1;
		ddp_shm_broken = 1;
		return MPI_SUCCESS;
	}
	ddp_shm_taken = 1;
	// Rank r reduces elements [lo, hi), slices cut at 64-byte multiples of
	// the buffers (so that no two ranks write one cache line where the
	// buffers are 64-byte aligned, as pool blocks are).
	long per = 64 / esize;
	long lo = (long)((int64_t)count * rank / size) / per * per;
	long hi = rank == size - 1 ? count : (long)((int64_t)count * (rank + 1) / size) / per * per;
	long step = CHUNK / esize;
	if (size == 2 && dt == DDP_F32 && (op == DDP_SUM || op == DDP_AVG2)) {
		// The common case, in one pass without the chunk: the same
		// arithmetic as MPI_SUM and the pair average (both commutative, so
		// the same bits as x1 op x0).
		int nt = (hi - lo) * (long)esize >= nt_min;
		for (long i = lo; i < hi; i += step) {
			long n = hi - i < step ? hi - i : step;
			fused2_f32((const float *)srcs[0] + i, (const float *)srcs[1] + i, (float *)dsts[0] + i, (float *)dsts[1] + i,
			           n, op == DDP_AVG2, nt);
		}
		if (nt)
			_mm_sfence(); // the streamed stores reach memory before phase 3 says so
		lo = hi;
	}
	for (long i = lo; i < hi; i += step) {
		long n = hi - i < step ? hi - i : step;
		size_t off = (size_t)i * esize, nb = (size_t)n * esize;
		memcpy(chunk, (unsigned char *)srcs[0] + off, nb);
		// ddp_reduce_local(in, inout): inout = in op inout, so the chunk
		// holds x_k op (... op x_0): the ranks' contributions are combined
		// in rank order, as the staged all-reduce combines them.
		for (int j = 1; j < size; j++)
			ddp_reduce_local(dt, op, (unsigned char *)srcs[j] + off, chunk, (int)n);
		for (int j = 0; j < size; j++)
			memcpy((unsigned char *)dsts[j] + off, chunk, nb);
	}
	// The last phase is a barrier: past it every slice is in every buffer,
	// and no rank reads or writes another's buffer any more.
	return phase(x, k, 3);
}
