//go:build mpi && cgo

package mpi

/*
#include "ddpmpi.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
)

// sharedSource is the allocator.Source of memory the ranks on one machine
// map into each other: each slab a memfd mapped shared, which a peer maps
// through /proc/<pid>/fd when an all-reduce first meets it (see "Shared
// memory" in the package documentation).
type sharedSource struct{}

func (sharedSource) Alloc(size int) (allocator.Region, error) {
	if size <= 0 {
		return allocator.Region{}, fmt.Errorf("%w: mpi shared memory of %d bytes", allocator.ErrInvalid, size)
	}
	var e C.int
	p := C.ddp_shm_alloc(C.size_t(size), &e)
	if p == nil {
		return allocator.Region{}, fmt.Errorf("mpi: shared memory (memfd) of %d bytes: %w", size, syscall.Errno(e))
	}
	return allocator.Region{Addr: p, Size: size}, nil
}

func (sharedSource) Free(r allocator.Region) error {
	var e C.int
	if C.ddp_shm_free(r.Addr, C.size_t(r.Size), &e) != 0 {
		return fmt.Errorf("mpi: freeing %d bytes of shared memory at %p: %w", r.Size, r.Addr, syscall.Errno(e))
	}
	return nil
}

func (sharedSource) Name() string { return "mpi shared memory" }
func (sharedSource) Host() bool   { return true }

// HostSource returns the source of memory that c's all-reduces read and
// write in place, where c is in blocking mode and its ranks all run on one
// machine; nil elsewhere, where it would gain nothing.
func (c *communicator) HostSource() allocator.Source {
	if !c.shm {
		return nil
	}
	return sharedSource{}
}

// sharedMapped is the number of peers' slabs this process has mapped; on
// the owner (for tests).
func sharedMapped() (n int) {
	e, err := start()
	if err != nil {
		return 0
	}
	e.call(func() error { n = int(C.ddp_shm_mapped()); return nil })
	return n
}

// failMapping makes this process's mappings of peers' memory fail (or
// work again), for tests.
func failMapping(on bool) {
	e, err := start()
	if err != nil {
		return
	}
	e.call(func() error { C.ddp_shm_test_fail(C.int(boolInt(on))); return nil })
}

// setNTMin sets the size of a rank's slice from which a two-rank
// out-of-place all-reduce in shared memory streams its outputs past the
// cache, and returns the previous one; for tests and the sweep.
func setNTMin(n int) int {
	e, err := start()
	if err != nil {
		return 0
	}
	var old int
	e.call(func() error { old = int(C.ddp_shm_set_nt_min(C.long(n))); return nil })
	return old
}

// slowAbort makes this process's aborts pause for d between claiming the
// control segment's abort word and writing the cause, for tests: a peer
// must not see the abort before its cause.
func slowAbort(d time.Duration) { C.ddp_ctl_test_abort_delay(C.longlong(d)) }

// exitMidCall makes this process exit (code 3) in the middle of its next
// direct all-reduce, after phase ph, for tests.
func exitMidCall(ph int) {
	e, err := start()
	if err != nil {
		return
	}
	e.call(func() error { C.ddp_shm_test_exit(C.int(ph)); return nil })
}
