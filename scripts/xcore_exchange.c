// xcore_exchange times the least that two processes on two processors
// need to exchange n bytes both ways and sum them: the data movement of a
// two-rank staged all-reduce and nothing else. Each process, pinned to a
// processor of its own, copies its input into a staging buffer of its own
// (two, by parity) in memory both map, publishes with a release store to a
// flag on a line of its own, waits for the other's flag, claims its next
// staging buffer (prefetchw) if asked, prefetches the other's staged lines
// and sums the two into its output with the widest vectors the CPU has.
// No shared counter, no sleeping, no check of the call, no API. It prints,
// for each size, the median over iterations of the slower process's time
// per iteration (as the sweep and Open MPI's loop time their calls) and
// the whole loop's time per iteration, without and with the claim. Size 0
// exchanges the flags alone. (docs/lab/small-messages.md)
//
//	gcc -O2 -o xcore_exchange scripts/xcore_exchange.c
//	./xcore_exchange 0 64 1024 4096
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE 64
#define ITERS 20000
#define MAXB (16 << 10)

struct side {
	_Alignas(LINE) uint32_t flag;
	_Alignas(4096) float stage[2][MAXB / 4];
	_Alignas(LINE) float in[MAXB / 4], out[MAXB / 4];
	double t[ITERS];
};

static struct side *side; // two, shared between the processes
static uint32_t *ready;   // processes at the start line

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

#define SUM2                                                                                                                \
	{                                                                                                                       \
		for (long i = 0; i < n; i++)                                                                                        \
			d[i] = b[i] + a[i];                                                                                             \
	}
__attribute__((target("avx512f"), optimize("O3"))) static void sum2_512(float *restrict d, const float *restrict a,
                                                                        const float *restrict b, long n) SUM2;
__attribute__((target("avx2"), optimize("O3"))) static void sum2_256(float *restrict d, const float *restrict a,
                                                                     const float *restrict b, long n) SUM2;
__attribute__((optimize("O3"))) static void sum2_128(float *restrict d, const float *restrict a, const float *restrict b, long n) SUM2;

static void run(int me, long bytes, int claim) {
	int peer = me ^ 1;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(me, &set);
	if (sched_setaffinity(0, sizeof set, &set) != 0) {
		fprintf(stderr, "xcore_exchange: cannot run on processor %d\n", me);
		exit(1);
	}
	void (*sum2)(float *restrict, const float *restrict, const float *restrict, long) =
	    __builtin_cpu_supports("avx512f") ? sum2_512 : __builtin_cpu_supports("avx2") ? sum2_256 : sum2_128;
	struct side *s = &side[me], *o = &side[peer];
	long n = bytes / 4;
	for (long i = 0; i < n; i++)
		s->in[i] = (float)(me + 1);
	__atomic_add_fetch(ready, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(ready, __ATOMIC_ACQUIRE) < 2)
		_mm_pause();
	for (uint32_t k = 1; k <= ITERS; k++) {
		int p = k & 1;
		double t0 = now();
		memcpy(s->stage[p], s->in, bytes);
		__atomic_store_n(&s->flag, k, __ATOMIC_RELEASE);
		while (__atomic_load_n(&o->flag, __ATOMIC_ACQUIRE) < k)
			_mm_pause();
		// The peer has posted k, so it has read this side's k-1.
		if (claim)
			for (long i = 0; i < bytes; i += LINE)
				__asm__ volatile("prefetchw %0" : : "m"(*((const char *)s->stage[p ^ 1] + i)));
		for (long i = 0; i < bytes; i += LINE)
			_mm_prefetch((const char *)o->stage[p] + i, _MM_HINT_T0);
		sum2(s->out, side[0].stage[p], side[1].stage[p], n);
		s->t[k - 1] = now() - t0;
	}
	for (long i = 0; i < n; i++)
		if (s->out[i] != 3.0f) {
			fprintf(stderr, "xcore_exchange: process %d: element %ld is %g, want 3\n", me, i, s->out[i]);
			exit(1);
		}
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: xcore_exchange bytes...\n");
		return 2;
	}
	side = mmap(NULL, 2 * sizeof *side + LINE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (side == MAP_FAILED) {
		perror("xcore_exchange: mmap");
		return 1;
	}
	ready = (uint32_t *)(side + 2);
	static double worst[ITERS];
	printf("%8s %6s %14s %14s\n", "bytes", "claim", "median us", "loop us/iter");
	for (int a = 1; a < argc; a++)
		for (int claim = 0; claim <= 1; claim++) {
			long bytes = atol(argv[a]);
			if (bytes < 0 || bytes > MAXB || bytes % LINE != 0) {
				fprintf(stderr, "xcore_exchange: %s: want a multiple of %d up to %d bytes\n", argv[a], LINE, MAXB);
				return 2;
			}
			side[0].flag = side[1].flag = 0;
			*ready = 0;
			double t0 = now();
			pid_t child = fork();
			if (child < 0) {
				perror("xcore_exchange: fork");
				return 1;
			}
			if (child == 0) {
				run(1, bytes, claim);
				_exit(0);
			}
			run(0, bytes, claim);
			int st;
			if (waitpid(child, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
				return 1;
			double total = now() - t0;
			for (int i = 0; i < ITERS; i++)
				worst[i] = side[0].t[i] > side[1].t[i] ? side[0].t[i] : side[1].t[i];
			qsort(worst, ITERS, sizeof worst[0], cmp);
			printf("%8ld %6d %14.3f %14.3f\n", bytes, claim, worst[ITERS / 2] * 1e6, total / ITERS * 1e6);
		}
	return 0;
}
