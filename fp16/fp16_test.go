package fp16

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// forEachImpl runs f once per implementation usable on this machine, with
// that implementation active.
func forEachImpl(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	for _, k := range availableKernels() {
		t.Run(k.name, func(t *testing.T) {
			saved := active
			active = k
			defer func() { active = saved }()
			f(t)
		})
	}
}

// refTable is an independent reference rounding: the finite non-negative
// values of a 16-bit format in increasing order, each with its encoding,
// followed by the first power of two past the largest finite value, which
// stands for +Inf (its encoding is even, as that rule needs).
type refTable struct {
	vals []float64
	bits []uint16
	nan  func(u uint32) uint16 // how the format encodes a float32 NaN
}

func newRefTable(decode func(uint16) float64, inf uint16, infVal float64, nan func(uint32) uint16) *refTable {
	r := &refTable{nan: nan}
	for b := uint16(0); b < inf; b++ {
		r.vals = append(r.vals, decode(b))
		r.bits = append(r.bits, b)
	}
	if !slices.IsSorted(r.vals) {
		panic("reference values not increasing")
	}
	r.vals = append(r.vals, infVal)
	r.bits = append(r.bits, inf)
	return r
}

// round returns the encoding nearest to f, ties to the even encoding.
func (r *refTable) round(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	if math.IsNaN(float64(f)) {
		return r.nan(u)
	}
	x := math.Abs(float64(f))
	i, _ := slices.BinarySearch(r.vals, x) // first value >= x
	if i == len(r.vals) {
		return sign | r.bits[len(r.bits)-1]
	}
	if i == 0 || r.vals[i] == x {
		return sign | r.bits[i]
	}
	lo, hi := x-r.vals[i-1], r.vals[i]-x
	switch {
	case lo < hi:
		return sign | r.bits[i-1]
	case hi < lo:
		return sign | r.bits[i]
	case r.bits[i]&1 == 0:
		return sign | r.bits[i]
	default:
		return sign | r.bits[i-1]
	}
}

// decodeHalf is the textbook value of a finite binary16.
func decodeHalf(h uint16) float64 {
	e, m := int(h>>10&0x1f), float64(h&0x3ff)
	v := math.Ldexp(m, -24)
	if e > 0 {
		v = math.Ldexp(1024+m, e-25)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

// decodeBF16 is the textbook value of a finite bfloat16.
func decodeBF16(b uint16) float64 {
	e, m := int(b>>7&0xff), float64(b&0x7f)
	v := math.Ldexp(m, -133)
	if e > 0 {
		v = math.Ldexp(128+m, e-134)
	}
	if b&0x8000 != 0 {
		v = -v
	}
	return v
}

var (
	refHalf = newRefTable(decodeHalf, 0x7c00, 65536, func(u uint32) uint16 {
		return uint16(u>>16)&0x8000 | 0x7e00 | uint16(u>>13)&0x3ff
	})
	refBF16 = newRefTable(decodeBF16, 0x7f80, 0x1p128, func(u uint32) uint16 {
		return uint16(u>>16) | 0x40
	})
)

// probes returns float32 inputs that decide a rounding to the format of r:
// every representable value and every midpoint between neighbours, each
// with its float32 neighbours, negated as well.
func (r *refTable) probes() []float32 {
	var ps []float32
	add := func(x float64) {
		f := float32(x)
		if float64(f) != x {
			panic(fmt.Sprintf("probe %g not a float32", x))
		}
		for _, g := range []float32{f, math.Nextafter32(f, 0), math.Nextafter32(f, float32(math.Inf(1)))} {
			ps = append(ps, g, -g)
		}
	}
	for i, v := range r.vals {
		if i+1 < len(r.vals) {
			add((v + r.vals[i+1]) / 2)
		}
		if v < math.MaxFloat32 {
			add(v)
		}
	}
	return ps
}

func TestFromFloat32Examples(t *testing.T) {
	tests := []struct {
		in   uint32
		half uint16
		bf16 uint16
	}{
		{0x00000000, 0x0000, 0x0000},
		{0x80000000, 0x8000, 0x8000},
		{0x3f800000, 0x3c00, 0x3f80}, // 1
		{0xc0400000, 0xc200, 0xc040}, // -3
		{0x477fe000, 0x7bff, 0x4780}, // 65504
		{0x477fefff, 0x7bff, 0x4780}, // 65519.996
		{0x477ff000, 0x7c00, 0x4780}, // 65520
		{0x7f7fffff, 0x7c00, 0x7f80}, // MaxFloat32
		{0x7f7f7fff, 0x7c00, 0x7f7f},
		{0x7f800000, 0x7c00, 0x7f80}, // +Inf
		{0xff800000, 0xfc00, 0xff80}, // -Inf
		{0x7f800001, 0x7e00, 0x7fc0}, // signalling NaN, low payload
		{0x7f802000, 0x7e01, 0x7fc0},
		{0x7fffffff, 0x7fff, 0x7fff},
		{0xffc00000, 0xfe00, 0xffc0},
		{0xff810000, 0xfe08, 0xffc1},
		{0x38800000, 0x0400, 0x3880}, // 2^-14, smallest normal half
		{0x387fc000, 0x03ff, 0x3880}, // largest subnormal half
		{0x387fe000, 0x0400, 0x3880}, // tie rounds up to even
		{0x33800000, 0x0001, 0x3380}, // 2^-24, smallest subnormal half
		{0x33000000, 0x0000, 0x3300}, // 2^-25: tie to even (zero)
		{0x33000001, 0x0001, 0x3300},
		{0xb3000001, 0x8001, 0xb300},
		{0x33c00000, 0x0002, 0x33c0}, // 1.5 * 2^-24: tie to even (2)
		{0x33a00000, 0x0001, 0x33a0}, // 1.25 * 2^-24
		{0x00000001, 0x0000, 0x0000}, // float32 subnormals: not flushed in bf16
		{0x00008000, 0x0000, 0x0000}, // tie to even
		{0x00018000, 0x0000, 0x0002}, // tie to even, up
		{0x007fffff, 0x0000, 0x0080}, // carries into the exponent
		{0x807fffff, 0x8000, 0x8080},
		{0x3f808000, 0x3c04, 0x3f80}, // bf16 tie, even stays
		{0x3f818000, 0x3c0c, 0x3f82}, // bf16 tie, odd rounds up
		{0x3f808001, 0x3c04, 0x3f81},
	}
	for _, tt := range tests {
		f := math.Float32frombits(tt.in)
		if got := FromFloat32(f); got != tt.half {
			t.Errorf("FromFloat32(%#08x) = %#04x, want %#04x", tt.in, got, tt.half)
		}
		if got := BFloat16FromFloat32(f); got != tt.bf16 {
			t.Errorf("BFloat16FromFloat32(%#08x) = %#04x, want %#04x", tt.in, got, tt.bf16)
		}
		if got := refHalf.round(f); got != tt.half {
			t.Errorf("reference half(%#08x) = %#04x, want %#04x", tt.in, got, tt.half)
		}
		if got := refBF16.round(f); got != tt.bf16 {
			t.Errorf("reference bf16(%#08x) = %#04x, want %#04x", tt.in, got, tt.bf16)
		}
	}
	forEachImpl(t, func(t *testing.T) {
		for _, tt := range tests {
			f := math.Float32frombits(tt.in)
			h, b := []uint16{0}, []uint16{0}
			Float32ToHalf(h, []float32{f})
			Float32ToBFloat16(b, []float32{f})
			// Also through the SIMD loop, in the middle of a block.
			src := make([]float32, 40)
			src[13] = f
			hs, bs := make([]uint16, 40), make([]uint16, 40)
			Float32ToHalf(hs, src)
			Float32ToBFloat16(bs, src)
			if h[0] != tt.half || hs[13] != tt.half {
				t.Errorf("Float32ToHalf(%#08x) = %#04x, %#04x in a block; want %#04x", tt.in, h[0], hs[13], tt.half)
			}
			if b[0] != tt.bf16 || bs[13] != tt.bf16 {
				t.Errorf("Float32ToBFloat16(%#08x) = %#04x, %#04x in a block; want %#04x", tt.in, b[0], bs[13], tt.bf16)
			}
		}
	})
}

// TestScalarAgainstReference checks the scalar conversions against the
// table reference at every point where a rounding decision changes, and at
// random points.
func TestScalarAgainstReference(t *testing.T) {
	for _, c := range []struct {
		name string
		ref  *refTable
		conv func(float32) uint16
	}{
		{"half", refHalf, FromFloat32},
		{"bf16", refBF16, BFloat16FromFloat32},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := c.ref.probes()
			rng := rand.New(rand.NewPCG(1, 2))
			for range 200000 {
				ps = append(ps, math.Float32frombits(rng.Uint32()))
			}
			bad := 0
			for _, f := range ps {
				if got, want := c.conv(f), c.ref.round(f); got != want {
					if bad++; bad <= 10 {
						t.Errorf("%s(%#08x) = %#04x, reference %#04x", c.name, math.Float32bits(f), got, want)
					}
				}
			}
			t.Logf("%d inputs", len(ps))
		})
	}
}

func TestExhaustiveHalf(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	for _, h := range all {
		f := ToFloat32(h)
		u := math.Float32bits(f)
		switch {
		case h&0x7fff > 0x7c00: // NaN
			want := uint32(h&0x8000)<<16 | 0x7fc00000 | uint32(h&0x3ff)<<13
			if u != want {
				t.Fatalf("ToFloat32(%#04x) = %#08x, want %#08x", h, u, want)
			}
			if back := FromFloat32(f); back != h|0x0200 {
				t.Fatalf("FromFloat32(ToFloat32(%#04x)) = %#04x, want %#04x", h, back, h|0x0200)
			}
		case h&0x7fff == 0x7c00:
			if !math.IsInf(float64(f), 0) || math.Signbit(float64(f)) != (h&0x8000 != 0) {
				t.Fatalf("ToFloat32(%#04x) = %v", h, f)
			}
		default:
			if want := decodeHalf(h); float64(f) != want || math.Signbit(float64(f)) != (h&0x8000 != 0) {
				t.Fatalf("ToFloat32(%#04x) = %v, want %v", h, f, want)
			}
			if back := FromFloat32(f); back != h {
				t.Fatalf("FromFloat32(ToFloat32(%#04x)) = %#04x", h, back)
			}
		}
	}
	forEachImpl(t, func(t *testing.T) {
		got := make([]float32, len(all))
		HalfToFloat32(got, all)
		for i, h := range all {
			if math.Float32bits(got[i]) != math.Float32bits(ToFloat32(h)) {
				t.Fatalf("HalfToFloat32(%#04x) = %#08x, want %#08x", h, math.Float32bits(got[i]), math.Float32bits(ToFloat32(h)))
			}
		}
		back := make([]uint16, len(all))
		Float32ToHalf(back, got)
		for i, h := range all {
			want := h
			if h&0x7fff > 0x7c00 {
				want |= 0x0200
			}
			if back[i] != want {
				t.Fatalf("Float32ToHalf(HalfToFloat32(%#04x)) = %#04x, want %#04x", h, back[i], want)
			}
		}
	})
}

func TestExhaustiveBFloat16(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	for _, b := range all {
		f := BFloat16ToFloat32Scalar(b)
		if u := math.Float32bits(f); u != uint32(b)<<16 {
			t.Fatalf("BFloat16ToFloat32Scalar(%#04x) = %#08x", b, u)
		}
		if b&0x7fff < 0x7f80 && float64(f) != decodeBF16(b) {
			t.Fatalf("BFloat16ToFloat32Scalar(%#04x) = %v, want %v", b, f, decodeBF16(b))
		}
		want := b
		if b&0x7fff > 0x7f80 {
			want |= 0x40
		}
		if back := BFloat16FromFloat32(f); back != want {
			t.Fatalf("BFloat16FromFloat32(%v) = %#04x, want %#04x", f, back, want)
		}
	}
	forEachImpl(t, func(t *testing.T) {
		got := make([]float32, len(all))
		BFloat16ToFloat32(got, all)
		for i, b := range all {
			if math.Float32bits(got[i]) != uint32(b)<<16 {
				t.Fatalf("BFloat16ToFloat32(%#04x) = %#08x", b, math.Float32bits(got[i]))
			}
		}
		back := make([]uint16, len(all))
		Float32ToBFloat16(back, got)
		for i, b := range all {
			want := b
			if b&0x7fff > 0x7f80 {
				want |= 0x40
			}
			if back[i] != want {
				t.Fatalf("Float32ToBFloat16(BFloat16ToFloat32(%#04x)) = %#04x, want %#04x", b, back[i], want)
			}
		}
	})
}

// interesting returns n float32 values mixing ordinary magnitudes with
// values at every edge: zeros, subnormals, overflow, Inf, NaN.
func interesting(rng *rand.Rand, n int) []float32 {
	edges := []uint32{0, 0x80000000, 1, 0x807fffff, 0x33000000, 0x33000001, 0x387fe000,
		0x477fefff, 0x477ff000, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7f800001, 0xffc12345}
	s := make([]float32, n)
	for i := range s {
		switch rng.IntN(4) {
		case 0:
			s[i] = math.Float32frombits(edges[rng.IntN(len(edges))])
		case 1:
			s[i] = math.Float32frombits(rng.Uint32())
		default:
			s[i] = float32(rng.NormFloat64() * 100)
		}
	}
	return s
}

// TestTails runs every bulk function over lengths 0..67 starting at
// unaligned offsets, and checks that no element outside dst is written.
func TestTails(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const guard = 0xdead
	forEachImpl(t, func(t *testing.T) {
		for n := 0; n <= 67; n++ {
			for off := 0; off < 4; off++ {
				srcF := interesting(rng, off+n+3)[off : off+n]
				srcH := make([]uint16, off+n+3)[off : off+n]
				for i := range srcH {
					srcH[i] = uint16(rng.Uint32())
				}
				scale := float32(rng.NormFloat64())
				checkU16 := func(name string, conv func([]uint16), want func(i int) uint16) {
					t.Helper()
					buf := make([]uint16, off+n+3)
					for i := range buf {
						buf[i] = guard
					}
					conv(buf[off+1 : off+1+n])
					for i, v := range buf {
						if i < off+1 || i >= off+1+n {
							if v != guard {
								t.Fatalf("%s n=%d off=%d: wrote outside dst at %d", name, n, off, i-off-1)
							}
						} else if w := want(i - off - 1); v != w {
							t.Fatalf("%s n=%d off=%d: [%d] = %#04x, want %#04x", name, n, off, i-off-1, v, w)
						}
					}
				}
				checkF32 := func(name string, conv func([]float32), want func(i int) float32) {
					t.Helper()
					buf := make([]float32, off+n+3)
					for i := range buf {
						buf[i] = guard
					}
					conv(buf[off+1 : off+1+n])
					for i, v := range buf {
						if i < off+1 || i >= off+1+n {
							if v != guard {
								t.Fatalf("%s n=%d off=%d: wrote outside dst at %d", name, n, off, i-off-1)
							}
						} else if w := want(i - off - 1); math.Float32bits(v) != math.Float32bits(w) {
							t.Fatalf("%s n=%d off=%d: [%d] = %#08x, want %#08x", name, n, off, i-off-1, math.Float32bits(v), math.Float32bits(w))
						}
					}
				}
				checkU16("Float32ToHalf", func(d []uint16) { Float32ToHalf(d, srcF) },
					func(i int) uint16 { return FromFloat32(srcF[i]) })
				checkU16("Float32ToBFloat16", func(d []uint16) { Float32ToBFloat16(d, srcF) },
					func(i int) uint16 { return BFloat16FromFloat32(srcF[i]) })
				checkU16("ScaleToHalf", func(d []uint16) { ScaleToHalf(d, srcF, scale) },
					func(i int) uint16 { return FromFloat32(float32(srcF[i] * scale)) })
				checkU16("ScaleToBFloat16", func(d []uint16) { ScaleToBFloat16(d, srcF, scale) },
					func(i int) uint16 { return BFloat16FromFloat32(float32(srcF[i] * scale)) })
				checkF32("HalfToFloat32", func(d []float32) { HalfToFloat32(d, srcH) },
					func(i int) float32 { return ToFloat32(srcH[i]) })
				checkF32("BFloat16ToFloat32", func(d []float32) { BFloat16ToFloat32(d, srcH) },
					func(i int) float32 { return BFloat16ToFloat32Scalar(srcH[i]) })
			}
		}
	})
}

// sameResult reports whether two 16-bit results agree: bit for bit, or
// both NaN (a NaN sum's sign and payload are unspecified).
func sameResult(got, want uint16, nan func(uint16) bool) bool {
	return got == want || nan(got) && nan(want)
}

func isHalfNaN(h uint16) bool { return h&0x7fff > 0x7c00 }
func isBF16NaN(b uint16) bool { return b&0x7fff > 0x7f80 }

func TestSums(t *testing.T) {
	type format struct {
		name     string
		toF      func(uint16) float32
		fromF    func(float32) uint16
		nan      func(uint16) bool
		sum      func([]uint16, [][]uint16)
		sumScale func([]uint16, [][]uint16, float32)
	}
	formats := []format{
		{"half", ToFloat32, FromFloat32, isHalfNaN, SumHalf, SumScaledHalf},
		{"bf16", BFloat16ToFloat32Scalar, BFloat16FromFloat32, isBF16NaN, SumBFloat16, SumScaledBFloat16},
	}
	rng := rand.New(rand.NewPCG(5, 6))
	lengths := []int{}
	for n := 0; n <= 67; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 255, 256, 257, 1000, 4133)
	forEachImpl(t, func(t *testing.T) {
		for _, fm := range formats {
			for nsrc := 0; nsrc <= 5; nsrc++ {
				for _, n := range lengths {
					for _, alias := range []bool{false, true} {
						if alias && nsrc == 0 {
							continue
						}
						srcs := make([][]uint16, nsrc)
						for j := range srcs {
							vals := interesting(rng, n+1)
							srcs[j] = make([]uint16, n+1)[1:] // unaligned
							for i := range srcs[j] {
								srcs[j][i] = fm.fromF(vals[i])
								if rng.IntN(2) == 0 { // mostly ordinary numbers
									srcs[j][i] = fm.fromF(float32(rng.NormFloat64()))
								}
							}
						}
						scale := float32(1 / float64(1+rng.IntN(8)))
						want, wantScaled := make([]uint16, n), make([]uint16, n)
						for i := range n {
							var acc float32
							for j := range srcs {
								if j == 0 {
									acc = fm.toF(srcs[j][i])
								} else {
									acc = float32(acc + fm.toF(srcs[j][i]))
								}
							}
							want[i] = fm.fromF(acc)
							wantScaled[i] = fm.fromF(float32(acc * scale))
						}
						for _, scaled := range []bool{false, true} {
							ins := make([][]uint16, nsrc)
							for j := range srcs {
								ins[j] = slices.Clone(srcs[j])
							}
							dst := make([]uint16, n)
							if alias {
								dst = ins[nsrc-1]
							}
							w := want
							if scaled {
								fm.sumScale(dst, ins, scale)
								w = wantScaled
							} else {
								fm.sum(dst, ins)
							}
							for i := range n {
								if !sameResult(dst[i], w[i], fm.nan) {
									t.Fatalf("%s nsrc=%d n=%d alias=%v scaled=%v: [%d] = %#04x, want %#04x",
										fm.name, nsrc, n, alias, scaled, i, dst[i], w[i])
								}
							}
						}
					}
				}
			}
		}
	})
}

func TestLengthMismatchPanics(t *testing.T) {
	u4, u5, f5 := make([]uint16, 4), make([]uint16, 5), make([]float32, 5)
	f4 := make([]float32, 4)
	tests := []struct {
		name string
		call func()
		want string
	}{
		{"Float32ToHalf", func() { Float32ToHalf(u4, f5) }, "Float32ToHalf: len(dst) = 4, len(src) = 5"},
		{"HalfToFloat32", func() { HalfToFloat32(f4, u5) }, "HalfToFloat32: len(dst) = 4, len(src) = 5"},
		{"Float32ToBFloat16", func() { Float32ToBFloat16(u5, f4) }, "Float32ToBFloat16: len(dst) = 5, len(src) = 4"},
		{"BFloat16ToFloat32", func() { BFloat16ToFloat32(f5, u4) }, "BFloat16ToFloat32: len(dst) = 5, len(src) = 4"},
		{"ScaleToHalf", func() { ScaleToHalf(u4, f5, 2) }, "ScaleToHalf: len(dst) = 4, len(src) = 5"},
		{"ScaleToBFloat16", func() { ScaleToBFloat16(u4, f5, 2) }, "ScaleToBFloat16: len(dst) = 4, len(src) = 5"},
		{"SumHalf", func() { SumHalf(u4, [][]uint16{u4, u5}) }, "SumHalf: len(srcs[1]) = 5, len(dst) = 4"},
		{"SumBFloat16", func() { SumBFloat16(u5, [][]uint16{u4}) }, "SumBFloat16: len(srcs[0]) = 4, len(dst) = 5"},
		{"SumScaledHalf", func() { SumScaledHalf(u4, [][]uint16{u4, u4, u5}, 1) }, "SumScaledHalf: len(srcs[2]) = 5, len(dst) = 4"},
		{"SumScaledBFloat16", func() { SumScaledBFloat16(u4, [][]uint16{u5}, 1) }, "SumScaledBFloat16: len(srcs[0]) = 5, len(dst) = 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, tt.want) {
					t.Errorf("panic %q, want it to contain %q", msg, tt.want)
				}
			}()
			tt.call()
		})
	}
}

func TestSumNoSources(t *testing.T) {
	dst := []uint16{1, 2, 3}
	SumHalf(dst, nil)
	if !slices.Equal(dst, []uint16{0, 0, 0}) {
		t.Errorf("SumHalf with no sources left %v", dst)
	}
}

func TestNoAllocation(t *testing.T) {
	const n = 1031
	f := make([]float32, n)
	h := make([]uint16, n)
	srcs := [][]uint16{make([]uint16, n), make([]uint16, n), make([]uint16, n)}
	forEachImpl(t, func(t *testing.T) {
		for name, fn := range map[string]func(){
			"Float32ToHalf":     func() { Float32ToHalf(h, f) },
			"HalfToFloat32":     func() { HalfToFloat32(f, h) },
			"Float32ToBFloat16": func() { Float32ToBFloat16(h, f) },
			"BFloat16ToFloat32": func() { BFloat16ToFloat32(f, h) },
			"ScaleToHalf":       func() { ScaleToHalf(h, f, 0.5) },
			"ScaleToBFloat16":   func() { ScaleToBFloat16(h, f, 0.5) },
			"SumHalf":           func() { SumHalf(h, srcs) },
			"SumBFloat16":       func() { SumBFloat16(h, srcs) },
			"SumScaledHalf":     func() { SumScaledHalf(h, srcs, 0.25) },
			"SumScaledBFloat16": func() { SumScaledBFloat16(h, srcs, 0.25) },
		} {
			if a := testing.AllocsPerRun(20, fn); a != 0 {
				t.Errorf("%s: %v allocations per call", name, a)
			}
		}
	})
}

func TestImpl(t *testing.T) {
	ks := availableKernels()
	if Impl() != ks[0].name {
		t.Errorf("Impl() = %q, want the best available, %q", Impl(), ks[0].name)
	}
	if ks[len(ks)-1] != &genericKernels {
		t.Errorf("the portable kernels are not the last resort")
	}
	t.Logf("Impl() = %q, CPUFeatures() = %q", Impl(), CPUFeatures())
}

// TestLarge converts vectors big enough for the streaming stores, with
// destinations at every 2-byte misalignment within a cache line's first
// few bytes, and checks every element and the bytes around dst.
func TestLarge(t *testing.T) {
	const n = 3<<20/2 + 37 // past 2 MiB of halves
	rng := rand.New(rand.NewPCG(9, 10))
	srcF := interesting(rng, n)
	srcH := make([]uint16, n)
	for i := range srcH {
		srcH[i] = uint16(rng.Uint32())
	}
	forEachImpl(t, func(t *testing.T) {
		for _, off := range []int{0, 1, 5, 31} {
			bufH := make([]uint16, n+64)
			bufF := make([]float32, n+64)
			dH, dF := bufH[off:off+n], bufF[off:off+n]
			check16 := func(name string, want func(int) uint16) {
				for i, v := range dH {
					if w := want(i); v != w {
						t.Fatalf("%s off=%d: [%d] = %#04x, want %#04x", name, off, i, v, w)
					}
				}
				if bufH[off+n] != 0 || off > 0 && bufH[off-1] != 0 {
					t.Fatalf("%s off=%d: wrote outside dst", name, off)
				}
			}
			check32 := func(name string, want func(int) float32) {
				for i, v := range dF {
					if w := want(i); math.Float32bits(v) != math.Float32bits(w) {
						t.Fatalf("%s off=%d: [%d] = %#08x, want %#08x", name, off, i, math.Float32bits(v), math.Float32bits(w))
					}
				}
				if bufF[off+n] != 0 || off > 0 && bufF[off-1] != 0 {
					t.Fatalf("%s off=%d: wrote outside dst", name, off)
				}
			}
			Float32ToHalf(dH, srcF)
			check16("Float32ToHalf", func(i int) uint16 { return FromFloat32(srcF[i]) })
			Float32ToBFloat16(dH, srcF)
			check16("Float32ToBFloat16", func(i int) uint16 { return BFloat16FromFloat32(srcF[i]) })
			ScaleToHalf(dH, srcF, 0.375)
			check16("ScaleToHalf", func(i int) uint16 { return FromFloat32(float32(srcF[i] * 0.375)) })
			ScaleToBFloat16(dH, srcF, 0.375)
			check16("ScaleToBFloat16", func(i int) uint16 { return BFloat16FromFloat32(float32(srcF[i] * 0.375)) })
			HalfToFloat32(dF, srcH)
			check32("HalfToFloat32", func(i int) float32 { return ToFloat32(srcH[i]) })
			BFloat16ToFloat32(dF, srcH)
			check32("BFloat16ToFloat32", func(i int) float32 { return BFloat16ToFloat32Scalar(srcH[i]) })
			srcs := [][]uint16{srcH, srcH[1:], srcH[2:]}
			for j := range srcs {
				srcs[j] = srcs[j][:n-2]
			}
			SumScaledHalf(dH[:n-2], srcs, 0.5)
			check16("SumScaledHalf", func(i int) uint16 {
				if i >= n-2 {
					return dH[i] // not written by this call
				}
				acc := float32(ToFloat32(srcH[i]) + ToFloat32(srcH[i+1]))
				acc = float32(acc + ToFloat32(srcH[i+2]))
				if w := FromFloat32(float32(acc * 0.5)); !sameResult(dH[i], w, isHalfNaN) {
					return w
				}
				return dH[i]
			})
			SumBFloat16(dH[:n-2], srcs)
			check16("SumBFloat16", func(i int) uint16 {
				if i >= n-2 {
					return dH[i]
				}
				acc := float32(BFloat16ToFloat32Scalar(srcH[i]) + BFloat16ToFloat32Scalar(srcH[i+1]))
				acc = float32(acc + BFloat16ToFloat32Scalar(srcH[i+2]))
				if w := BFloat16FromFloat32(acc); !sameResult(dH[i], w, isBF16NaN) {
					return w
				}
				return dH[i]
			})
			if a := testing.AllocsPerRun(2, func() { Float32ToHalf(dH, srcF); HalfToFloat32(dF, srcH) }); a != 0 {
				t.Errorf("%v allocations per large conversion", a)
			}
		}
	})
}
