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

// pairKernel runs the float32 pair kernel of one vector width (0 the
// baseline, 1 AVX2, 2 AVX-512F) into d: the out-of-place one (d = b + a,
// or the pair average), or with acc the in-place one; false if the CPU
// lacks the width. For tests.
func pairKernel(width int, acc bool, d, a, b []float32, avg bool) bool {
	if len(d) == 0 {
		return true
	}
	return C.ddp_test_pair_kernel(C.int(width), boolInt(acc), (*C.float)(unsafe.Pointer(&d[0])), (*C.float)(unsafe.Pointer(&a[0])),
		(*C.float)(unsafe.Pointer(&b[0])), C.long(len(d)), boolInt(avg)) != 0
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
