package fp16

import "fmt"

// Float32ToHalf sets dst[i] = FromFloat32(src[i]) for every i.
// It panics if len(dst) != len(src).
func Float32ToHalf(dst []uint16, src []float32) {
	if len(dst) != len(src) {
		panicLen("Float32ToHalf", len(dst), len(src))
	}
	active.f32ToHalf(dst, src)
}

// HalfToFloat32 sets dst[i] = ToFloat32(src[i]) for every i.
// It panics if len(dst) != len(src).
func HalfToFloat32(dst []float32, src []uint16) {
	if len(dst) != len(src) {
		panicLen("HalfToFloat32", len(dst), len(src))
	}
	active.halfToF32(dst, src)
}

// Float32ToBFloat16 sets dst[i] = BFloat16FromFloat32(src[i]) for every i.
// It panics if len(dst) != len(src).
func Float32ToBFloat16(dst []uint16, src []float32) {
	if len(dst) != len(src) {
		panicLen("Float32ToBFloat16", len(dst), len(src))
	}
	active.f32ToBF16(dst, src)
}

// BFloat16ToFloat32 sets dst[i] = BFloat16ToFloat32Scalar(src[i]) for
// every i. It panics if len(dst) != len(src).
func BFloat16ToFloat32(dst []float32, src []uint16) {
	if len(dst) != len(src) {
		panicLen("BFloat16ToFloat32", len(dst), len(src))
	}
	active.bf16ToF32(dst, src)
}

// ScaleToHalf sets dst[i] = FromFloat32(float32(src[i]*scale)): the product
// is a float32 and the only rounding to half precision is the last one.
// It panics if len(dst) != len(src).
func ScaleToHalf(dst []uint16, src []float32, scale float32) {
	if len(dst) != len(src) {
		panicLen("ScaleToHalf", len(dst), len(src))
	}
	active.scaleToHalf(dst, src, scale)
}

// ScaleToBFloat16 sets dst[i] = BFloat16FromFloat32(float32(src[i]*scale)).
// It panics if len(dst) != len(src).
func ScaleToBFloat16(dst []uint16, src []float32, scale float32) {
	if len(dst) != len(src) {
		panicLen("ScaleToBFloat16", len(dst), len(src))
	}
	active.scaleToBF16(dst, src, scale)
}

// SumHalf sets dst[i] to the half-precision rounding of the float32 sum
// srcs[0][i] + srcs[1][i] + ..., added in that order. dst may be one of the
// sources (the same slice); other overlaps give unspecified results. With
// no sources dst is zeroed. It panics if a source's length differs from
// len(dst).
func SumHalf(dst []uint16, srcs [][]uint16) {
	checkSum("SumHalf", dst, srcs)
	if len(srcs) == 0 {
		clear(dst)
		return
	}
	active.sumHalf(dst, srcs, 0, 1, false)
}

// SumBFloat16 is SumHalf for bfloat16.
func SumBFloat16(dst []uint16, srcs [][]uint16) {
	checkSum("SumBFloat16", dst, srcs)
	if len(srcs) == 0 {
		clear(dst)
		return
	}
	active.sumBF16(dst, srcs, 0, 1, false)
}

// SumScaledHalf is SumHalf with the float32 sum multiplied by scale (in
// float32) before the one rounding to half precision: with scale = 1/n it
// computes the average of n vectors.
func SumScaledHalf(dst []uint16, srcs [][]uint16, scale float32) {
	checkSum("SumScaledHalf", dst, srcs)
	if len(srcs) == 0 {
		clear(dst)
		return
	}
	active.sumHalf(dst, srcs, 0, scale, true)
}

// SumScaledBFloat16 is SumScaledHalf for bfloat16.
func SumScaledBFloat16(dst []uint16, srcs [][]uint16, scale float32) {
	checkSum("SumScaledBFloat16", dst, srcs)
	if len(srcs) == 0 {
		clear(dst)
		return
	}
	active.sumBF16(dst, srcs, 0, scale, true)
}

// Impl names the implementation the bulk functions use: "avx512",
// "avx2+f16c" or "purego".
func Impl() string { return active.name }

// CPUFeatures lists the processor features relevant to this package that
// were detected and usable (enabled by the operating system), for example
// "avx2 f16c fma avx512f avx512bw avx512vl". It is empty on other
// architectures and under the purego build tag.
func CPUFeatures() string { return cpuFeatures }

// kernels is one implementation of the bulk operations. Its functions get
// checked lengths. A sum kernel computes elements from..len(dst)-1 and gets
// at least one source; it multiplies by scale only when scaled is set.
type kernels struct {
	name        string
	f32ToHalf   func(dst []uint16, src []float32)
	halfToF32   func(dst []float32, src []uint16)
	f32ToBF16   func(dst []uint16, src []float32)
	bf16ToF32   func(dst []float32, src []uint16)
	scaleToHalf func(dst []uint16, src []float32, scale float32)
	scaleToBF16 func(dst []uint16, src []float32, scale float32)
	sumHalf     func(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool)
	sumBF16     func(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool)
}

// active is the implementation in use, chosen at initialization.
var active = &bestKernels

func checkSum(fn string, dst []uint16, srcs [][]uint16) {
	for j, s := range srcs {
		if len(s) != len(dst) {
			panicSum(fn, j, len(s), len(dst))
		}
	}
}

//go:noinline
func panicLen(fn string, ndst, nsrc int) {
	panic(fmt.Sprintf("fp16: %s: len(dst) = %d, len(src) = %d", fn, ndst, nsrc))
}

//go:noinline
func panicSum(fn string, j, nsrc, ndst int) {
	panic(fmt.Sprintf("fp16: %s: len(srcs[%d]) = %d, len(dst) = %d", fn, j, nsrc, ndst))
}
