package reduce

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/ddpgo/ddpgo/fp16"
)

// The floating-point Avg kernels never overflow where the average is
// finite: 3e38 and 3e38 average to 3e38, where a sum divided afterwards
// would give +Inf. They compute
//
//   - for n a power of two, the pre-multiplied sum of NCCL's ncclAvg: every
//     contribution times s = 1/n, the products added in rank order,
//     x0*s + x1*s + ... Scaling by a power of two is exact in the normal
//     range, so this is bit for bit the sum divided by n there, and the
//     products are small enough that no sum of them can round past the
//     largest finite value;
//   - for other n, the sum in rank order divided by n, rounded once (a
//     pre-multiplied sum would round every product by 1/n, and give a
//     residue instead of the exact zero of a sum that cancels), except
//     that an element whose sum overflows while its inputs are all finite
//     is computed as the pre-multiplied sum instead.
//
// Rounding up can carry even a pre-multiplied sum of inputs at the very
// edge of the range just past the largest finite value; since the average
// of finite inputs is never larger than the largest of them, such a result
// is saturated to the largest finite value of its sign, which is closer to
// the exact average. Non-finite inputs propagate as in a sum.
//
// Either way the error against the exact average of n finite inputs is at
// most
//
//	(n+2)·u·mean(|x|) + n·η/2
//
// where u is the unit roundoff (2^-24 for float32, 2^-53 for float64) and
// η the smallest subnormal (2^-149, 2^-1074): the sums, the division (or
// the products and s) round once each, and a result or product in the
// subnormal range loses up to η/2 instead. For two ranks the result is the
// correctly rounded average unless the inputs' halves are subnormal. The
// guarantees hold for up to 2^12 ranks; beyond that a partial sum could
// overflow before the last contribution brings it back.

// AvgScale returns the factor of an average over n contributions, 1/n
// rounded to nearest in T.
func AvgScale[T ~float32 | ~float64](n int) T { return T(1) / T(n) }

// AvgFloat32 sets dst to the average of srcs as described above. Every src
// must be at least len(dst) long, and tmp too when there are more than two
// srcs; dst may alias any src element for element. With one src dst is a
// copy of it.
func AvgFloat32(dst []float32, srcs [][]float32, tmp []float32) {
	avgN(dst, srcs, tmp, avgKernels[float32]{SumFloat32, PreMulSumFloat32, AddScaledFloat32, nonfiniteFloat32})
}

// AvgFloat64 is AvgFloat32 for float64.
func AvgFloat64(dst []float64, srcs [][]float64, tmp []float64) {
	avgN(dst, srcs, tmp, avgKernels[float64]{SumFloat64, PreMulSumFloat64, AddScaledFloat64, nonfiniteFloat64})
}

// avgKernels are the kernels an average is made of.
type avgKernels[T ~float32 | ~float64] struct {
	sum       func(dst, a, b []T)
	premul    func(dst, a, b []T, s T)
	axpy      func(dst, a, b []T, s T)
	nonfinite func([]T) bool
}

func avgN[T ~float32 | ~float64](dst []T, srcs [][]T, tmp []T, k avgKernels[T]) {
	n := len(srcs)
	switch n {
	case 0:
		return
	case 1:
		if len(dst) > 0 && &dst[0] != &srcs[0][0] {
			copy(dst, srcs[0][:len(dst)])
		}
		return
	case 2:
		// Halving is exact in the normal range and a sum of two values no
		// larger than max/2 cannot round past max: nothing to saturate.
		k.premul(dst, srcs[0], srcs[1], 0.5)
		return
	}
	// Every step writes tmp, never dst: dst may be one of the inputs, and
	// the fallback below needs them all as they were.
	tmp = tmp[:len(dst)]
	pow2 := n&(n-1) == 0
	if pow2 {
		s := AvgScale[T](n)
		k.premul(tmp, srcs[0], srcs[1], s)
		for _, x := range srcs[2:] {
			k.axpy(tmp, tmp, x, s)
		}
	} else {
		k.sum(tmp, srcs[0], srcs[1])
		for _, x := range srcs[2:] {
			k.sum(tmp, tmp, x)
		}
		Div(tmp, n)
	}
	if k.nonfinite(tmp) {
		repair(tmp, srcs, pow2)
	}
	copy(dst, tmp)
}

// repair recomputes every non-finite element of avg whose inputs are all
// finite: an overflowed sum becomes the pre-multiplied sum, and one that
// still rounds past the largest finite value is saturated to it.
func repair[T ~float32 | ~float64](avg []T, srcs [][]T, premultiplied bool) {
	var big T
	if unsafe.Sizeof(big) == 4 {
		big = T(math.MaxFloat32)
	} else {
		max64 := math.MaxFloat64 // a variable: the constant does not fit a float32 T
		big = T(max64)
	}
	s := AvgScale[T](len(srcs))
outer:
	for i, v := range avg {
		if v-v == 0 {
			continue
		}
		for _, x := range srcs {
			if x[i]-x[i] != 0 {
				continue outer // a non-finite input: the result stands
			}
		}
		if !premultiplied {
			v = T(srcs[0][i]*s) + T(srcs[1][i]*s)
			for _, x := range srcs[2:] {
				v += T(x[i] * s)
			}
		}
		switch {
		case v > big:
			v = big
		case v < -big:
			v = -big
		}
		avg[i] = v
	}
}

// AvgBFloat16 sets dst to the average of the bfloat16 vectors srcs: the
// average of AvgFloat32, computed in float32 from the exact float32 values
// of the inputs and rounded once to bfloat16 (nearest, ties to even, as
// fp16.Float32ToBFloat16), except that for n not a power of two the
// float32 sum is multiplied by 1/n rather than divided, as
// fp16.SumScaledBFloat16 does: at bfloat16's precision the two agree but
// on rare ties.
// bfloat16 has float32's range, so a float32 sum of its values can
// overflow where the average does not; the pre-multiplied sum then takes
// over as in AvgFloat32, and since the largest bfloat16 lies well below
// the largest float32 no average of finite inputs rounds to infinity. The
// result is within half a bfloat16 ulp of the float32 average, whose own
// error is bounded as for AvgFloat32. acc and wide are scratch of equal
// length; dst is done in blocks of that length, each block of every
// source read once. dst may alias any src element for element.
func AvgBFloat16(dst []uint16, srcs [][]uint16, acc, wide []float32) {
	if len(srcs) == 0 {
		return
	}
	if len(acc) == 0 || len(wide) != len(acc) {
		panic(fmt.Sprintf("reduce: AvgBFloat16 scratch of %d and %d elements", len(acc), len(wide)))
	}
	n := len(srcs)
	s := AvgScale[float32](n)
	pow2 := n&(n-1) == 0
	for lo := 0; lo < len(dst); lo += len(acc) {
		hi := min(lo+len(acc), len(dst))
		a, w := acc[:hi-lo], wide[:hi-lo]
		if n == 1 {
			copy(dst[lo:hi], srcs[0][lo:hi])
			continue
		}
		fp16.BFloat16ToFloat32(a, srcs[0][lo:hi])
		fp16.BFloat16ToFloat32(w, srcs[1][lo:hi])
		if pow2 {
			PreMulSumFloat32(a, a, w, s)
		} else {
			SumFloat32(a, a, w)
		}
		for _, x := range srcs[2:] {
			fp16.BFloat16ToFloat32(w, x[lo:hi])
			if pow2 {
				AddScaledFloat32(a, a, w, s)
			} else {
				SumFloat32(a, a, w)
			}
		}
		if !pow2 {
			for i := range a {
				a[i] *= s
			}
			if nonfiniteFloat32(a) {
				repairBFloat16(a, srcs, lo)
			}
		}
		fp16.Float32ToBFloat16(dst[lo:hi], a)
	}
}

// repairBFloat16 replaces every non-finite average in avg (elements lo...
// of srcs) whose inputs are all finite, an overflowed float32 sum, by the
// pre-multiplied sum, which a value no larger than the largest bfloat16
// leaves far below the float32 limit.
func repairBFloat16(avg []float32, srcs [][]uint16, lo int) {
	s := AvgScale[float32](len(srcs))
outer:
	for i, v := range avg {
		if v-v == 0 {
			continue
		}
		var p float32
		for _, x := range srcs {
			f := fp16.BFloat16ToFloat32Scalar(x[lo+i])
			if f-f != 0 {
				continue outer
			}
			p += float32(f * s)
		}
		avg[i] = p
	}
}

// preMulSum is the portable PreMulSum kernel. The conversions keep each
// product rounded on its own: Go may otherwise fuse x*s + y into one
// rounding on some architectures, which the SIMD kernels do not do.
func preMulSum[T ~float32 | ~float64](dst, a, b []T, s T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = T(a[i]*s) + T(b[i]*s)
	}
}

// addScaled is the portable AddScaled kernel.
func addScaled[T ~float32 | ~float64](dst, a, b []T, s T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + T(b[i]*s)
	}
}

// nonfinite reports whether some element of x is an infinity or a NaN.
func nonfinite[T ~float32 | ~float64](x []T) bool {
	var acc T
	for _, v := range x {
		acc += v - v // 0 for finite v, NaN otherwise; NaN stays
	}
	return acc != 0
}
