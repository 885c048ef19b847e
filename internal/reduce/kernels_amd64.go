//go:build !purego

package reduce

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

var useAVX2 = cpu.X86.HasAVX2

// Accelerated reports whether SIMD kernels are in use.
func Accelerated() bool { return useAVX2 }

// maxRun bounds the elements one assembly call handles. Assembly cannot
// be preempted, so a reduction of a large buffer is cut into runs of well
// under a millisecond, and the garbage collector and the scheduler never
// wait on it for long.
const maxRun = 1 << 18

// at returns the address of element i of s.
func at[T any](s []T, i int) unsafe.Pointer { return unsafe.Pointer(&s[i]) }

//go:noescape
func addF32AVX2(dst, a, b unsafe.Pointer, n int)

//go:noescape
func maxF32AVX2(dst, a, b unsafe.Pointer, n int)

//go:noescape
func minF32AVX2(dst, a, b unsafe.Pointer, n int)

//go:noescape
func addF64AVX2(dst, a, b unsafe.Pointer, n int)

// SumFloat32 sets dst[i] = a[i] + b[i].
func SumFloat32(dst, a, b []float32) {
	if !useAVX2 || len(dst) < 8 {
		Sum(dst, a, b)
		return
	}
	a, b = a[:len(dst)], b[:len(dst)]
	for i := 0; i < len(dst); i += maxRun {
		addF32AVX2(at(dst, i), at(a, i), at(b, i), min(maxRun, len(dst)-i))
	}
}

// SumFloat64 sets dst[i] = a[i] + b[i].
func SumFloat64(dst, a, b []float64) {
	if !useAVX2 || len(dst) < 4 {
		Sum(dst, a, b)
		return
	}
	a, b = a[:len(dst)], b[:len(dst)]
	for i := 0; i < len(dst); i += maxRun {
		addF64AVX2(at(dst, i), at(a, i), at(b, i), min(maxRun, len(dst)-i))
	}
}

// MaxFloat32 sets dst[i] = max(a[i], b[i]) with the NaN rule of Max.
func MaxFloat32(dst, a, b []float32) {
	if !useAVX2 || len(dst) < 8 {
		Max(dst, a, b)
		return
	}
	a, b = a[:len(dst)], b[:len(dst)]
	for i := 0; i < len(dst); i += maxRun {
		maxF32AVX2(at(dst, i), at(a, i), at(b, i), min(maxRun, len(dst)-i))
	}
}

// MinFloat32 sets dst[i] = min(a[i], b[i]) with the NaN rule of Min.
func MinFloat32(dst, a, b []float32) {
	if !useAVX2 || len(dst) < 8 {
		Min(dst, a, b)
		return
	}
	a, b = a[:len(dst)], b[:len(dst)]
	for i := 0; i < len(dst); i += maxRun {
		minF32AVX2(at(dst, i), at(a, i), at(b, i), min(maxRun, len(dst)-i))
	}
}

//go:noescape
func addF32x2AVX2(dst0, dst1, a, b unsafe.Pointer, n int)

// SumFloat32Twice sets dst0[i] and dst1[i] to a[i] + b[i]: the whole
// in-place all-reduce of two ranks in one pass. Either dst may alias a or b.
func SumFloat32Twice(dst0, dst1, a, b []float32) {
	if !useAVX2 || len(dst0) == 0 {
		sumTwice(dst0, dst1, a, b)
		return
	}
	dst1, a, b = dst1[:len(dst0)], a[:len(dst0)], b[:len(dst0)]
	for i := 0; i < len(dst0); i += maxRun {
		addF32x2AVX2(at(dst0, i), at(dst1, i), at(a, i), at(b, i), min(maxRun, len(dst0)-i))
	}
}

//go:noescape
func avgF32x2AVX2(dst0, dst1, a, b unsafe.Pointer, n int)

// AvgFloat32Twice sets dst0[i] and dst1[i] to (a[i] + b[i]) / 2: the whole
// in-place Avg all-reduce of two ranks in one pass, so averaging costs what
// summing costs. Either dst may alias a or b.
func AvgFloat32Twice(dst0, dst1, a, b []float32) {
	if !useAVX2 || len(dst0) == 0 {
		avgTwice(dst0, dst1, a, b)
		return
	}
	dst1, a, b = dst1[:len(dst0)], a[:len(dst0)], b[:len(dst0)]
	for i := 0; i < len(dst0); i += maxRun {
		avgF32x2AVX2(at(dst0, i), at(dst1, i), at(a, i), at(b, i), min(maxRun, len(dst0)-i))
	}
}
