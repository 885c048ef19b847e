//go:build mpi && cgo

package mpi

// #include "ddpmpi.h"
import "C"

import (
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
