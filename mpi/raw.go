//go:build mpi && cgo

package mpi

/*
#include "ddpmpi.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/shm"
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
// elements through c's segment, staged, from the calling goroutine with
// nothing else of c pending: each a post and, unless the post finished
// it, a wait and the finish, with none of the backend's issue, ring or
// Work between them (the staged path's floor in this process). The sweep
// compares it with the API (docs/lab/small-messages.md). Its waits have no
// deadline, and no watchdog sees them (nothing is in the ring).
func rawStagedTimes(cm comm.Communicator, send, recv unsafe.Pointer, count int, times []float64) error {
	c := cm.(*communicator)
	// c.mu keeps issues out and Close from releasing the segment.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("mpi: rank %d: %w", c.rank, comm.ErrClosed)
	}
	if c.hs == nil || count*4 >= c.directMin {
		return fmt.Errorf("mpi: rank %d: %d float32s are not staged (segment %v, staged below %d bytes)", c.rank, count, c.hs != nil, c.directMin)
	}
	if !c.idle() {
		return fmt.Errorf("mpi: rank %d: an operation is pending", c.rank)
	}
	d := desc{kind: comm.KindAllReduce, op: comm.Sum, dt: comm.Float32, count: count, send: send, recv: recv, inplace: send == recv}
	base := time.Now()
	for i := range times {
		t0 := time.Since(base)
		end, err := c.post(&d)
		if end == stagedPending {
			if err = c.hs.await(d.k, shm.Called, time.Time{}, true); err != nil {
				end, err = c.failStaged(&d, err)
			} else {
				end, err = c.judge(&d)
			}
		}
		times[i] = (time.Since(base) - t0).Seconds()
		if end != stagedOK {
			if end == stagedFailed {
				c.fail(err)
			}
			return err
		}
	}
	return nil
}
