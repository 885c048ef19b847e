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

// AvgFloat32Twice sets dst0[i] and dst1[i] to a[i]*0.5 + b[i]*0.5.
func AvgFloat32Twice(dst0, dst1, a, b []float32) { avgTwice(dst0, dst1, a, b) }

// SumFloat32TwiceNT is SumFloat32Twice: Go has no non-temporal stores.
func SumFloat32TwiceNT(dst0, dst1, a, b []float32) { sumTwice(dst0, dst1, a, b) }

// AvgFloat32TwiceNT is AvgFloat32Twice: Go has no non-temporal stores.
func AvgFloat32TwiceNT(dst0, dst1, a, b []float32) { avgTwice(dst0, dst1, a, b) }

// PreMulSumFloat32 sets dst[i] = a[i]*s + b[i]*s, each product rounded on
// its own and then the sum: the first step of a pre-multiplied average.
func PreMulSumFloat32(dst, a, b []float32, s float32) { preMulSum(dst, a, b, s) }

// AddScaledFloat32 sets dst[i] = a[i] + b[i]*s, the product rounded on its
// own: the later steps of a pre-multiplied average.
func AddScaledFloat32(dst, a, b []float32, s float32) { addScaled(dst, a, b, s) }

// PreMulSumFloat64 is PreMulSumFloat32 for float64.
func PreMulSumFloat64(dst, a, b []float64, s float64) { preMulSum(dst, a, b, s) }

// AddScaledFloat64 is AddScaledFloat32 for float64.
func AddScaledFloat64(dst, a, b []float64, s float64) { addScaled(dst, a, b, s) }

func nonfiniteFloat32(x []float32) bool { return nonfinite(x) }

func nonfiniteFloat64(x []float64) bool { return nonfinite(x) }
