//go:build mpi && cgo

package mpi

/*
#include <time.h>
#include "ddpmpi.h"

// ddp_staged_times times n staged float32 sum all-reduces of count
// elements, from C: a post and, unless the post finished it, a complete.
static int ddp_staged_times(ddp_ctl *x, uintptr_t send, uintptr_t recv, int count, double *t, int n) {
	for (int i = 0; i < n; i++) {
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		int rc = ddp_ctl_post(x, DDP_SUM, DDP_F32, 4, count, send, recv);
		if (rc == DDP_PENDING)
			rc = ddp_ctl_complete(x, recv, -1, 1);
		clock_gettime(CLOCK_MONOTONIC, &b);
		if (rc != MPI_SUCCESS)
			return rc;
		t[i] = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
	}
	return MPI_SUCCESS;
}
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// rawAllReduceTimes times len(times) float32 sum all-reduces of count
// elements made straight from the owner goroutine, one blocking MPI call
// after another, with no issue, queue or wake-up between them: the floor
// that the backend's hand-offs add to (see BenchmarkRaw in the tests).
func rawAllReduceTimes(cm comm.Communicator, send, recv unsafe.Pointer, count int, times []float64) error {
	c := cm.(*communicator)
	inplace := 0
	if send == recv {
		inplace = 1
	}
	return c.e.call(func() error {
		for i := range times {
			t0 := time.Now()
			rc := C.ddp_start(c.h, 1, 0, C.int(comm.KindAllReduce), C.int(comm.Sum), C.int(comm.Float32),
				C.int(count), C.uintptr_t(uintptr(send)), C.uintptr_t(uintptr(recv)), 0, C.int(inplace))
			times[i] = time.Since(t0).Seconds()
			if rc != C.MPI_SUCCESS {
				return mpiError(int(rc))
			}
		}
		return nil
	})
}

// rawStagedTimes times len(times) float32 sum all-reduces of count
// elements through c's control segment, staged, from the calling
// goroutine with nothing else of c pending: each a post and, unless the
// post finished it, a complete, with none of the backend's issue, ring or
// Work between them. In C, the loop and its clock readings run in C (the
// staged path's floor in this process); otherwise Go calls the two C
// functions and reads the clock, adding cgo's transitions. The sweep
// compares the two with the API (docs/small-messages.md). Its waits have
// no deadline, and no watchdog sees them (nothing is in the ring).
func rawStagedTimes(cm comm.Communicator, send, recv unsafe.Pointer, count int, times []float64, inC bool) error {
	c := cm.(*communicator)
	// c.mu keeps issues out and Close from releasing the segment.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("mpi: rank %d: %w", c.rank, comm.ErrClosed)
	}
	if c.ctl == nil || count*4 >= c.directMin {
		return fmt.Errorf("mpi: rank %d: %d float32s are not staged (control segment %v, staged below %d bytes)", c.rank, count, c.ctl != nil, c.directMin)
	}
	if !c.idle() {
		return fmt.Errorf("mpi: rank %d: an operation is pending", c.rank)
	}
	if len(times) == 0 {
		return nil
	}
	s, r := C.uintptr_t(uintptr(send)), C.uintptr_t(uintptr(recv))
	if inC {
		if rc := C.ddp_staged_times(c.ctl, s, r, C.int(count), (*C.double)(unsafe.Pointer(&times[0])), C.int(len(times))); rc != C.MPI_SUCCESS {
			return fmt.Errorf("mpi: rank %d: staged all-reduce: %d", c.rank, int(rc))
		}
		return nil
	}
	base := time.Now()
	for i := range times {
		t0 := time.Since(base)
		rc := C.ddp_ctl_post(c.ctl, C.DDP_SUM, C.DDP_F32, 4, C.int(count), s, r)
		if rc == C.DDP_PENDING {
			rc = C.ddp_ctl_complete(c.ctl, r, -1, 1)
		}
		times[i] = (time.Since(base) - t0).Seconds()
		if rc != C.MPI_SUCCESS {
			return fmt.Errorf("mpi: rank %d: staged all-reduce: %d", c.rank, int(rc))
		}
	}
	return nil
}
