package reduce

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

func randF32(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		switch r.IntN(16) {
		case 0:
			s[i] = float32(math.NaN())
		case 1:
			s[i] = float32(math.Copysign(0, -1))
		case 2:
			s[i] = 0
		default:
			s[i] = float32(r.NormFloat64() * 100)
		}
	}
	return s
}

func sameF32(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// TestFloat32MatchesPortable checks the SIMD kernels against the portable
// ones bit for bit, for every length around the vector widths, with dst
// separate and aliasing either input.
func TestFloat32MatchesPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	kernels := []struct {
		name       string
		fast, slow Binary[float32]
	}{
		{"sum", SumFloat32, Sum[float32]},
		{"max", MaxFloat32, Max[float32]},
		{"min", MinFloat32, Min[float32]},
	}
	for _, k := range kernels {
		for n := 0; n < 100; n++ {
			a, b := randF32(r, n), randF32(r, n)
			want := make([]float32, n)
			k.slow(want, a, b)
			for alias := 0; alias < 3; alias++ {
				got := make([]float32, n)
				aa, bb := append([]float32(nil), a...), append([]float32(nil), b...)
				switch alias {
				case 0:
					k.fast(got, aa, bb)
				case 1:
					k.fast(aa, aa, bb)
					got = aa
				case 2:
					k.fast(bb, aa, bb)
					got = bb
				}
				for i := range want {
					if !sameF32(got[i], want[i]) {
						t.Fatalf("%s n=%d alias=%d: [%d] = %v, want %v (a=%v b=%v)", k.name, n, alias, i, got[i], want[i], a[i], b[i])
					}
				}
			}
		}
	}
}

func TestFloat64MatchesPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 70; n++ {
		a, b := make([]float64, n), make([]float64, n)
		for i := range a {
			a[i], b[i] = r.NormFloat64(), r.NormFloat64()
		}
		want, got := make([]float64, n), make([]float64, n)
		Sum(want, a, b)
		SumFloat64(got, a, b)
		for i := range want {
			if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
				t.Fatalf("n=%d [%d] = %v, want %v", n, i, got[i], want[i])
			}
		}
	}
}

func TestN(t *testing.T) {
	tests := []struct {
		op   comm.Op
		srcs [][]int32
		want []int32
	}{
		{comm.Sum, [][]int32{{1, 2, 3}}, []int32{1, 2, 3}},
		{comm.Sum, [][]int32{{1, 2, 3}, {10, 20, 30}}, []int32{11, 22, 33}},
		{comm.Sum, [][]int32{{1, 2, 3}, {10, 20, 30}, {100, 200, 300}, {-1, -2, -3}}, []int32{110, 220, 330}},
		{comm.Max, [][]int32{{1, 20, 3}, {10, 2, 30}, {5, 5, 5}}, []int32{10, 20, 30}},
		{comm.Min, [][]int32{{1, 20, 3}, {10, 2, 30}, {5, 5, -5}}, []int32{1, 2, -5}},
	}
	for _, tt := range tests {
		for alias := -1; alias < len(tt.srcs); alias++ {
			srcs := make([][]int32, len(tt.srcs))
			for i, s := range tt.srcs {
				srcs[i] = append([]int32(nil), s...)
			}
			dst := make([]int32, len(tt.want))
			if alias >= 0 {
				dst = srcs[alias]
			}
			N(Kernel[int32](tt.op), dst, srcs, make([]int32, len(dst)))
			for i := range dst {
				if dst[i] != tt.want[i] {
					t.Errorf("%s %v alias %d: got %v, want %v", tt.op, tt.srcs, alias, dst, tt.want)
					break
				}
			}
		}
	}
}

func TestDiv(t *testing.T) {
	i := []int32{7, -7, 6}
	Div(i, 2)
	if i[0] != 3 || i[1] != -3 || i[2] != 3 {
		t.Errorf("int32 Div: %v", i)
	}
	f := []float32{1, 2}
	Div(f, 3)
	if f[0] != float32(1)/3 || f[1] != float32(2)/3 {
		t.Errorf("float32 Div: %v", f)
	}
	// A divisor that does not fit in the element type: every element is
	// smaller than it, so the quotient is 0 (and nothing divides by zero).
	for _, n := range []int{255, 256, 257, 1000} {
		u := []uint8{255, 254, 1, 0}
		Div(u, n)
		for i, v := range u {
			if want := uint8([]int{255, 254, 1, 0}[i] / n); v != want {
				t.Errorf("uint8 Div by %d: %v, want element %d = %d", n, u, i, want)
			}
		}
	}
	// A float divisor rounded to the type is still a divisor, not 0.
	g := []float32{1 << 25}
	Div(g, 1<<24+1)
	if g[0] != float32(1<<25)/float32(1<<24+1) {
		t.Errorf("float32 Div by 2^24+1: %v", g)
	}
}

func TestHalfOrder(t *testing.T) {
	// binary16 bit patterns in increasing order.
	ordered := []uint16{0xfc00, 0xc000, 0xbc00, 0x8001, 0x8000, 0x0000, 0x0001, 0x3c00, 0x4000, 0x7c00}
	for i := range ordered {
		for j := range ordered {
			d := []uint16{0}
			MaxHalf(d, ordered[i:i+1], ordered[j:j+1])
			if want := ordered[max(i, j)]; d[0] != want {
				t.Errorf("MaxHalf(%#x, %#x) = %#x, want %#x", ordered[i], ordered[j], d[0], want)
			}
			MinHalf(d, ordered[i:i+1], ordered[j:j+1])
			if want := ordered[min(i, j)]; d[0] != want {
				t.Errorf("MinHalf(%#x, %#x) = %#x, want %#x", ordered[i], ordered[j], d[0], want)
			}
		}
	}
}

func FuzzSumFloat32(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(0))
	f.Fuzz(func(t *testing.T, raw []byte, sel uint8) {
		n := len(raw) / 8
		a, b := make([]float32, n), make([]float32, n)
		for i := range n {
			a[i] = math.Float32frombits(uint32(raw[8*i]) | uint32(raw[8*i+1])<<8 | uint32(raw[8*i+2])<<16 | uint32(raw[8*i+3])<<24)
			b[i] = math.Float32frombits(uint32(raw[8*i+4]) | uint32(raw[8*i+5])<<8 | uint32(raw[8*i+6])<<16 | uint32(raw[8*i+7])<<24)
		}
		fast, slow := []Binary[float32]{SumFloat32, MaxFloat32, MinFloat32}, []Binary[float32]{Sum[float32], Max[float32], Min[float32]}
		k := int(sel) % 3
		got, want := make([]float32, n), make([]float32, n)
		fast[k](got, a, b)
		slow[k](want, a, b)
		for i := range got {
			if !sameF32(got[i], want[i]) {
				t.Fatalf("kernel %d [%d]: %v vs %v", k, i, got[i], want[i])
			}
		}
	})
}

func BenchmarkSumFloat32(b *testing.B) {
	for _, n := range []int{1024, 1 << 20} {
		x, y := make([]float32, n), make([]float32, n)
		b.Run(fmt.Sprintf("%dKiB", 4*n>>10), func(b *testing.B) {
			b.SetBytes(int64(12 * n))
			for b.Loop() {
				SumFloat32(x, x, y)
			}
		})
	}
}

func TestSumFloat32Twice(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for n := 0; n < 80; n++ {
		a, b := randF32(r, n), randF32(r, n)
		want := make([]float32, n)
		Sum(want, a, b)
		// In place, as the two-rank all-reduce uses it: dst0 = a, dst1 = b.
		x, y := append([]float32(nil), a...), append([]float32(nil), b...)
		SumFloat32Twice(x, y, x, y)
		for i := range want {
			if !sameF32(x[i], want[i]) || !sameF32(y[i], want[i]) {
				t.Fatalf("n=%d [%d]: %v, %v; want %v", n, i, x[i], y[i], want[i])
			}
		}
	}
}

func TestAvgFloat32Twice(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for n := 0; n < 80; n++ {
		a, b := randF32(r, n), randF32(r, n)
		want := make([]float32, n)
		preMulSum(want, a, b, 0.5)
		x, y := append([]float32(nil), a...), append([]float32(nil), b...)
		AvgFloat32Twice(x, y, x, y)
		for i := range want {
			if !sameF32(x[i], want[i]) || !sameF32(y[i], want[i]) {
				t.Fatalf("n=%d [%d]: %v, %v; want %v", n, i, x[i], y[i], want[i])
			}
		}
	}
}

// randEdgeF32 is randF32 with the values where halving and overflow bite:
// subnormals (halving rounds), the largest finite values (a sum
// overflows), infinities and signed zeros.
func randEdgeF32(r *rand.Rand, n int) []float32 {
	s := randF32(r, n)
	for i := range s {
		switch r.IntN(8) {
		case 0:
			s[i] = math.Float32frombits(r.Uint32() & 0x807fffff) // subnormal or zero
		case 1:
			s[i] = float32(math.Copysign(math.MaxFloat32, float64(r.IntN(2)*2-1)))
		case 2:
			s[i] = float32(math.Inf(r.IntN(2)*2 - 1))
		case 3:
			s[i] = math.Float32frombits(r.Uint32()) // anything, NaNs included
		}
	}
	return s
}

// TestTwiceKernels checks SumFloat32Twice and AvgFloat32Twice against Sum
// (and the portable pre-multiplied sum with s = 0.5) bit for bit, for every length across the vector
// block and the scalar tail, at unaligned starts, with the destinations
// separate from the inputs, in place, swapped, and one of them aliased.
func TestTwiceKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	kernels := []struct {
		name string
		fast func(dst0, dst1, a, b []float32)
		avg  bool
	}{{"SumFloat32Twice", SumFloat32Twice, false}, {"AvgFloat32Twice", AvgFloat32Twice, true}}
	aliases := []string{"separate", "in place", "swapped", "dst0=a", "dst1=b", "dst0=b dst1=a"}
	for _, k := range kernels {
		for n := 0; n < 140; n++ {
			for off := range 3 {
				a, b := randEdgeF32(r, n+off)[off:], randEdgeF32(r, n+off)[off:]
				want := make([]float32, n)
				Sum(want, a, b)
				if k.avg {
					preMulSum(want, a, b, 0.5)
				}
				for _, alias := range aliases {
					aa, bb := append([]float32(nil), a...), append([]float32(nil), b...)
					d0, d1 := make([]float32, n+off)[off:], make([]float32, n+off)[off:]
					switch alias {
					case "in place":
						d0, d1 = aa, bb
					case "swapped":
						d0, d1 = bb, aa
					case "dst0=a":
						d0 = aa
					case "dst1=b":
						d1 = bb
					case "dst0=b dst1=a":
						d0, d1 = bb, aa
					}
					k.fast(d0, d1, aa, bb)
					for i := range want {
						if !sameF32(d0[i], want[i]) || !sameF32(d1[i], want[i]) {
							t.Fatalf("%s n=%d offset %d %s: [%d] = %v, %v; want %v (a=%v b=%v)", k.name, n, off, alias, i, d0[i], d1[i], want[i], a[i], b[i])
						}
					}
				}
			}
		}
	}
}

// TestTwiceKernelsLong writes past no end: the destinations are the
// prefixes of longer slices whose tails must stay untouched.
func TestTwiceKernelsLong(t *testing.T) {
	for _, k := range []func(dst0, dst1, a, b []float32){SumFloat32Twice, AvgFloat32Twice} {
		for _, n := range []int{0, 1, 31, 32, 33, 4099} {
			a, b := make([]float32, n), make([]float32, n)
			for i := range a {
				a[i], b[i] = float32(i), 1
			}
			d0, d1 := make([]float32, n+40), make([]float32, n+40)
			for i := n; i < n+40; i++ {
				d0[i], d1[i] = -7, -7
			}
			k(d0[:n], d1[:n], a, b)
			for i := n; i < n+40; i++ {
				if d0[i] != -7 || d1[i] != -7 {
					t.Fatalf("n=%d: element %d past the end was written", n, i)
				}
			}
		}
	}
}

func FuzzTwiceKernels(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, false)
	f.Fuzz(func(t *testing.T, raw []byte, avg bool) {
		n := len(raw) / 8
		a, b := make([]float32, n), make([]float32, n)
		for i := range n {
			a[i] = math.Float32frombits(uint32(raw[8*i]) | uint32(raw[8*i+1])<<8 | uint32(raw[8*i+2])<<16 | uint32(raw[8*i+3])<<24)
			b[i] = math.Float32frombits(uint32(raw[8*i+4]) | uint32(raw[8*i+5])<<8 | uint32(raw[8*i+6])<<16 | uint32(raw[8*i+7])<<24)
		}
		want := make([]float32, n)
		Sum(want, a, b)
		k := SumFloat32Twice
		if avg {
			preMulSum(want, a, b, 0.5)
			k = AvgFloat32Twice
		}
		k(a, b, a, b)
		for i := range want {
			if !sameF32(a[i], want[i]) || !sameF32(b[i], want[i]) {
				t.Fatalf("avg %v [%d]: %v, %v; want %v", avg, i, a[i], b[i], want[i])
			}
		}
	})
}

// TestLongRuns checks every SIMD kernel on a buffer that spans several of
// the runs one assembly call is limited to, with a ragged end.
func TestLongRuns(t *testing.T) {
	n := 2*(1<<18) + 37
	r := rand.New(rand.NewPCG(11, 12))
	a, b := randF32(r, n), randF32(r, n)
	kernels := []struct {
		name       string
		fast, slow Binary[float32]
	}{
		{"sum", SumFloat32, Sum[float32]},
		{"max", MaxFloat32, Max[float32]},
		{"min", MinFloat32, Min[float32]},
		{"sum twice", func(dst, a, b []float32) {
			other := make([]float32, len(dst))
			SumFloat32Twice(dst, other, a, b)
			for i := range dst {
				if !sameF32(dst[i], other[i]) {
					t.Fatalf("sum twice: dst1[%d] = %v, dst0 %v", i, other[i], dst[i])
				}
			}
		}, Sum[float32]},
		{"avg twice", func(dst, a, b []float32) { AvgFloat32Twice(dst, make([]float32, len(dst)), a, b) }, func(dst, a, b []float32) {
			preMulSum(dst, a, b, 0.5)
		}},
		{"pre-multiplied sum", func(dst, a, b []float32) { PreMulSumFloat32(dst, a, b, 1.0/3) }, func(dst, a, b []float32) {
			preMulSum(dst, a, b, 1.0/3)
		}},
		{"add scaled", func(dst, a, b []float32) { AddScaledFloat32(dst, a, b, 1.0/3) }, func(dst, a, b []float32) {
			addScaled(dst, a, b, 1.0/3)
		}},
	}
	for _, k := range kernels {
		got, want := make([]float32, n+1), make([]float32, n)
		got[n] = 42
		k.fast(got[:n], a, b)
		k.slow(want, a, b)
		for i := range want {
			if !sameF32(got[i], want[i]) {
				t.Fatalf("%s: [%d] = %v, want %v", k.name, i, got[i], want[i])
			}
		}
		if got[n] != 42 {
			t.Fatalf("%s wrote past the end", k.name)
		}
	}
	x, y := make([]float64, n), make([]float64, n)
	for i := range x {
		x[i], y[i] = r.NormFloat64(), r.NormFloat64()
	}
	got, want := make([]float64, n), make([]float64, n)
	SumFloat64(got, x, y)
	Sum(want, x, y)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("float64 sum: [%d] = %v, want %v", i, got[i], want[i])
		}
	}
}

// BenchmarkTwice times the two-rank all-reduce kernels in place; Avg
// should cost what Sum costs (both are bound by memory, or by the loads
// and stores of one pass when the buffers sit in cache).
func BenchmarkTwice(b *testing.B) {
	for _, n := range []int{1024, 1 << 20} {
		x, y := make([]float32, n), make([]float32, n)
		for i := range x {
			x[i], y[i] = float32(i), 1
		}
		for _, k := range []struct {
			name string
			f    func(dst0, dst1, a, b []float32)
		}{{"sum", SumFloat32Twice}, {"avg", AvgFloat32Twice}} {
			b.Run(fmt.Sprintf("%s/%dKiB", k.name, 4*n>>10), func(b *testing.B) {
				b.SetBytes(int64(16 * n))
				for b.Loop() {
					k.f(x, y, x, y)
				}
			})
		}
	}
}
