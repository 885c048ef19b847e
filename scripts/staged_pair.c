// staged_pair times the mpi backend's staged all-reduce (ddpctl.c) alone:
// ddp_ctl_post and, unless the post finished it, ddp_ctl_complete, float32
// sums, called from C in a loop on each rank, with no Go, no queue and no
// Work between them. It is the floor under the sweep's small sizes, and
// what a change to the control segment's protocol or kernels is measured
// with first (docs/small-messages.md). Each call is timed with two clock readings,
// as the sweep and scripts/peers/mpi_allreduce.c time theirs; the median
// of the slowest rank per call is printed.
//
//	mpicc -O2 -I mpi -o staged_pair scripts/staged_pair.c mpi/ddpctl.c mpi/ddpshm.c mpi/ddpmpi.c
//	mpirun -np 2 --bind-to core ./staged_pair 64 1024 4096 8192
#define _GNU_SOURCE
#include "ddpmpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALLS 100000
#define STAGE (16 << 10) // the backend's staging size (directMin)

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	ddp_ctl *x;
	// Spin 50 us before sleeping, as the backend does where the ranks fit
	// the processors.
	if (ddp_ctl_open(MPI_COMM_WORLD, rank, size, STAGE, 50000, 0, &x) != MPI_SUCCESS || x == NULL) {
		fprintf(stderr, "rank %d: no control segment\n", rank);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	float *send = aligned_alloc(512, STAGE), *recv = aligned_alloc(512, STAGE);
	double *t = malloc(CALLS * sizeof *t);
	if (rank == 0)
		printf("%d ranks, %d calls a size; median of the slowest rank per call\n%8s %10s\n", size, CALLS, "bytes", "median_us");
	for (int a = 1; a < argc; a++) {
		int bytes = atoi(argv[a]);
		if (bytes <= 0 || bytes > STAGE || bytes % 4 != 0) {
			if (rank == 0)
				fprintf(stderr, "bytes %s: want a multiple of 4 in (0, %d]\n", argv[a], STAGE);
			continue;
		}
		for (int i = 0; i < bytes / 4; i++)
			send[i] = (float)(rank + 1);
		for (int i = 0; i < CALLS; i++) {
			double t0 = now();
			int rc = ddp_ctl_post(x, DDP_SUM, DDP_F32, 4, bytes / 4, (uintptr_t)send, (uintptr_t)recv);
			if (rc == DDP_PENDING)
				rc = ddp_ctl_complete(x, (uintptr_t)recv, -1, 1);
			t[i] = now() - t0;
			if (rc != MPI_SUCCESS) {
				fprintf(stderr, "rank %d: call %d: %d\n", rank, i, rc);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
		}
		if (recv[0] != (float)(size * (size + 1) / 2))
			fprintf(stderr, "rank %d: sum %g, want %d\n", rank, recv[0], size * (size + 1) / 2);
		MPI_Allreduce(MPI_IN_PLACE, t, CALLS, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		qsort(t, CALLS, sizeof *t, cmp);
		if (rank == 0)
			printf("%8d %10.3f\n", bytes, t[CALLS / 2] * 1e6);
	}
	ddp_ctl_free(x);
	MPI_Finalize();
	return 0;
}
