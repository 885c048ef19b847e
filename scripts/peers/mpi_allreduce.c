/*
 * mpi_allreduce: Open MPI's own MPI_Allreduce (float32, MPI_SUM) timed the
 * way ddpgo's mpi backend is timed (mpi.test -mpi.sweep), the peer of the
 * all-reduce rows of scripts/compare.sh.
 *
 *   mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 *   mpirun -np 2 ./mpi_allreduce [CSV [LABEL]]
 *
 * Sizes are tensor bytes, 4 KiB to 256 MiB in steps of 4, each out of
 * place (send and receive buffers) and in place (MPI_IN_PLACE, as DDP
 * reduces a bucket). For each size and mode:
 *   - every rank fills its input with rank+1, and the result is checked
 *     against n(n+1)/2 before anything is timed;
 *   - the buffers are zeroed, so that repeated sums stay finite;
 *   - warmup calls, then 3 calls whose slowest rank's mean sets the number
 *     of timed calls: BENCH_BUDGET_S seconds' worth (default 0.6), at
 *     least 5 and at most 2000;
 *   - every call is timed on its own, with no barrier between calls (as
 *     nccl-tests does); a call's time is the slowest rank's; the median
 *     and the minimum over the calls are reported.
 * algbw = bytes / time and busbw = algbw * 2(n-1)/n (nccl-tests' bus
 * bandwidth for all-reduce), GB = 1e9 bytes.
 *
 * BENCH_MAX_BYTES (default 256 MiB) ends the sizes earlier: 4096 times
 * only 4 KiB.
 *
 * Rank 0 appends one row per size and mode to CSV (results.csv by
 * default; the header is written when the file is new), labelled LABEL.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { minIters = 5, maxIters = 2000 };
static const size_t minBytes = 4096, maxBytes = (size_t)256 << 20;

static int byValue(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void fill(float *p, size_t n, float v) {
	for (size_t i = 0; i < n; i++)
		p[i] = v;
}

/* allreduce runs one call: in place on recv, or from send into recv. */
static void allreduce(int inPlace, float *send, float *recv, int count) {
	MPI_Allreduce(inPlace ? MPI_IN_PLACE : send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const char *path = argc > 1 ? argv[1] : "results.csv";
	const char *label = argc > 2 ? argv[2] : "default";
	const char *b = getenv("BENCH_BUDGET_S");
	double budget = b && atof(b) > 0 ? atof(b) : 0.6;
	const char *m = getenv("BENCH_MAX_BYTES");
	size_t lastBytes = m && atoll(m) >= (long long)minBytes && (size_t)atoll(m) <= maxBytes ? (size_t)atoll(m) : maxBytes;

	float *send = NULL, *recv = NULL;
	if (posix_memalign((void **)&send, 4096, maxBytes) || posix_memalign((void **)&recv, 4096, maxBytes)) {
		fprintf(stderr, "mpi_allreduce: rank %d cannot allocate 2 x 256 MiB\n", rank);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	double *mine = malloc(maxIters * sizeof *mine), *slowest = malloc(maxIters * sizeof *slowest);

	FILE *csv = NULL;
	if (rank == 0) {
		char lib[MPI_MAX_LIBRARY_VERSION_STRING];
		int len;
		MPI_Get_library_version(lib, &len);
		lib[strcspn(lib, "\n")] = 0;
		csv = fopen(path, "a");
		if (!csv) {
			perror(path);
			MPI_Abort(MPI_COMM_WORLD, 1);
		}
		fseek(csv, 0, SEEK_END);
		if (ftell(csv) == 0)
			fprintf(csv, "impl,label,dtype,mode,world,bytes,count,iters,median_us,min_us,algbw_GBps,busbw_GBps\n");
		printf("# %s; %d ranks; label %s; %.2f s of timed calls per size\n", lib, size, label, budget);
		printf("%-10s %10s %10s %6s %11s %11s %10s %10s\n", "mode", "bytes", "count", "iters", "median_us", "min_us",
		       "algbw_GB/s", "busbw_GB/s");
	}
	const float want = (float)size * (float)(size + 1) / 2;
	const double busFactor = 2.0 * (size - 1) / size;

	for (int inPlace = 0; inPlace <= 1; inPlace++) {
		for (size_t bytes = minBytes; bytes <= lastBytes; bytes *= 4) {
			int count = (int)(bytes / sizeof(float));
			float *out = recv;
			/* Checked first: in place, the input is the output buffer. */
			fill(inPlace ? recv : send, (size_t)count, (float)(rank + 1));
			allreduce(inPlace, send, recv, count);
			for (int i = 0; i < count; i++) {
				if (out[i] != want) {
					fprintf(stderr, "mpi_allreduce: rank %d, %zu bytes: element %d is %g, want %g\n", rank, bytes, i,
						out[i], want);
					MPI_Abort(MPI_COMM_WORLD, 2);
				}
			}
			fill(send, (size_t)count, 0);
			fill(recv, (size_t)count, 0);
			int warmup = bytes >= ((size_t)64 << 20) ? 2 : 10;
			for (int i = 0; i < warmup; i++)
				allreduce(inPlace, send, recv, count);

			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = MPI_Wtime();
			for (int i = 0; i < 3; i++)
				allreduce(inPlace, send, recv, count);
			double est = (MPI_Wtime() - t0) / 3, estSlowest;
			MPI_Allreduce(&est, &estSlowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
			int iters = estSlowest > 0 ? (int)(budget / estSlowest) : maxIters;
			iters = iters < minIters ? minIters : iters > maxIters ? maxIters : iters;

			MPI_Barrier(MPI_COMM_WORLD);
			for (int i = 0; i < iters; i++) {
				double s = MPI_Wtime();
				allreduce(inPlace, send, recv, count);
				mine[i] = MPI_Wtime() - s;
			}
			MPI_Reduce(mine, slowest, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
			if (rank == 0) {
				qsort(slowest, (size_t)iters, sizeof *slowest, byValue);
				double med = iters % 2 ? slowest[iters / 2] : (slowest[iters / 2 - 1] + slowest[iters / 2]) / 2;
				double algbw = (double)bytes / med / 1e9;
				const char *mode = inPlace ? "inplace" : "outofplace";
				printf("%-10s %10zu %10d %6d %11.2f %11.2f %10.3f %10.3f\n", mode, bytes, count, iters, med * 1e6,
				       slowest[0] * 1e6, algbw, algbw * busFactor);
				fflush(stdout);
				fprintf(csv, "mpi,%s,float32,%s,%d,%zu,%d,%d,%.3f,%.3f,%.4f,%.4f\n", label, mode, size, bytes, count,
					iters, med * 1e6, slowest[0] * 1e6, algbw, algbw * busFactor);
			}
		}
	}
	if (csv && fclose(csv) != 0) {
		perror(path);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	free(mine);
	free(slowest);
	free(send);
	free(recv);
	MPI_Finalize();
	return 0;
}
