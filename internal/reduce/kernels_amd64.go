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
// Out of place on buffers larger than the last-level cache,
// SumFloat32TwiceNT is faster.
func SumFloat32Twice(dst0, dst1, a, b []float32) { twice(dst0, dst1, a, b, addF32x2AVX2, sumTwice) }

//go:noescape
func avgF32x2AVX2(dst0, dst1, a, b unsafe.Pointer, n int)

// AvgFloat32Twice sets dst0[i] and dst1[i] to a[i]*0.5 + b[i]*0.5, the
// pre-multiplied average of AvgFloat32: the whole Avg all-reduce of two
// ranks in one pass, so averaging costs what summing costs. Either dst may
// alias a or b. Out of place on buffers larger than the last-level cache,
// AvgFloat32TwiceNT is faster.
func AvgFloat32Twice(dst0, dst1, a, b []float32) { twice(dst0, dst1, a, b, avgF32x2AVX2, avgTwice) }

//go:noescape
func addF32x2NTAVX2(dst0, dst1, a, b unsafe.Pointer, n int)

//go:noescape
func avgF32x2NTAVX2(dst0, dst1, a, b unsafe.Pointer, n int)

// SumFloat32TwiceNT is SumFloat32Twice, bit for bit, with non-temporal
// stores: the outputs go to memory past the caches, so no output line is
// first read for ownership and the outputs do not evict the inputs. It
// pays out of place when dst0, dst1, a and b together are larger than the
// last-level cache; when they fit, SumFloat32Twice is faster (see the
// package documentation). It streams only where dst0 and dst1 lie at the
// same offset from a 32-byte boundary. Either dst may alias a or b.
func SumFloat32TwiceNT(dst0, dst1, a, b []float32) {
	twiceNT(dst0, dst1, a, b, addF32x2NTAVX2, SumFloat32Twice)
}

// AvgFloat32TwiceNT is AvgFloat32Twice, bit for bit, with non-temporal
// stores, as SumFloat32TwiceNT is SumFloat32Twice.
func AvgFloat32TwiceNT(dst0, dst1, a, b []float32) {
	twiceNT(dst0, dst1, a, b, avgF32x2NTAVX2, AvgFloat32Twice)
}

// ntAlign is the alignment VMOVNTPS needs of the address it stores to.
const ntAlign = 32

// ntHead returns how many leading elements of dst0 and dst1 must be stored
// ordinarily before both are ntAlign-aligned, and false when no such count
// exists: the two start at different offsets within an ntAlign block.
func ntHead(dst0, dst1 []float32) (int, bool) {
	p0 := uintptr(unsafe.Pointer(unsafe.SliceData(dst0)))
	p1 := uintptr(unsafe.Pointer(unsafe.SliceData(dst1)))
	if (p0^p1)%ntAlign != 0 || p0%4 != 0 {
		return 0, false
	}
	return int(-p0 % ntAlign / 4), true
}

// twiceNT is twice for the streaming kernels: the elements before the
// outputs' first aligned block go through fallback, and so does everything
// when the outputs cannot be aligned together, when less than one vector
// is left, or without AVX2.
func twiceNT(dst0, dst1, a, b []float32, kernel func(dst0, dst1, a, b unsafe.Pointer, n int), fallback func(dst0, dst1, a, b []float32)) {
	dst1, a, b = dst1[:len(dst0)], a[:len(dst0)], b[:len(dst0)]
	head, ok := ntHead(dst0, dst1)
	if !useAVX2 || !ok || len(dst0)-head < 8 {
		fallback(dst0, dst1, a, b)
		return
	}
	if head > 0 {
		fallback(dst0[:head], dst1[:head], a, b)
	}
	// twice cuts the rest into runs of maxRun elements, a multiple of the
	// vector width, so every run starts aligned.
	twice(dst0[head:], dst1[head:], a[head:], b[head:], kernel, fallback)
}

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
