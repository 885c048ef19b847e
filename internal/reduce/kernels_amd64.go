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

// scaled is binary for the kernels that also take a factor s.
func scaled[T Elem](dst, a, b []T, s T, minN int, kernel func(dst, a, b unsafe.Pointer, n int, s T), fallback func(dst, a, b []T, s T)) {
	if !useAVX2 || len(dst) < minN {
		fallback(dst, a, b, s)
		return
	}
	a, b = a[:len(dst)], b[:len(dst)]
	for i := 0; i < len(dst); i += maxRun {
		kernel(at(dst, i), at(a, i), at(b, i), min(maxRun, len(dst)-i), s)
	}
}

// scan runs a reporting kernel over x in runs of maxRun elements.
func scan[T Elem](x []T, minN int, kernel func(p unsafe.Pointer, n int) bool, fallback func([]T) bool) bool {
	if !useAVX2 || len(x) < minN {
		return fallback(x)
	}
	for i := 0; i < len(x); i += maxRun {
		if kernel(at(x, i), min(maxRun, len(x)-i)) {
			return true
		}
	}
	return false
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

// AvgFloat32Twice sets dst0[i] and dst1[i] to a[i]*0.5 + b[i]*0.5, the
// pre-multiplied average of AvgFloat32: the whole Avg all-reduce of two
// ranks in one pass, so averaging costs what summing costs. Either dst may
// alias a or b.
func AvgFloat32Twice(dst0, dst1, a, b []float32) { twice(dst0, dst1, a, b, avgF32x2AVX2, avgTwice) }

//go:noescape
func premulF32AVX2(dst, a, b unsafe.Pointer, n int, s float32)

//go:noescape
func axpyF32AVX2(dst, a, b unsafe.Pointer, n int, s float32)

//go:noescape
func premulF64AVX2(dst, a, b unsafe.Pointer, n int, s float64)

//go:noescape
func axpyF64AVX2(dst, a, b unsafe.Pointer, n int, s float64)

//go:noescape
func nonfiniteF32AVX2(p unsafe.Pointer, n int) bool

//go:noescape
func nonfiniteF64AVX2(p unsafe.Pointer, n int) bool

// PreMulSumFloat32 sets dst[i] = a[i]*s + b[i]*s, each product rounded on
// its own and then the sum: the first step of a pre-multiplied average.
func PreMulSumFloat32(dst, a, b []float32, s float32) {
	scaled(dst, a, b, s, 8, premulF32AVX2, preMulSum[float32])
}

// AddScaledFloat32 sets dst[i] = a[i] + b[i]*s, the product rounded on its
// own: the later steps of a pre-multiplied average.
func AddScaledFloat32(dst, a, b []float32, s float32) {
	scaled(dst, a, b, s, 8, axpyF32AVX2, addScaled[float32])
}

// PreMulSumFloat64 is PreMulSumFloat32 for float64.
func PreMulSumFloat64(dst, a, b []float64, s float64) {
	scaled(dst, a, b, s, 4, premulF64AVX2, preMulSum[float64])
}

// AddScaledFloat64 is AddScaledFloat32 for float64.
func AddScaledFloat64(dst, a, b []float64, s float64) {
	scaled(dst, a, b, s, 4, axpyF64AVX2, addScaled[float64])
}

func nonfiniteFloat32(x []float32) bool { return scan(x, 8, nonfiniteF32AVX2, nonfinite[float32]) }

func nonfiniteFloat64(x []float64) bool { return scan(x, 4, nonfiniteF64AVX2, nonfinite[float64]) }
