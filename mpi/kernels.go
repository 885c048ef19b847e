//go:build mpi && cgo

package mpi

/*
#include "ddpmpi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// reduceHalves applies the 16-bit reduction MPI uses for dt and op to in
// and inout (inout = in op inout), with F16C if f16c and the CPU has it.
// Tests compare it with package fp16.
func reduceHalves(dt comm.DType, op comm.Op, in, inout []uint16, f16c bool) {
	if len(in) != len(inout) {
		panic("mpi: reduceHalves of unequal lengths")
	}
	if len(in) == 0 {
		return
	}
	C.ddp_test_reduce(C.int(dt), C.int(op), C.uintptr_t(uintptr(unsafe.Pointer(&in[0]))), C.uintptr_t(uintptr(unsafe.Pointer(&inout[0]))), C.int(len(in)), boolInt(f16c))
}

// averagePair applies the pair average of dt (DDP_AVG2) to n elements at
// in and inout, for tests.
func averagePair(dt comm.DType, in, inout unsafe.Pointer, n int) {
	if n > 0 {
		C.ddp_test_reduce(C.int(dt), C.DDP_AVG2, C.uintptr_t(uintptr(in)), C.uintptr_t(uintptr(inout)), C.int(n), 1)
	}
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
