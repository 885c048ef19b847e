package fp16

import (
	"encoding/binary"
	"math"
	"testing"
)

// FuzzConvert feeds arbitrary bytes, read as float32 and as 16-bit values,
// through every implementation's bulk conversions and checks them against
// the scalar functions, plus the round-trip property: a 16-bit value
// converted to float32 and back is itself (NaNs made quiet).
func FuzzConvert(f *testing.F) {
	f.Add([]byte{}, float32(1))
	f.Add([]byte{0, 0, 0x80, 0x3f, 0xff, 0xef, 0x7f, 0x47, 0x01, 0, 0x80, 0x7f}, float32(0.5))
	f.Add(make([]byte, 4*37), float32(-3))
	f.Fuzz(func(t *testing.T, data []byte, scale float32) {
		fs := make([]float32, len(data)/4)
		for i := range fs {
			fs[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		hs := make([]uint16, len(data)/2)
		for i := range hs {
			hs[i] = binary.LittleEndian.Uint16(data[2*i:])
		}
		refH, refB := make([]uint16, len(fs)), make([]uint16, len(fs))
		for i, x := range fs {
			if x == x {
				refH[i], refB[i] = nearest(float64(x), 5, 10), nearest(float64(x), 8, 7)
			}
		}
		forEachImpl(t, func(t *testing.T) {
			h := make([]uint16, len(fs))
			b := make([]uint16, len(fs))
			sh := make([]uint16, len(fs))
			sb := make([]uint16, len(fs))
			Float32ToHalf(h, fs)
			Float32ToBFloat16(b, fs)
			ScaleToHalf(sh, fs, scale)
			ScaleToBFloat16(sb, fs, scale)
			for i, x := range fs {
				if x == x && (h[i] != refH[i] || b[i] != refB[i]) {
					t.Fatalf("%#08x (%g): half %#04x bf16 %#04x; float64 reference %#04x %#04x",
						math.Float32bits(x), x, h[i], b[i], refH[i], refB[i])
				}
				if h[i] != FromFloat32(x) || b[i] != BFloat16FromFloat32(x) {
					t.Fatalf("%#08x: half %#04x bf16 %#04x, want %#04x %#04x",
						math.Float32bits(x), h[i], b[i], FromFloat32(x), BFloat16FromFloat32(x))
				}
				p := float32(x * scale)
				if !sameResult(sh[i], FromFloat32(p), isHalfNaN) || !sameResult(sb[i], BFloat16FromFloat32(p), isBF16NaN) {
					t.Fatalf("%#08x * %v: half %#04x bf16 %#04x, want %#04x %#04x",
						math.Float32bits(x), scale, sh[i], sb[i], FromFloat32(p), BFloat16FromFloat32(p))
				}
			}
			wide := make([]float32, len(hs))
			back := make([]uint16, len(hs))
			HalfToFloat32(wide, hs)
			Float32ToHalf(back, wide)
			for i, x := range hs {
				want := x
				if isHalfNaN(x) {
					want |= 0x0200
				}
				if math.Float32bits(wide[i]) != math.Float32bits(ToFloat32(x)) || back[i] != want {
					t.Fatalf("half %#04x: float32 %#08x, back %#04x", x, math.Float32bits(wide[i]), back[i])
				}
			}
			BFloat16ToFloat32(wide, hs)
			Float32ToBFloat16(back, wide)
			for i, x := range hs {
				want := x
				if isBF16NaN(x) {
					want |= 0x40
				}
				if math.Float32bits(wide[i]) != uint32(x)<<16 || back[i] != want {
					t.Fatalf("bf16 %#04x: float32 %#08x, back %#04x", x, math.Float32bits(wide[i]), back[i])
				}
			}
		})
	})
}

// nearest is the float64 reference of a conversion to a binary format
// with expBits and mantBits (5, 10: IEEE binary16; 8, 7: bfloat16),
// computed from the value, not the bits: x is divided by the format's ulp
// at its exponent (exact: a power of two), rounded to an integer, ties to
// even (math.RoundToEven), and the integer encoded; infinity from half an
// ulp above the largest finite value. x must not be NaN.
func nearest(x float64, expBits, mantBits uint) uint16 {
	sign := uint16(0)
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	bias := 1<<(expBits-1) - 1
	one := float64(uint64(1) << mantBits) // the implicit leading bit
	largest := math.Ldexp(2*one-1, bias-int(mantBits))
	if x >= largest+math.Ldexp(0.5, bias-int(mantBits)) {
		return sign | uint16(1<<expBits-1)<<mantBits
	}
	if x == 0 {
		return sign
	}
	_, e := math.Frexp(x) // x = f * 2^e, f in [0.5, 1)
	exp := max(e-1, 1-bias)
	q := math.RoundToEven(x / math.Ldexp(1, exp-int(mantBits)))
	if q == 2*one { // rounded up into the next binade
		exp, q = exp+1, one
	}
	if q < one { // subnormal: the exponent field is 0
		return sign | uint16(q)
	}
	return sign | uint16(exp+bias)<<mantBits | uint16(q-one)
}

// TestNearest checks the reference itself at the edges it must get right.
func TestNearest(t *testing.T) {
	for _, tt := range []struct {
		x          float64
		half, bf16 uint16
	}{
		{0, 0, 0}, {math.Copysign(0, -1), 0x8000, 0x8000}, {1, 0x3c00, 0x3f80},
		{1 + 0x1p-11, 0x3c00, 0x3f80}, {1 + 3*0x1p-11, 0x3c02, 0x3f80}, {1 + 0x1p-8, 0x3c04, 0x3f80}, {1 + 3*0x1p-8, 0x3c0c, 0x3f82},
		{65504, 0x7bff, 0x4780}, {65519.99, 0x7bff, 0x4780}, {65520, 0x7c00, 0x4780}, {-1e6, 0xfc00, 0xc974},
		{0x1p-24, 1, 0x3380}, {0x1p-25, 0, 0x3300}, {0x1p-25 * 1.0001, 1, 0x3300}, {3 * 0x1p-25, 2, 0x33c0},
		{math.MaxFloat32, 0x7c00, 0x7f80}, {0x1.fep127, 0x7c00, 0x7f7f}, {math.Inf(-1), 0xfc00, 0xff80},
		{0x1p-149, 0, 0}, {0x1p-133, 0, 1}, {0x1p-134, 0, 0}, {0x1.8p-134, 0, 1},
	} {
		if h, b := nearest(tt.x, 5, 10), nearest(tt.x, 8, 7); h != tt.half || b != tt.bf16 {
			t.Errorf("nearest(%g): half %#04x bf16 %#04x, want %#04x %#04x", tt.x, h, b, tt.half, tt.bf16)
		}
	}
}

// FuzzSum splits arbitrary bytes into 1 to 5 sources of 16-bit values and
// checks every implementation's sums against scalar float32 arithmetic.
func FuzzSum(f *testing.F) {
	f.Add([]byte{0, 0x3c, 0, 0x3c, 0xff, 0x7b, 0xff, 0x7b}, uint8(2), float32(0.5))
	f.Add(make([]byte, 2*3*41), uint8(3), float32(1))
	f.Fuzz(func(t *testing.T, data []byte, nsrc uint8, scale float32) {
		k := int(nsrc%5) + 1
		n := len(data) / 2 / k
		srcs := make([][]uint16, k)
		for j := range srcs {
			srcs[j] = make([]uint16, n)
			for i := range srcs[j] {
				srcs[j][i] = binary.LittleEndian.Uint16(data[2*(j*n+i):])
			}
		}
		forEachImpl(t, func(t *testing.T) {
			for _, fm := range []struct {
				name     string
				toF      func(uint16) float32
				fromF    func(float32) uint16
				nan      func(uint16) bool
				sum      func([]uint16, [][]uint16)
				sumScale func([]uint16, [][]uint16, float32)
			}{
				{"half", ToFloat32, FromFloat32, isHalfNaN, SumHalf, SumScaledHalf},
				{"bf16", BFloat16ToFloat32Scalar, BFloat16FromFloat32, isBF16NaN, SumBFloat16, SumScaledBFloat16},
			} {
				d1, d2 := make([]uint16, n), make([]uint16, n)
				fm.sum(d1, srcs)
				fm.sumScale(d2, srcs, scale)
				for i := range n {
					acc := fm.toF(srcs[0][i])
					for _, s := range srcs[1:] {
						acc = float32(acc + fm.toF(s[i]))
					}
					if w := fm.fromF(acc); !sameResult(d1[i], w, fm.nan) {
						t.Fatalf("%s sum [%d] = %#04x, want %#04x", fm.name, i, d1[i], w)
					}
					if w := fm.fromF(float32(acc * scale)); !sameResult(d2[i], w, fm.nan) {
						t.Fatalf("%s scaled sum [%d] = %#04x, want %#04x", fm.name, i, d2[i], w)
					}
				}
			}
		})
	})
}
