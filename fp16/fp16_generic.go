package fp16

import "math"

// The portable kernels. They are always compiled, so that tests on amd64 can
// compare them with the assembly bit for bit. Callers have checked lengths;
// each kernel reslices once so that the compiler drops the bounds checks
// from its loop.

// bf16Fast is BFloat16FromFloat32 by a rounding bias, the same method as
// the SIMD kernels.
func bf16Fast(f float32) uint16 {
	u := math.Float32bits(f)
	if u&^(1<<31) > 0x7f800000 {
		return uint16(u>>16) | 0x0040
	}
	return uint16((u + 0x7fff + u>>16&1) >> 16)
}

// f32ToHalfGeneric is FromFloat32 over a slice, written for speed rather
// than for reading (and inline: as a function it would be too big for the
// compiler to inline). The subnormal case lets the FPU round: adding 0.5,
// whose ulp is 2^-24, rounds to a multiple of the half subnormal unit,
// ties to even. The tests check it against FromFloat32 on every float32.
func f32ToHalfGeneric(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		u := math.Float32bits(f)
		a := u &^ (1 << 31)
		h := (a - 112<<23 + 0xfff + a>>13&1) >> 13 // normal
		if a < 0x38800000 {
			h = math.Float32bits(math.Float32frombits(a)+0.5) - 0x3f000000
		}
		if a >= 0x477ff000 {
			h = 0x7c00
			if a > 0x7f800000 {
				h = 0x7e00 | a>>13&0x3ff
			}
		}
		dst[i] = uint16(u>>16&0x8000 | h)
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

// sumBlock is how many elements the generic scaling and summing kernels
// hold at a time in a float32 array on the stack: small enough for L1,
// large enough that the per-block overhead does not matter.
const sumBlock = 256

func scaleToHalfGeneric(dst []uint16, src []float32, scale float32) {
	var tmp [sumBlock]float32
	for lo := 0; lo < len(src); lo += sumBlock {
		s := src[lo:min(lo+sumBlock, len(src))]
		t := tmp[:len(s)]
		for i, f := range s {
			t[i] = float32(f * scale)
		}
		f32ToHalfGeneric(dst[lo:lo+len(t)], t)
	}
}

func scaleToBF16Generic(dst []uint16, src []float32, scale float32) {
	var tmp [sumBlock]float32
	for lo := 0; lo < len(src); lo += sumBlock {
		s := src[lo:min(lo+sumBlock, len(src))]
		t := tmp[:len(s)]
		for i, f := range s {
			t[i] = float32(f * scale)
		}
		f32ToBF16Generic(dst[lo:lo+len(t)], t)
	}
}

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
		if scaled {
			for i := range a {
				a[i] = float32(a[i] * scale)
			}
		}
		f32ToHalfGeneric(dst[lo:hi], a)
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
		if scaled {
			for i := range a {
				a[i] = float32(a[i] * scale)
			}
		}
		f32ToBF16Generic(dst[lo:hi], a)
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
