/*
 * memcpy_bw: the memory roofline a CPU all-reduce runs against.
 *
 *   cc -O3 -march=native -pthread -o memcpy_bw memcpy_bw.c
 *   ./memcpy_bw [CSV]                       (CSV: memcpy_bw.csv by default)
 *
 * Three arrays of 256 MiB each (float32). Every kernel runs on 1 thread
 * and on 2, each thread on its own CPU over its own contiguous share of
 * the arrays; a repetition is timed from the moment every thread is
 * released until the last one finishes. After WARMUP repetitions, REPS
 * are timed; the median and the best are reported.
 *
 * Kernels:
 *   memcpy_glibc   dst = src through glibc's memcpy (it may choose
 *                  non-temporal stores for large copies)
 *   copy_loop      dst[i] = src[i], a loop the compiler vectorises
 *   add3           c[i] = a[i] + b[i]
 *   add_inplace    a[i] += b[i]: one step of an in-place reduction
 *
 * Bandwidth, GB = 1e9 bytes:
 *   copy_GBps  bytes of output (256 MiB) per second
 *   rw_GBps    bytes read and written per second: 2 x 256 MiB for the
 *              copies, 3 x 256 MiB for add3 and add_inplace (write-allocate
 *              traffic is not counted, as STREAM does not count it).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { WARMUP = 2, REPS = 11, MAXTHREADS = 2 };
static const size_t arrayBytes = (size_t)256 << 20;

static float *A, *B, *C;

static double seconds(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef void kernel(float *restrict dst, const float *restrict x, const float *restrict y, size_t n);

static void memcpyKernel(float *restrict dst, const float *restrict x, const float *restrict y, size_t n) {
	(void)y;
	memcpy(dst, x, n * sizeof *dst);
}

static void copyLoop(float *restrict dst, const float *restrict x, const float *restrict y, size_t n) {
	(void)y;
	for (size_t i = 0; i < n; i++)
		dst[i] = x[i];
}

static void add3(float *restrict dst, const float *restrict x, const float *restrict y, size_t n) {
	for (size_t i = 0; i < n; i++)
		dst[i] = x[i] + y[i];
}

/* dst is A itself here: a += b. */
static void addInPlace(float *restrict dst, const float *restrict x, const float *restrict y, size_t n) {
	(void)x;
	for (size_t i = 0; i < n; i++)
		dst[i] += y[i];
}

struct kernelSpec {
	const char *name;
	kernel *fn;
	int arraysTouched; /* for rw_GBps */
	int inPlace;       /* writes A instead of C */
};

static const struct kernelSpec kernels[] = {
	{"memcpy_glibc", memcpyKernel, 2, 0},
	{"copy_loop", copyLoop, 2, 0},
	{"add3", add3, 3, 0},
	{"add_inplace", addInPlace, 3, 1},
};

/* A team of threads that run one kernel over their shares, REPS times. */
struct team {
	int threads;
	const struct kernelSpec *k; /* NULL: first touch of the arrays */
	pthread_barrier_t start, done;
	double times[WARMUP + REPS];
};

struct member {
	struct team *t;
	int id;
};

static void *work(void *arg) {
	struct member *m = arg;
	struct team *t = m->t;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(m->id % (ncpu > 0 ? ncpu : 1), &set);
	pthread_setaffinity_np(pthread_self(), sizeof set, &set);

	size_t n = arrayBytes / sizeof(float) / (size_t)t->threads;
	size_t lo = n * (size_t)m->id;
	int rounds = t->k ? WARMUP + REPS : 1;
	for (int r = 0; r < rounds; r++) {
		pthread_barrier_wait(&t->start);
		double t0 = seconds();
		if (!t->k) {
			for (size_t i = lo; i < lo + n; i++) {
				A[i] = (float)(i % 97);
				B[i] = 0.5f;
				C[i] = 0;
			}
		} else {
			float *dst = t->k->inPlace ? A + lo : C + lo;
			t->k->fn(dst, A + lo, B + lo, n);
		}
		pthread_barrier_wait(&t->done);
		if (m->id == 0)
			t->times[r] = seconds() - t0;
	}
	return NULL;
}

static void runTeam(struct team *t) {
	pthread_t th[MAXTHREADS];
	struct member ms[MAXTHREADS];
	pthread_barrier_init(&t->start, NULL, (unsigned)t->threads);
	pthread_barrier_init(&t->done, NULL, (unsigned)t->threads);
	for (int i = 0; i < t->threads; i++) {
		ms[i] = (struct member){t, i};
		if (pthread_create(&th[i], NULL, work, &ms[i]) != 0) {
			perror("pthread_create");
			exit(1);
		}
	}
	for (int i = 0; i < t->threads; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&t->start);
	pthread_barrier_destroy(&t->done);
}

static int byValue(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	const char *path = argc > 1 ? argv[1] : "memcpy_bw.csv";
	if (posix_memalign((void **)&A, 4096, arrayBytes) || posix_memalign((void **)&B, 4096, arrayBytes) ||
	    posix_memalign((void **)&C, 4096, arrayBytes)) {
		fprintf(stderr, "memcpy_bw: cannot allocate 3 x 256 MiB\n");
		return 1;
	}
	/* Each page is first touched by the thread that will use it. */
	struct team touch = {.threads = MAXTHREADS, .k = NULL};
	runTeam(&touch);

	FILE *csv = fopen(path, "w");
	if (!csv) {
		perror(path);
		return 1;
	}
	fprintf(csv, "kernel,threads,buffer_bytes,reps,median_ms,best_ms,copy_GBps_median,rw_GBps_median,copy_GBps_best,rw_GBps_best\n");
	printf("# arrays of %zu MiB; copy = output bytes/s, rw = bytes read+written/s; GB = 1e9 bytes; median and best of %d\n",
	       arrayBytes >> 20, REPS);
	printf("%-13s %7s %10s %10s %10s %10s\n", "kernel", "threads", "median_ms", "best_ms", "copy_GB/s", "rw_GB/s");
	for (size_t k = 0; k < sizeof kernels / sizeof kernels[0]; k++) {
		for (int threads = 1; threads <= MAXTHREADS; threads++) {
			struct team t = {.threads = threads, .k = &kernels[k]};
			runTeam(&t);
			double *timed = t.times + WARMUP;
			qsort(timed, REPS, sizeof *timed, byValue);
			double med = timed[REPS / 2], best = timed[0];
			double out = (double)arrayBytes, rw = out * kernels[k].arraysTouched;
			printf("%-13s %7d %10.2f %10.2f %10.2f %10.2f\n", kernels[k].name, threads, med * 1e3, best * 1e3, out / med / 1e9,
			       rw / med / 1e9);
			fprintf(csv, "%s,%d,%zu,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", kernels[k].name, threads, arrayBytes, REPS, med * 1e3,
				best * 1e3, out / med / 1e9, rw / med / 1e9, out / best / 1e9, rw / best / 1e9);
			fflush(stdout);
		}
	}
	/* Read a result, so that no kernel's stores are dead. */
	volatile float sink = A[12345] + C[arrayBytes / sizeof(float) - 1];
	(void)sink;
	return fclose(csv) == 0 ? 0 : 1;
}
