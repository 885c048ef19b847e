package reduce

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/ddpgo/ddpgo/fp16"
)

// avgPortable is AvgFloat32 with the portable kernels only: the reference
// the SIMD path must match bit for bit.
func avgPortable[T ~float32 | ~float64](dst []T, srcs [][]T) {
	avgN(dst, srcs, make([]T, len(dst)), avgKernels[T]{Sum[T], preMulSum[T], addScaled[T], nonfinite[T]})
}

// bf16Portable is element i of AvgBFloat16, computed on its own with
// scalar arithmetic and conversions.
func bf16Portable(srcs [][]uint16, i int) uint16 {
	n := len(srcs)
	if n == 1 {
		return srcs[0][i]
	}
	s := float32(1) / float32(n)
	xs := make([]float32, n)
	finite := true
	for j, x := range srcs {
		xs[j] = fp16.BFloat16ToFloat32Scalar(x[i])
		finite = finite && !math.IsInf(float64(xs[j]), 0) && !math.IsNaN(float64(xs[j]))
	}
	premul := func() float32 {
		v := float32(xs[0]*s) + float32(xs[1]*s)
		for _, x := range xs[2:] {
			v += float32(x * s)
		}
		return v
	}
	var v float32
	if n&(n-1) == 0 {
		v = premul()
	} else {
		v = xs[0] + xs[1]
		for _, x := range xs[2:] {
			v += x
		}
		v *= s
		if finite && (math.IsInf(float64(v), 0) || math.IsNaN(float64(v))) {
			v = premul()
		}
	}
	return fp16.BFloat16FromFloat32(v)
}

// exactAvg returns the exact mean of xs (every float32 and float64 is a
// big.Float exactly; 4096 bits hold any sum of them) and the mean of their
// magnitudes.
func exactAvg(xs []float64) (avg, meanAbs *big.Float) {
	sum, abs := new(big.Float).SetPrec(4096), new(big.Float).SetPrec(4096)
	for _, x := range xs {
		v := new(big.Float).SetPrec(4096).SetFloat64(x)
		sum.Add(sum, v)
		abs.Add(abs, v.Abs(v))
	}
	n := new(big.Float).SetPrec(4096).SetInt64(int64(len(xs)))
	return sum.Quo(sum, n), abs.Quo(abs, n)
}

// avgBound is the documented error bound of a pre-multiplied average of n
// finite inputs: (n+2)·u·mean|x| + n·η/2.
func avgBound(meanAbs *big.Float, n int, u, eta float64) *big.Float {
	b := new(big.Float).SetPrec(4096).Mul(meanAbs, big.NewFloat(float64(n+2)*u))
	return b.Add(b, big.NewFloat(float64(n)*eta/2))
}

// within reports whether |got - avg| <= bound.
func within(got float64, avg, bound *big.Float) bool {
	d := new(big.Float).SetPrec(4096).SetFloat64(got)
	d.Sub(d, avg)
	return d.Abs(d).Cmp(bound) <= 0
}

const (
	u32, eta32 = 0x1p-24, 0x1p-149
	u64, eta64 = 0x1p-53, 0x1p-1074
)

func allFinite(xs []float64) bool {
	for _, x := range xs {
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return false
		}
	}
	return true
}

// checkAvg32 checks one element of a float32 average: bit for bit what
// the portable kernels give, and, for finite inputs, finite and within
// the documented bound of the exact average.
func checkAvg32(t *testing.T, what string, got, want float32, xs []float64) {
	t.Helper()
	if !sameF32(got, want) {
		t.Fatalf("%s: %v (%#x), portable kernels give %v (%#x); inputs %v", what, got, math.Float32bits(got), want, math.Float32bits(want), xs)
	}
	if !allFinite(xs) {
		return
	}
	avg, m := exactAvg(xs)
	if math.IsInf(float64(got), 0) || math.IsNaN(float64(got)) || !within(float64(got), avg, avgBound(m, len(xs), u32, eta32)) {
		t.Fatalf("%s: %v, exact average %v: outside (n+2)·u·mean|x| + n·η/2; inputs %v", what, got, avg, xs)
	}
}

func checkAvg64(t *testing.T, what string, got, want float64, xs []float64) {
	t.Helper()
	if math.Float64bits(got) != math.Float64bits(want) && !(got != got && want != want) {
		t.Fatalf("%s: %v, portable kernels give %v; inputs %v", what, got, want, xs)
	}
	if !allFinite(xs) {
		return
	}
	avg, m := exactAvg(xs)
	if math.IsInf(got, 0) || math.IsNaN(got) || !within(got, avg, avgBound(m, len(xs), u64, eta64)) {
		t.Fatalf("%s: %v, exact average %v: outside (n+2)·u·mean|x| + n·η/2; inputs %v", what, got, avg, xs)
	}
}

// TestAvgEdges: averages at the edges of the float32 and float64 ranges,
// whose sums overflow while the averages do not, and of subnormals.
func TestAvgEdges(t *testing.T) {
	const m32 = math.MaxFloat32
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64 // exact expected result; NaN to check the bound only
		nan  bool    // the result must be a NaN
	}{
		{"3e38 twice", []float64{3e38, 3e38}, float64(float32(3e38)), false},
		{"max twice", []float64{m32, m32}, m32, false},
		{"-max twice", []float64{-m32, -m32}, -m32, false},
		{"max and -max", []float64{m32, -m32}, 0, false},
		{"max three times", []float64{m32, m32, m32}, math.NaN(), false},
		{"max ten times (the sum rounds past max: saturated)", []float64{m32, m32, m32, m32, m32, m32, m32, m32, m32, m32}, m32, false},
		{"-max ten times", []float64{-m32, -m32, -m32, -m32, -m32, -m32, -m32, -m32, -m32, -m32}, -m32, false},
		{"3e38 four times", []float64{3e38, 3e38, 3e38, 3e38}, float64(float32(3e38)), false},
		{"smallest subnormal twice (halves round to 0)", []float64{eta32, eta32}, 0, false},
		{"subnormals 1 and 3 units", []float64{eta32, 3 * eta32}, 2 * eta32, false},
		{"largest subnormal twice", []float64{0x1p-126 - eta32, 0x1p-126 - eta32}, math.NaN(), false},
		{"subnormals over three ranks", []float64{eta32, 2 * eta32, 6 * eta32}, math.NaN(), false},
		{"max with infinity is infinite, not saturated", []float64{m32, m32, m32, math.Inf(1)}, math.Inf(1), false},
		{"infinities of both signs", []float64{math.Inf(1), math.Inf(-1)}, math.NaN(), true},
		{"NaN", []float64{1, math.NaN(), 2}, math.NaN(), true},
	} {
		n := len(tc.xs)
		for _, size := range []int{1, 8, 37} { // the scalar tail and the vector loop
			srcs := make([][]float32, n)
			for j, x := range tc.xs {
				srcs[j] = make([]float32, size)
				for i := range size {
					srcs[j][i] = float32(x)
				}
			}
			got, want := make([]float32, size), make([]float32, size)
			AvgFloat32(got, srcs, make([]float32, size))
			avgPortable(want, srcs)
			for i := range size {
				checkAvg32(t, tc.name, got[i], want[i], tc.xs)
				if !math.IsNaN(tc.want) && float64(got[i]) != tc.want || tc.nan && got[i] == got[i] {
					t.Fatalf("%s (%d elements): [%d] = %v, want %v", tc.name, size, i, got[i], tc.want)
				}
			}
		}
	}
	const m64 = math.MaxFloat64
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"max twice", []float64{m64, m64}, m64},
		{"max eleven times (saturated)", []float64{m64, m64, m64, m64, m64, m64, m64, m64, m64, m64, m64}, m64},
		{"1e308 three times", []float64{1e308, 1e308, 1e308}, math.NaN()},
		{"smallest subnormal twice", []float64{eta64, eta64}, 0},
		{"subnormals 1 and 3 units", []float64{eta64, 3 * eta64}, 2 * eta64},
		{"max with -infinity", []float64{m64, m64, m64, math.Inf(-1)}, math.Inf(-1)},
	} {
		for _, size := range []int{1, 4, 19} {
			srcs := make([][]float64, len(tc.xs))
			for j, x := range tc.xs {
				srcs[j] = make([]float64, size)
				for i := range size {
					srcs[j][i] = x
				}
			}
			got, want := make([]float64, size), make([]float64, size)
			AvgFloat64(got, srcs, make([]float64, size))
			avgPortable(want, srcs)
			for i := range size {
				checkAvg64(t, tc.name, got[i], want[i], tc.xs)
				if !math.IsNaN(tc.want) && got[i] != tc.want {
					t.Fatalf("float64 %s (%d elements): [%d] = %v, want %v", tc.name, size, i, got[i], tc.want)
				}
			}
		}
	}
}

// TestAvgNeverOverflows: the average of n copies of ±max is finite for
// every group size up to 300 and every power of two up to 2^12. Rounding
// is monotonic, so no inputs of smaller magnitude can overflow either.
func TestAvgNeverOverflows(t *testing.T) {
	sizes := []int{512, 1024, 2048, 4096}
	for n := 1; n <= 300; n++ {
		sizes = append(sizes, n)
	}
	for _, n := range sizes {
		for _, sign := range []float64{1, -1} {
			srcs32, srcs64 := make([][]float32, n), make([][]float64, n)
			for j := range n {
				srcs32[j] = []float32{float32(sign * math.MaxFloat32), 1, float32(sign * math.MaxFloat32), 0, 0, 0, 0, 0, 0}
				srcs64[j] = []float64{sign * math.MaxFloat64, 1, sign * math.MaxFloat64, 0, 0}
			}
			d32, d64 := make([]float32, 9), make([]float64, 5)
			AvgFloat32(d32, srcs32, make([]float32, 9))
			AvgFloat64(d64, srcs64, make([]float64, 5))
			if math.IsInf(float64(d32[0]), 0) || math.IsInf(d64[0], 0) || math.Abs(float64(d32[1])-1) > 1e-5 {
				t.Fatalf("n=%d, sign %v: float32 average %v, float64 %v; want finite", n, sign, d32, d64)
			}
		}
	}
}

// TestAvgMatchesPortable checks AvgFloat32 and AvgFloat64 against the
// portable kernels bit for bit and against the exact average within the
// documented bound, for 1 to 6 ranks, lengths across the vector blocks and
// the scalar tail, with dst separate or aliasing each input.
func TestAvgMatchesPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for n := 1; n <= 6; n++ {
		for _, size := range []int{0, 1, 7, 8, 9, 31, 32, 33, 70, 135} {
			for alias := -1; alias < n; alias++ {
				srcs := make([][]float32, n)
				for j := range srcs {
					srcs[j] = randEdgeF32(r, size)
				}
				want := make([]float32, size)
				avgPortable(want, srcs)
				orig := make([][]float32, n)
				for j, s := range srcs {
					orig[j] = append([]float32(nil), s...)
				}
				dst := make([]float32, size)
				if alias >= 0 {
					dst = srcs[alias]
				}
				AvgFloat32(dst, srcs, make([]float32, size))
				xs := make([]float64, n)
				for i := range size {
					for j := range n {
						xs[j] = float64(orig[j][i])
					}
					checkAvg32(t, "float32", dst[i], want[i], xs)
				}

				s64 := make([][]float64, n)
				for j := range s64 {
					s64[j] = make([]float64, size)
					for i := range s64[j] {
						s64[j][i] = float64(orig[j][i]) * math.Ldexp(1, 900*(r.IntN(3)-1))
					}
				}
				w64 := make([]float64, size)
				avgPortable(w64, s64)
				o64 := make([][]float64, n)
				for j, s := range s64 {
					o64[j] = append([]float64(nil), s...)
				}
				d64 := make([]float64, size)
				if alias >= 0 {
					d64 = s64[alias]
				}
				AvgFloat64(d64, s64, make([]float64, size))
				for i := range size {
					for j := range n {
						xs[j] = o64[j][i]
					}
					checkAvg64(t, "float64", d64[i], w64[i], xs)
				}
			}
		}
	}
}

// TestAvgFloat32Twice2Ranks: the two-output kernel of the two-rank
// all-reduce and AvgFloat32 over two ranks are the same average.
func TestAvgTwiceIsAvg(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for size := range 70 {
		a, b := randEdgeF32(r, size), randEdgeF32(r, size)
		d0, d1, want := make([]float32, size), make([]float32, size), make([]float32, size)
		AvgFloat32Twice(d0, d1, a, b)
		AvgFloat32(want, [][]float32{a, b}, nil)
		for i := range want {
			if !sameF32(d0[i], want[i]) || !sameF32(d1[i], want[i]) {
				t.Fatalf("n=%d [%d]: twice %v, %v; AvgFloat32 %v", size, i, d0[i], d1[i], want[i])
			}
		}
	}
}

func TestNonfinite(t *testing.T) {
	for size := range 70 {
		for _, pos := range []int{-1, 0, size / 2, size - 1} {
			for _, bad := range []float64{math.Inf(1), math.Inf(-1), math.NaN(), math.MaxFloat32} {
				x32, x64 := make([]float32, size), make([]float64, size)
				for i := range size {
					x32[i], x64[i] = float32(i)-5, float64(i)*1e300
				}
				want := false
				if pos >= 0 && size > 0 {
					x32[pos], x64[pos] = float32(bad), bad
					want = math.IsInf(bad, 0) || math.IsNaN(bad)
				}
				if got := nonfiniteFloat32(x32); got != want {
					t.Fatalf("float32 n=%d, %v at %d: %v, want %v", size, bad, pos, got, want)
				}
				if got := nonfiniteFloat64(x64); got != want {
					t.Fatalf("float64 n=%d, %v at %d: %v, want %v", size, bad, pos, got, want)
				}
			}
		}
	}
}

// TestAvgBFloat16 checks the bfloat16 average against its element-wise
// reference bit for bit, its bound against the exact average, and its
// edges: the largest finite bfloat16 (whose sum overflows even a float32)
// and subnormals; with scratch shorter than dst, and dst aliasing a src.
func TestAvgBFloat16(t *testing.T) {
	const bfMax, bfMin = 0x7f7f, 0x0001
	r := rand.New(rand.NewPCG(17, 18))
	edge := []uint16{bfMax, bfMax | 0x8000, bfMin, bfMin | 0x8000, 0x0080, 0x007f, 0x3f80, 0, 0x8000, 0x7f80, 0xff80, 0x7fc0}
	for _, n := range []int{1, 2, 3, 4, 7, 64, 256} {
		for _, size := range []int{0, 1, 9, 100} {
			for _, block := range []int{1, 7, 64} {
				srcs := make([][]uint16, n)
				for j := range srcs {
					srcs[j] = make([]uint16, size)
					for i := range size {
						switch r.IntN(4) {
						case 0:
							srcs[j][i] = edge[r.IntN(len(edge))]
						case 1:
							srcs[j][i] = bfMax // all-max elements appear often enough
						default:
							srcs[j][i] = uint16(r.Uint32())
						}
					}
				}
				if size > 0 {
					for j := range srcs {
						srcs[j][0] = bfMax
					}
				}
				want := make([]uint16, size)
				for i := range want {
					want[i] = bf16Portable(srcs, i)
				}
				orig := make([][]uint16, n)
				for j, s := range srcs {
					orig[j] = append([]uint16(nil), s...)
				}
				dst := srcs[n/2]
				AvgBFloat16(dst, srcs, make([]float32, block), make([]float32, block))
				xs := make([]float64, n)
				for i := range size {
					if dst[i] != want[i] && !(dst[i]&0x7fff > 0x7f80 && want[i]&0x7fff > 0x7f80) {
						t.Fatalf("n=%d size %d block %d: [%d] = %#04x, want %#04x", n, size, block, i, dst[i], want[i])
					}
					for j := range n {
						xs[j] = float64(fp16.BFloat16ToFloat32Scalar(orig[j][i]))
					}
					if !allFinite(xs) {
						continue
					}
					got := float64(fp16.BFloat16ToFloat32Scalar(dst[i]))
					avg, m := exactAvg(xs)
					e32 := avgBound(m, n, u32, eta32)
					// Half a bfloat16 ulp of the float32 average, plus its error.
					a, _ := avg.Float64()
					e32f, _ := e32.Float64()
					bound := new(big.Float).SetPrec(4096).SetFloat64(0x1p-8*(math.Abs(a)+e32f) + 0x1p-134)
					bound.Add(bound, e32)
					if math.IsInf(got, 0) || !within(got, avg, bound) {
						t.Fatalf("n=%d: [%d] = %v, exact average %v: outside the bound; inputs %v", n, i, got, avg, xs)
					}
					if i == 0 && dst[i] != bfMax {
						t.Fatalf("n=%d: the average of %d copies of the largest bfloat16 is %#04x, want %#04x", n, n, dst[i], bfMax)
					}
				}
			}
		}
	}
}

func TestAvgBFloat16Scratch(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("AvgBFloat16 with scratch of different lengths did not panic")
		}
	}()
	AvgBFloat16(make([]uint16, 4), [][]uint16{make([]uint16, 4), make([]uint16, 4)}, make([]float32, 4), make([]float32, 3))
}

func TestAvgAllocs(t *testing.T) {
	srcs := [][]float32{make([]float32, 300), make([]float32, 300), make([]float32, 300)}
	halves := [][]uint16{make([]uint16, 300), make([]uint16, 300), make([]uint16, 300)}
	dst, tmp, acc, wide := make([]float32, 300), make([]float32, 300), make([]float32, 64), make([]float32, 64)
	a := testing.AllocsPerRun(50, func() {
		AvgFloat32(dst, srcs, tmp)
		AvgBFloat16(halves[0], halves, acc, wide)
	})
	if a != 0 {
		t.Errorf("%v allocations per average, want 0", a)
	}
}

// FuzzAvg checks the float32 and bfloat16 averages of 1 to 8 ranks against
// the portable kernels and, for finite inputs, the exact average.
func FuzzAvg(f *testing.F) {
	f.Add(uint8(3), []byte{0xff, 0xff, 0x7f, 0x7f, 0xff, 0xff, 0x7f, 0x7f, 0xff, 0xff, 0x7f, 0x7f}, false)
	f.Add(uint8(2), []byte{1, 0, 0, 0, 3, 0, 0, 0}, false)
	f.Add(uint8(2), []byte{0x7f, 0x7f, 0x7f, 0x7f}, true)
	f.Fuzz(func(t *testing.T, ranks uint8, raw []byte, bf16 bool) {
		n := int(ranks)%8 + 1
		if bf16 {
			size := len(raw) / (2 * n)
			srcs := make([][]uint16, n)
			for j := range srcs {
				srcs[j] = make([]uint16, size)
				for i := range size {
					k := 2 * (j*size + i)
					srcs[j][i] = uint16(raw[k]) | uint16(raw[k+1])<<8
				}
			}
			got := make([]uint16, size)
			AvgBFloat16(got, srcs, make([]float32, 5), make([]float32, 5))
			for i := range size {
				if want := bf16Portable(srcs, i); got[i] != want && !(got[i]&0x7fff > 0x7f80 && want&0x7fff > 0x7f80) {
					t.Fatalf("bfloat16 [%d] = %#04x, want %#04x", i, got[i], want)
				}
			}
			return
		}
		size := len(raw) / (4 * n)
		srcs := make([][]float32, n)
		for j := range srcs {
			srcs[j] = make([]float32, size)
			for i := range size {
				k := 4 * (j*size + i)
				srcs[j][i] = math.Float32frombits(uint32(raw[k]) | uint32(raw[k+1])<<8 | uint32(raw[k+2])<<16 | uint32(raw[k+3])<<24)
			}
		}
		got, want := make([]float32, size), make([]float32, size)
		AvgFloat32(got, srcs, make([]float32, size))
		avgPortable(want, srcs)
		xs := make([]float64, n)
		for i := range size {
			for j := range n {
				xs[j] = float64(srcs[j][i])
			}
			checkAvg32(t, "fuzz", got[i], want[i], xs)
		}
	})
}
