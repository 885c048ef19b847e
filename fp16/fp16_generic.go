package fp16

import "math"

// The portable kernels. They are always compiled, so that tests on amd64 can
// compare them with the assembly bit for bit. Callers have checked lengths;
// each kernel reslices once so that the compiler drops the bounds checks
// from its loop.

// halfFast is FromFloat32 written for speed rather than for reading: the
// subnormal case lets the FPU do the rounding (adding 0.5, whose ulp is
// 2^-24, rounds to a multiple of the half subnormal unit, ties to even).
// The tests check it against FromFloat32 on every float32.
func halfFast(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u &^ (1 << 31)
	var h uint32
	switch {
	case a < 0x38800000:
		h = math.Float32bits(math.Float32frombits(a)+0.5) - 0x3f000000
	case a < 0x477ff000:
		h = (a - 112<<23 + 0xfff + a>>13&1) >> 13
	case a <= 0x7f800000:
		h = 0x7c00
	default:
		h = 0x7e00 | a>>13&0x3ff
	}
	return sign | uint16(h)
}

// bf16Fast is BFloat16FromFloat32 by a rounding bias, the same method as
// the SIMD kernels.
func bf16Fast(f float32) uint16 {
	u := math.Float32bits(f)
	if u&^(1<<31) > 0x7f800000 {
		return uint16(u>>16) | 0x0040
	}
	return uint16((u + 0x7fff + u>>16&1) >> 16)
}

func f32ToHalfGeneric(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = halfFast(f)
	}
}

func halfToF32Generic(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = ToFloat32(h)
	}
}

func f32ToBF16Generic(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = bf16Fast(f)
	}
}

func bf16ToF32Generic(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = math.Float32frombits(uint32(b) << 16)
	}
}

func scaleToHalfGeneric(dst []uint16, src []float32, scale float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = halfFast(float32(f * scale))
	}
}

func scaleToBF16Generic(dst []uint16, src []float32, scale float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = bf16Fast(float32(f * scale))
	}
}

// sumBlock is how many elements the generic sums accumulate at a time, in
// a float32 array on the stack: small enough for L1, large enough that the
// per-source loop overhead does not matter.
const sumBlock = 256

// sumHalfGeneric sets dst[i] = half(scale * sum_j srcs[j][i]) for i >= from,
// multiplying only when scaled. len(srcs) >= 1 and every source is as long
// as dst.
func sumHalfGeneric(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool) {
	var acc [sumBlock]float32
	for lo := from; lo < len(dst); lo += sumBlock {
		hi := min(lo+sumBlock, len(dst))
		a := acc[:hi-lo]
		s := srcs[0][lo:hi]
		s = s[:len(a)]
		for i := range a {
			a[i] = ToFloat32(s[i])
		}
		for _, src := range srcs[1:] {
			s := src[lo:hi]
			s = s[:len(a)]
			for i := range a {
				a[i] += ToFloat32(s[i])
			}
		}
		d := dst[lo:hi]
		d = d[:len(a)]
		if scaled {
			for i := range a {
				d[i] = halfFast(float32(a[i] * scale))
			}
		} else {
			for i := range a {
				d[i] = halfFast(a[i])
			}
		}
	}
}

// sumBF16Generic is sumHalfGeneric for bfloat16.
func sumBF16Generic(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool) {
	var acc [sumBlock]float32
	for lo := from; lo < len(dst); lo += sumBlock {
		hi := min(lo+sumBlock, len(dst))
		a := acc[:hi-lo]
		s := srcs[0][lo:hi]
		s = s[:len(a)]
		for i := range a {
			a[i] = math.Float32frombits(uint32(s[i]) << 16)
		}
		for _, src := range srcs[1:] {
			s := src[lo:hi]
			s = s[:len(a)]
			for i := range a {
				a[i] += math.Float32frombits(uint32(s[i]) << 16)
			}
		}
		d := dst[lo:hi]
		d = d[:len(a)]
		if scaled {
			for i := range a {
				d[i] = bf16Fast(float32(a[i] * scale))
			}
		} else {
			for i := range a {
				d[i] = bf16Fast(a[i])
			}
		}
	}
}

// genericKernels is the portable implementation.
var genericKernels = kernels{
	name:        "purego",
	f32ToHalf:   f32ToHalfGeneric,
	halfToF32:   halfToF32Generic,
	f32ToBF16:   f32ToBF16Generic,
	bf16ToF32:   bf16ToF32Generic,
	scaleToHalf: scaleToHalfGeneric,
	scaleToBF16: scaleToBF16Generic,
	sumHalf:     sumHalfGeneric,
	sumBF16:     sumBF16Generic,
}
