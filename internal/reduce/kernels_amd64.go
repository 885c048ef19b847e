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

// binary runs kernel over dst = a op b in runs of maxRun elements, or the
// portable fallback when SIMD is off or dst is shorter than minN.
func binary[T Elem](dst, a, b []T, minN int, kernel func(dst, a, b unsafe.Pointer, n int), fallback func(dst, a, b []T)) {
	if !useAVX2 || len(dst) < minN {
		fallback(dst, a, b)
		return
	}
	a, b = a[:len(dst)], b[:len(dst)]
	for i := 0; i < len(dst); i += maxRun {
		kernel(at(dst, i), at(a, i), at(b, i), min(maxRun, len(dst)-i))
	}
}

// twice is binary for the two-output kernels of the two-rank all-reduce.
func twice(dst0, dst1, a, b []float32, kernel func(dst0, dst1, a, b unsafe.Pointer, n int), fallback func(dst0, dst1, a, b []float32)) {
	if !useAVX2 || len(dst0) == 0 {
		fallback(dst0, dst1, a, b)
		return
	}
	dst1, a, b = dst1[:len(dst0)], a[:len(dst0)], b[:len(dst0)]
	for i := 0; i < len(dst0); i += maxRun {
		kernel(at(dst0, i), at(dst1, i), at(a, i), at(b, i), min(maxRun, len(dst0)-i))
	}
}

//go:noescape
func addF32AVX2(dst, a, b unsafe.Pointer, n int)

//go:noescape
func maxF32AVX2(dst, a, b unsafe.Pointer, n int)

//go:noescape
func minF32AVX2(dst, a, b unsafe.Pointer, n int)

//go:noescape
func addF64AVX2(dst, a, b unsafe.Pointer, n int)

// SumFloat32 sets dst[i] = a[i] + b[i].
func SumFloat32(dst, a, b []float32) { binary(dst, a, b, 8, addF32AVX2, Sum[float32]) }

// SumFloat64 sets dst[i] = a[i] + b[i].
func SumFloat64(dst, a, b []float64) { binary(dst, a, b, 4, addF64AVX2, Sum[float64]) }

// MaxFloat32 sets dst[i] = max(a[i], b[i]) with the NaN rule of Max.
func MaxFloat32(dst, a, b []float32) { binary(dst, a, b, 8, maxF32AVX2, Max[float32]) }

// MinFloat32 sets dst[i] = min(a[i], b[i]) with the NaN rule of Min.
func MinFloat32(dst, a, b []float32) { binary(dst, a, b, 8, minF32AVX2, Min[float32]) }

//go:noescape
func addF32x2AVX2(dst0, dst1, a, b unsafe.Pointer, n int)

// SumFloat32Twice sets dst0[i] and dst1[i] to a[i] + b[i]: the whole
// in-place all-reduce of two ranks in one pass. Either dst may alias a or b.
func SumFloat32Twice(dst0, dst1, a, b []float32) { twice(dst0, dst1, a, b, addF32x2AVX2, sumTwice) }

//go:noescape
func avgF32x2AVX2(dst0, dst1, a, b unsafe.Pointer, n int)

// AvgFloat32Twice sets dst0[i] and dst1[i] to (a[i] + b[i]) / 2: the whole
// in-place Avg all-reduce of two ranks in one pass, so averaging costs what
// summing costs. Either dst may alias a or b.
func AvgFloat32Twice(dst0, dst1, a, b []float32) { twice(dst0, dst1, a, b, avgF32x2AVX2, avgTwice) }
