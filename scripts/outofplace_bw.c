// outofplace_bw times, on one thread, the two-rank all-reduce's kernels
// on buffers of one size: in place (d0 = x0 += x1, then x1 = d0), out of
// place with ordinary stores (d0 = x0 + x1, then d1 = d0), and out of place
// with non-temporal stores (d0 = d1 = x0 + x1 in one pass, streamed; 16
// bytes a store, and where the CPU has AVX-512, a whole line). It
// shows where an out-of-place all-reduce loses: both move the same bytes,
// but ordinary stores into buffers not in the cache read every line first,
// and out of place touches twice the memory, so less of it stays in the
// cache from one call to the next (docs/lab/small-messages.md).
//
//	gcc -O2 -o outofplace_bw scripts/outofplace_bw.c
//	./outofplace_bw 1048576 16777216 67108864
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK (64 << 10) // the backend's block: bytes a pass handles at once
#define RUNS 15

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((optimize("O3", "fp-contract=off"))) static void acc(float *restrict d, const float *restrict x, long n) {
	for (long i = 0; i < n; i++)
		d[i] = x[i] + d[i];
}

__attribute__((optimize("O3", "fp-contract=off"))) static void sum(float *restrict d, const float *restrict a, const float *restrict b,
                                                                   long n) {
	for (long i = 0; i < n; i++)
		d[i] = b[i] + a[i];
}

static void sum_nt(float *d0, float *d1, const float *a, const float *b, long n) {
	for (long i = 0; i < n; i += 4) {
		__m128 v = _mm_add_ps(_mm_load_ps(b + i), _mm_load_ps(a + i));
		_mm_stream_ps(d0 + i, v);
		_mm_stream_ps(d1 + i, v);
	}
}

__attribute__((target("avx512f"))) static void sum_nt512(float *d0, float *d1, const float *a, const float *b, long n) {
	for (long i = 0; i < n; i += 16) {
		__m512 v = _mm512_add_ps(_mm512_load_ps(b + i), _mm512_load_ps(a + i));
		_mm512_stream_ps(d0 + i, v);
		_mm512_stream_ps(d1 + i, v);
	}
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: outofplace_bw BYTES...\n");
		return 2;
	}
	static const char *names[] = {"in place", "out of place", "out of place, streamed", "streamed, AVX-512"};
	int kernels = __builtin_cpu_supports("avx512f") ? 4 : 3;
	printf("%12s  %-24s %12s %10s\n", "bytes", "kernel", "median_ms", "GB/s");
	for (int a = 1; a < argc; a++) {
		long bytes = atol(argv[a]) / CHUNK * CHUNK;
		if (bytes <= 0) {
			fprintf(stderr, "outofplace_bw: %s: want a size of at least %d bytes\n", argv[a], CHUNK);
			return 2;
		}
		long n = bytes / 4, step = CHUNK / 4;
		float *x0 = aligned_alloc(64, bytes), *x1 = aligned_alloc(64, bytes);
		float *d0 = aligned_alloc(64, bytes), *d1 = aligned_alloc(64, bytes);
		if (!x0 || !x1 || !d0 || !d1) {
			fprintf(stderr, "outofplace_bw: out of memory for 4 x %ld bytes\n", bytes);
			return 1;
		}
		for (long i = 0; i < n; i++)
			x0[i] = x1[i] = d0[i] = d1[i] = 1;
		for (int k = 0; k < kernels; k++) {
			double t[RUNS];
			for (int r = 0; r < RUNS; r++) {
				double t0 = now();
				for (long i = 0; i < n; i += step) {
					if (k == 0) {
						acc(x0 + i, x1 + i, step);
						memcpy(x1 + i, x0 + i, CHUNK);
					} else if (k == 1) {
						sum(d0 + i, x0 + i, x1 + i, step);
						memcpy(d1 + i, d0 + i, CHUNK);
					} else if (k == 2) {
						sum_nt(d0 + i, d1 + i, x0 + i, x1 + i, step);
					} else {
						sum_nt512(d0 + i, d1 + i, x0 + i, x1 + i, step);
					}
				}
				_mm_sfence();
				t[r] = now() - t0;
			}
			qsort(t, RUNS, sizeof t[0], cmp);
			// GB/s: the two inputs read and the two outputs written.
			printf("%12ld  %-24s %12.3f %10.1f\n", bytes, names[k], t[RUNS / 2] * 1e3, 4.0 * bytes / t[RUNS / 2] / 1e9);
		}
		free(x0), free(x1), free(d0), free(d1);
	}
	return 0;
}
