package fp16

import "math"

// FromFloat32 returns the binary16 nearest to f (ties to even).
//
// It is the reference the bulk kernels are tested against, so it is written
// for clarity: integer arithmetic, one case per kind of result.
func FromFloat32(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u &^ (1 << 31) // magnitude bits
	switch {
	case a > 0x7f800000: // NaN: quiet, top 10 payload bits kept
		return sign | 0x7e00 | uint16(a>>13)&0x3ff
	case a >= 0x477ff000: // 65520 (halfway from 65504 to 2^16) and up, Inf
		return sign | 0x7c00
	case a >= 0x38800000: // 2^-14 and up: a normal half
		// Rebias the exponent from 127 to 15 (subtract 112<<23); a carry
		// out of the mantissa correctly bumps the exponent.
		return sign | uint16(shiftRoundEven(a-112<<23, 13))
	case a < 0x33000000: // below 2^-25: rounds to zero
		return sign
	default: // a subnormal half, in units of 2^-24
		e := a >> 23
		m := a&0x7fffff | 0x800000
		// f = m * 2^(e-150); in units of 2^-24 that is m >> (126-e).
		return sign | uint16(shiftRoundEven(m, 126-e))
	}
}

// shiftRoundEven returns x / 2^s rounded to nearest, ties to even; 1 <= s < 32.
func shiftRoundEven(x, s uint32) uint32 {
	q := x >> s
	rem := x & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	return q
}

// ToFloat32 returns the float32 value of the binary16 h, which is exact.
// A NaN's payload moves to the top of float32's and is made quiet.
func ToFloat32(h uint16) float32 {
	a := uint32(h & 0x7fff)
	u := (a + 112<<10) << 13 // normal: rebias the exponent from 15 to 127
	if a < 0x0400 {          // zero or subnormal: a * 2^-24, exact in float32
		u = math.Float32bits(float32(a) * 0x1p-24)
	}
	if a >= 0x7c00 { // Inf or NaN
		u = 0x7f800000 | a<<13
		if a > 0x7c00 {
			u |= 0x00400000
		}
	}
	return math.Float32frombits(uint32(h&0x8000)<<16 | u)
}

// BFloat16FromFloat32 returns the bfloat16 nearest to f (ties to even).
// Subnormals are kept, not flushed.
func BFloat16FromFloat32(f float32) uint16 {
	u := math.Float32bits(f)
	if u&^(1<<31) > 0x7f800000 { // NaN: quiet, top payload bits kept
		return uint16(u>>16) | 0x0040
	}
	hi, lo := u>>16, u&0xffff
	if lo > 0x8000 || lo == 0x8000 && hi&1 == 1 {
		hi++ // may carry into the exponent, up to Inf: that is the rounding
	}
	return uint16(hi)
}

// BFloat16ToFloat32Scalar returns the float32 value of the bfloat16 b,
// which is exact.
func BFloat16ToFloat32Scalar(b uint16) float32 {
	return math.Float32frombits(uint32(b) << 16)
}
