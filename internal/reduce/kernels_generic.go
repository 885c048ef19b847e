//go:build purego || !amd64

package reduce

// SumFloat32 sets dst[i] = a[i] + b[i].
func SumFloat32(dst, a, b []float32) { Sum(dst, a, b) }

// SumFloat64 sets dst[i] = a[i] + b[i].
func SumFloat64(dst, a, b []float64) { Sum(dst, a, b) }

// MaxFloat32 sets dst[i] = max(a[i], b[i]).
func MaxFloat32(dst, a, b []float32) { Max(dst, a, b) }

// MinFloat32 sets dst[i] = min(a[i], b[i]).
func MinFloat32(dst, a, b []float32) { Min(dst, a, b) }

// Accelerated reports whether SIMD kernels are in use.
func Accelerated() bool { return false }

// SumFloat32Twice sets dst0[i] and dst1[i] to a[i] + b[i]: the whole
// in-place all-reduce of two ranks in one pass. Either dst may alias a or b.
func SumFloat32Twice(dst0, dst1, a, b []float32) { sumTwice(dst0, dst1, a, b) }

// AvgFloat32Twice sets dst0[i] and dst1[i] to (a[i] + b[i]) / 2.
func AvgFloat32Twice(dst0, dst1, a, b []float32) { avgTwice(dst0, dst1, a, b) }
