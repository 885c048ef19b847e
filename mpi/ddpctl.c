//go:build mpi

// The control segment of a communicator whose ranks share a machine (see
// "Shared memory" in the package documentation): one memfd that every rank
// maps at Open, holding for each rank the headers of its all-reduces (a
// number, the call, flags), its staged inputs, and its identity. After
// Open its all-reduces need no MPI call to agree, to exchange inputs or to
// wait for each other: MPI is left the setup and the fallback.
//
// Every rank numbers its all-reduces 1, 2, 3... (k). Rank r publishes
// phase ph of all-reduce k by storing k*4+ph in the word of its header of
// parity k%2; a staged all-reduce has one phase, one that reads the peers'
// buffers directly three (the call, the mappings agreed, the slices done).
// A rank writes its header and staging buffer of parity p for all-reduce
// k only once it has completed k-1, which it did only once every rank had
// published k-1, which each did only once it had completed k-2 and with
// it every read of the buffers of parity p: two of each suffice.
//
// Every publication also adds one to the segment's count of arrivals, so
// a rank that has published n words waits until the count reaches n times
// the rank count. It polls the count a while (spin_ns; where the ranks
// outnumber the processors, it calls sched_yield between looks instead,
// yield_ns), then sleeps on it with futex(2), after counting itself in the
// sleepers, which the last rank of a step to publish reads and wakes when
// they are not zero: a wait sleeps once, whichever ranks are late, and
// wakes once. Sleeps are cut into slices (liveness_ns) after each of which
// the waiter reads /proc/<pid>/stat of the first rank whose word it lacks:
// a rank that has exited (or whose pid now names another process) fails
// the wait at once, and one that is stopped is named when the wait's
// deadline passes. A rank that aborts the job sets the segment's abort
// word and wakes every sleeper first; one that closes its communicator
// sets the closed mark in its identity, which fails a wait for it at the
// next of those checks.

#define _GNU_SOURCE
#include "ddpmpi.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>

#define LINE 64
#define PAGE 4096

// The segment's first page: the abort word and its cause, and the count
// of every rank's publications with its sleepers, each on a line of its
// own.
struct head {
	uint32_t abort; // 0, or 1 + the rank that aborted the job (ABORTING while it writes the cause)
	int32_t pad;
	char cause[248];
	_Alignas(LINE) uint32_t arrivals; // the futex word
	_Alignas(LINE) uint32_t sleepers;
};

// A rank's identity, for the liveness checks.
struct ident {
	int32_t pid;
	uint32_t closed; // 1 once the rank has closed its communicator
	uint64_t start; // its start time, in clock ticks after boot (/proc/<pid>/stat)
};

// Each rank's part of the segment, page-aligned:
//   [0, 2 lines)    the headers of parity 0 and 1
//   [3, 4)          identity
//   [4, 8)          the descriptors of direct all-reduces, 2 lines a parity
//   [8 lines, ...)  the staging buffers of parity 0 and 1
#define OFF_IDENT (3 * LINE)

// The abort word's flag while the aborting rank writes its cause: waits
// see the abort only once the cause is there to tell.
#define ABORTING 0x80000000u
#define OFF_DESC (4 * LINE)
#define OFF_STAGE PAGE

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int reached(uint32_t w, uint32_t t) { return (int32_t)(w - t) >= 0; }

static unsigned char *part(const ddp_ctl *x, int r) { return x->seg + PAGE + (size_t)r * x->stride; }
struct hdr *ddp_ctl_hdr(const ddp_ctl *x, int r, int p) { return (struct hdr *)(part(x, r) + p * LINE); }
static struct ident *ident(const ddp_ctl *x, int r) { return (struct ident *)(part(x, r) + OFF_IDENT); }
void *ddp_ctl_desc(const ddp_ctl *x, int r, int p) { return part(x, r) + OFF_DESC + p * 2 * LINE; }
static struct head *head(const ddp_ctl *x) { return (struct head *)x->seg; }

// ddp_ctl_input is where rank r's input of the staged all-reduce of
// parity p lies: in its header, or in its staging buffer.
static const void *input(const ddp_ctl *x, int r, int p, size_t bytes) {
	if (bytes <= DDP_CTL_INLINE)
		return ddp_ctl_hdr(x, r, p)->data;
	return part(x, r) + OFF_STAGE + (size_t)p * x->stage;
}

static long futex(uint32_t *w, int op, uint32_t v, const struct timespec *ts) {
	// Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
	return syscall(SYS_futex, w, op, v, ts, NULL, 0);
}

// ---- liveness ------------------------------------------------------------

// proc_state reads the state of process pid started at start: DDP_PEER_GONE
// if it has exited (or is a zombie, or the pid names another process now),
// DDP_PEER_STOPPED if it is stopped (SIGSTOP, or a debugger), else
// DDP_PEER_RUNNING. *startp receives its start time when start is 0.
static int proc_state(int32_t pid, uint64_t start, uint64_t *startp) {
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ESRCH ? DDP_PEER_GONE : DDP_PEER_RUNNING;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return DDP_PEER_GONE; // the process went while we read
	buf[n] = 0;
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses.
	char *p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ')
		return DDP_PEER_RUNNING;
	char state = p[2];
	// The start time is field 22; the state is field 3.
	int field = 3;
	unsigned long long st = 0;
	for (char *q = p + 2; *q; q++)
		if (*q == ' ' && ++field == 22) {
			st = strtoull(q + 1, NULL, 10);
			break;
		}
	if (startp != NULL)
		*startp = st;
	if (start != 0 && st != start)
		return DDP_PEER_GONE;
	switch (state) {
	case 'Z':
	case 'X':
	case 'x':
		return DDP_PEER_GONE;
	case 'T':
	case 't':
		return DDP_PEER_STOPPED;
	}
	return DDP_PEER_RUNNING;
}

// ---- setup -----------------------------------------------------------

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

int ddp_ctl_open(MPI_Comm c, int rank, int size, int stage, long long spin_ns, long long yield_ns, ddp_ctl **out) {
	*out = NULL;
	struct {
		int32_t ok, pid, fd, pad;
		uint64_t ino, len, boot;
	} d = {0};
	size_t stride = round_up(OFF_STAGE + 2 * (size_t)round_up(stage, LINE), PAGE);
	size_t len = PAGE + (size_t)size * stride;
	unsigned char *seg = NULL;
	int fd = -1;
	if (rank == 0) {
		fd = memfd_create("ddpgo-ctl", MFD_CLOEXEC);
		struct stat st;
		if (fd >= 0 && ftruncate(fd, (off_t)len) == 0 && fstat(fd, &st) == 0) {
			void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (p != MAP_FAILED) {
				seg = p;
				d = (typeof(d)){1, getpid(), fd, 0, (uint64_t)st.st_ino, len, ddp_boot_id()};
			}
		}
	}
	int rc = MPI_Bcast(&d, sizeof d, MPI_BYTE, 0, c);
	if (rc != MPI_SUCCESS)
		goto fail;
	if (rank != 0 && d.ok && d.len == len && d.boot == ddp_boot_id() && d.boot != 0) {
		char path[64];
		snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)d.pid, (int)d.fd);
		int f = open(path, O_RDWR | O_CLOEXEC);
		struct stat st;
		if (f >= 0 && fstat(f, &st) == 0 && (uint64_t)st.st_ino == d.ino && (uint64_t)st.st_size >= len) {
			void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
			if (p != MAP_FAILED)
				seg = p;
		}
		if (f >= 0)
			close(f);
	}
	ddp_ctl *x = NULL;
	if (seg != NULL) {
		x = calloc(1, sizeof *x + (size_t)size * sizeof x->peers[0]);
		if (x != NULL) {
			*x = (ddp_ctl){.seg = seg, .len = len, .stride = stride, .stage = (size_t)round_up(stage, LINE),
			               .rank = rank, .size = size, .spin_ns = spin_ns, .yield_ns = yield_ns,
			               .liveness_ns = 50 * 1000000LL};
			struct ident *me = ident(x, rank);
			me->pid = getpid();
			proc_state(me->pid, 0, &me->start);
		}
	}
	// Also the barrier after which every rank's identity is in place.
	int ok = x != NULL;
	rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, c);
	if (fd >= 0)
		close(fd); // the peers have opened it, or never will
	fd = -1;
	if (rc != MPI_SUCCESS || !ok) {
		free(x);
		goto fail;
	}
	for (int r = 0; r < size; r++) {
		x->peers[r].pid = ident(x, r)->pid;
		x->peers[r].start = ident(x, r)->start;
	}
	*out = x;
	return MPI_SUCCESS;
fail:
	if (seg != NULL)
		munmap(seg, len);
	if (fd >= 0)
		close(fd);
	return rc;
}

void ddp_ctl_free(ddp_ctl *x) {
	if (x == NULL)
		return;
	munmap(x->seg, x->len);
	free(x);
}

// ---- publishing and waiting ---------------------------------------------

void ddp_ctl_publish(ddp_ctl *x, int p, uint32_t t) {
	__atomic_store_n(&ddp_ctl_hdr(x, x->rank, p)->word, t, __ATOMIC_RELEASE);
	// Sequentially consistent, with the sleeper's count below: either the
	// sleeper sees the new count, or the last of a step to publish sees
	// the sleeper and wakes it.
	struct head *h = head(x);
	uint32_t n = __atomic_add_fetch(&h->arrivals, 1, __ATOMIC_SEQ_CST);
	x->step++;
	if (n % (uint32_t)x->size == 0 && __atomic_load_n(&h->sleepers, __ATOMIC_SEQ_CST) != 0)
		futex(&h->arrivals, FUTEX_WAKE, INT_MAX, NULL);
}

// all_reached reports whether every rank has published t in its header of
// parity p; if not, x->lag is the first that has not.
static int all_reached(ddp_ctl *x, int p, uint32_t t) {
	for (int i = 0; i < x->size; i++) {
		int r = x->lag + i < x->size ? x->lag + i : x->lag + i - x->size;
		if (!reached(__atomic_load_n(&ddp_ctl_hdr(x, r, p)->word, __ATOMIC_ACQUIRE), t)) {
			x->lag = r;
			return 0;
		}
	}
	return 1;
}

// aborted reports whether a peer has aborted the job. This rank's own
// abort ends none of its waits: no operation of a rank that aborts
// completes afterwards.
static int aborted(ddp_ctl *x) {
	uint32_t a = __atomic_load_n(&head(x)->abort, __ATOMIC_ACQUIRE);
	if (a == 0 || (a & ABORTING) != 0 || a == (uint32_t)x->rank + 1)
		return 0;
	x->lag = (int)a - 1;
	x->lag_state = DDP_PEER_ABORTED;
	return 1;
}

// stepped reports whether every rank has published as often as this one.
static int stepped(ddp_ctl *x) {
	return reached(__atomic_load_n(&head(x)->arrivals, __ATOMIC_ACQUIRE), x->step * (uint32_t)x->size);
}

int ddp_ctl_wait(ddp_ctl *x, int p, uint32_t t, long long timeout_ns, int spin) {
	x->lag_state = 0;
	if (stepped(x))
		return MPI_SUCCESS;
	if (aborted(x))
		return DDP_PEER_ABORTED;
	uint64_t start = now_ns();
	uint64_t deadline = timeout_ns >= 0 ? start + (uint64_t)timeout_ns : UINT64_MAX;
	if (spin && x->spin_ns > 0) {
		uint64_t end = start + (uint64_t)x->spin_ns;
		for (unsigned i = 1;; i++) {
			_mm_pause();
			if (stepped(x))
				return MPI_SUCCESS;
			if (i % 64 == 0) {
				uint64_t now = now_ns();
				if (now >= end || now >= deadline)
					break;
			}
		}
	}
	if (spin && x->yield_ns > 0) {
		// Where the ranks outnumber the processors, the rank waited for
		// may be waiting for this one's: give it up at once, and again
		// each time the scheduler comes back, a while before sleeping.
		uint64_t end = start + (uint64_t)x->yield_ns;
		for (;;) {
			sched_yield();
			if (stepped(x))
				return MPI_SUCCESS;
			if (aborted(x))
				return DDP_PEER_ABORTED;
			uint64_t now = now_ns();
			if (now >= end || now >= deadline)
				break;
		}
	}
	x->sleeps++;
	struct head *h = head(x);
	uint32_t goal = x->step * (uint32_t)x->size;
	uint64_t checked = start;
	for (;;) {
		if (aborted(x))
			return DDP_PEER_ABORTED;
		uint64_t now = now_ns();
		if (now - checked >= (uint64_t)x->liveness_ns || now >= deadline) {
			// The rank to watch: the first that has not published t.
			checked = now;
			// Every rank has published t, whatever the count says: a
			// rank that died between its word and its count would
			// otherwise hold this wait past its deadline.
			if (all_reached(x, p, t))
				return MPI_SUCCESS;
			int r = x->lag;
			int s = ddp_ctl_state(x, r);
			if (s == DDP_PEER_GONE || s == DDP_PEER_CLOSED) {
				x->lag_state = s;
				return s;
			}
			if (now >= deadline) {
				x->lag_state = s;
				return DDP_WAIT_TIMEOUT;
			}
		}
		uint64_t left = deadline - now;
		if (left > (uint64_t)x->liveness_ns)
			left = (uint64_t)x->liveness_ns;
		struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
		__atomic_fetch_add(&h->sleepers, 1, __ATOMIC_SEQ_CST);
		uint32_t v = __atomic_load_n(&h->arrivals, __ATOMIC_SEQ_CST);
		if (!reached(v, goal))
			futex(&h->arrivals, FUTEX_WAIT, v, &ts);
		__atomic_fetch_sub(&h->sleepers, 1, __ATOMIC_SEQ_CST);
		if (stepped(x))
			return MPI_SUCCESS;
	}
}

static long long abort_delay_ns; // tests: a pause between claiming the abort and its cause

void ddp_ctl_test_abort_delay(long long ns) { __atomic_store_n(&abort_delay_ns, ns, __ATOMIC_RELAXED); }

void ddp_ctl_abort(ddp_ctl *x, const char *cause) {
	struct head *h = head(x);
	uint32_t zero = 0, me = (uint32_t)x->rank + 1;
	if (__atomic_compare_exchange_n(&h->abort, &zero, ABORTING | me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
		// The first to abort claims the word, writes the cause, then
		// publishes: a peer that sees the abort reads the whole cause. If
		// this rank dies in between, its peers' waits find it gone.
		long long d = __atomic_load_n(&abort_delay_ns, __ATOMIC_RELAXED);
		if (d > 0)
			nanosleep(&(struct timespec){(time_t)(d / 1000000000), (long)(d % 1000000000)}, NULL);
		strncpy(h->cause, cause, sizeof h->cause - 1);
		__atomic_store_n(&h->abort, me, __ATOMIC_RELEASE);
	}
	futex(&h->arrivals, FUTEX_WAKE, INT_MAX, NULL);
}

const char *ddp_ctl_abort_cause(const ddp_ctl *x) { return head(x)->cause; }

int ddp_ctl_pid(const ddp_ctl *x, int r) { return x->peers[r].pid; }

void ddp_ctl_close(ddp_ctl *x) { __atomic_store_n(&ident(x, x->rank)->closed, 1, __ATOMIC_RELEASE); }

int ddp_ctl_state(const ddp_ctl *x, int r) {
	if (__atomic_load_n(&ident(x, r)->closed, __ATOMIC_ACQUIRE))
		return DDP_PEER_CLOSED;
	return proc_state(x->peers[r].pid, x->peers[r].start, NULL);
}

int ddp_ctl_missing(ddp_ctl *x, int *ranks, int max, int *states) {
	uint32_t t = __atomic_load_n(&x->target, __ATOMIC_ACQUIRE);
	if (t == 0)
		return -1; // not waiting
	int p = (int)(t / 4) & 1, n = 0;
	for (int r = 0; r < x->size && n < max; r++)
		if (!reached(__atomic_load_n(&ddp_ctl_hdr(x, r, p)->word, __ATOMIC_ACQUIRE), t)) {
			ranks[n] = r;
			states[n] = ddp_ctl_state(x, r);
			n++;
		}
	return n;
}

// ---- staged all-reduces ------------------------------------------------

// judge compares every rank's call of all-reduce k (parity p) with this
// rank's: every rank reads the same headers and reaches the same verdict.
int ddp_ctl_judge(ddp_ctl *x, int p) {
	const struct hdr *me = ddp_ctl_hdr(x, x->rank, p);
	for (int r = 0; r < x->size; r++) {
		const struct hdr *h = ddp_ctl_hdr(x, r, p);
		if (h->count != me->count || h->dt != me->dt || h->op != me->op || h->esize != me->esize || h->direct != me->direct) {
			x->peer[0] = r;
			x->peer[1] = h->count;
			x->peer[2] = h->dt;
			x->peer[3] = h->op;
			return DDP_ERR_MISMATCH;
		}
	}
	return MPI_SUCCESS;
}

int ddp_ctl_post(ddp_ctl *x, int op, int dt, int esize, int count, uintptr_t send, uintptr_t recv) {
	uint32_t k = ++x->k;
	int p = k & 1;
	size_t bytes = (size_t)count * esize;
	if (bytes > 0)
		memcpy((void *)input(x, x->rank, p, bytes), (const void *)send, bytes);
	// The header last, next to the word: the peers poll that line, and
	// its stores then go out together, in one ownership of the line.
	struct hdr *h = ddp_ctl_hdr(x, x->rank, p);
	h->count = count;
	h->dt = (uint8_t)dt;
	h->op = (uint8_t)op;
	h->esize = (uint8_t)esize;
	h->direct = 0;
	__atomic_store_n(&x->target, k * 4 + 1, __ATOMIC_RELEASE);
	ddp_ctl_publish(x, p, k * 4 + 1);
	// A rank that finds every rank posted (the last to post always does)
	// finishes here: its caller then needs no second call (one cgo
	// transition less an all-reduce, for that rank).
	return ddp_ctl_poll(x, recv);
}

// claim asks for ownership of n bytes at p, the staging buffer this rank
// writes next: the peers read its last contents and hold its lines, and
// every store of the next post would otherwise wait for one to come back.
// PREFETCHW, where the CPU has it (a NOP elsewhere).
static void claim(const void *p, size_t n) {
	for (size_t i = 0; i < n; i += LINE)
		__asm__ volatile("prefetchw %0" : : "m"(*((const char *)p + i)));
}

// finish judges the staged all-reduce just posted and computes this
// rank's output from every rank's staged input, in rank order.
static int finish(ddp_ctl *x, uintptr_t recv) {
	int p = x->k & 1;
	int rc = ddp_ctl_judge(x, p);
	if (rc != MPI_SUCCESS)
		return rc;
	const struct hdr *me = ddp_ctl_hdr(x, x->rank, p);
	long n = me->count;
	size_t bytes = (size_t)n * me->esize;
	__atomic_store_n(&x->target, 0, __ATOMIC_RELEASE);
	if (bytes == 0)
		return MPI_SUCCESS;
	// Every peer has posted this all-reduce, so it has read this rank's
	// previous input: that buffer is free for the next post.
	if (bytes > DDP_CTL_INLINE)
		claim(input(x, x->rank, p ^ 1, bytes), bytes);
	// The peers' inputs are in their caches: ask for every line at once,
	// rather than as the loop below reaches it (about 4% at 4 KiB,
	// docs/small-messages.md).
	if (bytes > DDP_CTL_INLINE)
		for (int r = 0; r < x->size; r++)
			if (r != x->rank)
				for (size_t i = 0; i < bytes; i += LINE)
					_mm_prefetch((const char *)input(x, r, p, bytes) + i, _MM_HINT_T0);
	void *d = (void *)recv;
	if (x->size == 2 && me->dt == DDP_F32 && (me->op == DDP_SUM || me->op == DDP_AVG2)) {
		ddp_sum2_f32(d, input(x, 0, p, bytes), input(x, 1, p, bytes), n, me->op == DDP_AVG2);
		return MPI_SUCCESS;
	}
	// recv is this rank's own memory, never a staged copy: the inputs stay.
	memcpy(d, input(x, 0, p, bytes), bytes);
	for (int r = 1; r < x->size; r++)
		ddp_reduce_local(me->dt, me->op, input(x, r, p, bytes), d, (int)n);
	return MPI_SUCCESS;
}

int ddp_ctl_poll(ddp_ctl *x, uintptr_t recv) {
	if (!stepped(x))
		return DDP_PENDING;
	return finish(x, recv);
}

int ddp_ctl_complete(ddp_ctl *x, uintptr_t recv, long long timeout_ns, int spin) {
	int rc = ddp_ctl_wait(x, x->k & 1, x->k * 4 + 1, timeout_ns, spin);
	if (rc != MPI_SUCCESS)
		return rc;
	return finish(x, recv);
}
