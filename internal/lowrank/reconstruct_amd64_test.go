//go:build !purego

package lowrank

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestReconstructKernelBits checks that the assembly Reconstruct gives the
// pure-Go kernel's bits, c and the error alike, over sizes with odd rows,
// columns that are not a multiple of 8 and more than one span of columns.
func TestReconstructKernelBits(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2: Reconstruct is the pure-Go kernel")
	}
	rng := rand.New(rand.NewPCG(27, 4))
	sizes := [][2]int{{1, 8}, {3, 9}, {5, 15}, {2, 16}, {7, 31}, {4, 511}, {3, 512}, {1, 513}, {9, 1030}, {2, 1543}}
	for range 20 {
		sizes = append(sizes, [2]int{1 + rng.IntN(9), 1 + rng.IntN(1200)})
	}
	for _, s := range sizes {
		n, m := s[0], s[1]
		for _, r := range []int{1, 4} {
			for _, withErr := range []bool{false, true} {
				t.Run(fmt.Sprintf("%dx%d_r%d_err%v", n, m, r, withErr), func(t *testing.T) {
					p, q := randMat(rng, n*r), randMat(rng, m*r)
					// Magnitudes spread over many binades, so that an
					// other order of the additions shows in the bits.
					for i := range q {
						q[i] *= float32(math.Ldexp(1, rng.IntN(20)-10))
					}
					got := randMat(rng, n*m)
					want := append([]float32(nil), got...)
					var gotE, wantE []float32
					if withErr {
						// What e held is overwritten, NaN or not.
						gotE, wantE = make([]float32, n*m), make([]float32, n*m)
						for i := range gotE {
							gotE[i] = float32(math.NaN())
						}
					}
					Reconstruct(got, gotE, p, q, n, m, r)
					reconstructGo(want, wantE, p, q, n, m, r, 0)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("c[%d] = %g (%#x), pure Go %g (%#x)", i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
						}
					}
					for i := range wantE {
						if math.Float32bits(gotE[i]) != math.Float32bits(wantE[i]) {
							t.Fatalf("e[%d] = %g, pure Go %g", i, gotE[i], wantE[i])
						}
					}
				})
			}
		}
	}
}

// pureGo runs f with the assembly kernels off.
func pureGo(f func()) {
	defer func(v bool) { useAVX2 = v }(useAVX2)
	useAVX2 = false
	f()
}

// TestProductKernelBits checks that MulQ and MulTP at rank 4 give the
// pure-Go kernels' bits with the assembly on, over row counts around the
// eight (MulQ) and four (MulTP) rows the kernels take at a time and
// column counts around their blocks of eight.
func TestProductKernelBits(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2: the products are the pure-Go kernels")
	}
	rng := rand.New(rand.NewPCG(27, 5))
	sizes := [][2]int{{8, 1}, {8, 8}, {9, 7}, {16, 9}, {4, 16}, {5, 17}, {17, 33}, {23, 64}, {31, 100}, {64, 1031}}
	for range 20 {
		sizes = append(sizes, [2]int{1 + rng.IntN(40), 1 + rng.IntN(300)})
	}
	const r = 4
	for _, s := range sizes {
		n, m := s[0], s[1]
		t.Run(fmt.Sprintf("%dx%d", n, m), func(t *testing.T) {
			c, q, p := randMat(rng, n*m), randMat(rng, m*r), randMat(rng, n*r)
			for i := range c {
				c[i] *= float32(math.Ldexp(1, rng.IntN(20)-10))
			}
			gotP, wantP := make([]float32, n*r), make([]float32, n*r)
			MulQ(gotP, c, q, n, m, r)
			pureGo(func() { MulQ(wantP, c, q, n, m, r) })
			gotQ, wantQ := make([]float32, m*r), make([]float32, m*r)
			MulTP(gotQ, c, p, n, m, r)
			pureGo(func() { MulTP(wantQ, c, p, n, m, r) })
			for i := range wantP {
				if math.Float32bits(gotP[i]) != math.Float32bits(wantP[i]) {
					t.Fatalf("MulQ: p[%d] = %g, pure Go %g", i, gotP[i], wantP[i])
				}
			}
			for i := range wantQ {
				if math.Float32bits(gotQ[i]) != math.Float32bits(wantQ[i]) {
					t.Fatalf("MulTP: q[%d] = %g, pure Go %g", i, gotQ[i], wantQ[i])
				}
			}
		})
	}
}

// FuzzReconstructKernelBits checks that the assembly Reconstruct gives
// the pure-Go kernel's bits for any size, rank 1 or 4, with or without the
// error, and values of any magnitude, zeros, infinities and NaNs among
// them. A NaN need only be a NaN: which of two NaN operands an addition
// passes on is not fixed (the package doc says so).
func FuzzReconstructKernelBits(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint16(9), false, true)
	f.Add(uint64(2), uint8(1), uint16(513), true, true)
	f.Add(uint64(3), uint8(8), uint16(1031), true, false)
	f.Add(uint64(4), uint8(2), uint16(8), false, false)
	f.Fuzz(func(t *testing.T, seed uint64, rows uint8, cols uint16, rank4, withErr bool) {
		if !useAVX2 {
			t.Skip("no AVX2: Reconstruct is the pure-Go kernel")
		}
		n, m, r := 1+int(rows%16), 1+int(cols%1100), 1
		if rank4 {
			r = 4
		}
		rng := rand.New(rand.NewPCG(seed, 7))
		special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, math.SmallestNonzeroFloat32}
		val := func() float32 {
			if rng.IntN(16) == 0 {
				return special[rng.IntN(len(special))]
			}
			return float32(math.Ldexp(rng.NormFloat64(), rng.IntN(80)-40))
		}
		fill := func(k int) []float32 {
			x := make([]float32, k)
			for i := range x {
				x[i] = val()
			}
			return x
		}
		p, q := fill(n*r), fill(m*r)
		got := fill(n * m)
		want := append([]float32(nil), got...)
		var gotE, wantE []float32
		if withErr {
			gotE, wantE = fill(n*m), make([]float32, n*m)
		}
		Reconstruct(got, gotE, p, q, n, m, r)
		reconstructGo(want, wantE, p, q, n, m, r, 0)
		for i := range want {
			if !sameOrNaN(got[i], want[i]) {
				t.Fatalf("c[%d] = %g (%#x), pure Go %g (%#x)", i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
		for i := range wantE {
			if !sameOrNaN(gotE[i], wantE[i]) {
				t.Fatalf("e[%d] = %g (%#x), pure Go %g (%#x)", i, gotE[i], math.Float32bits(gotE[i]), wantE[i], math.Float32bits(wantE[i]))
			}
		}
	})
}

// sameOrNaN reports whether x and y have the same bits or are both NaNs.
func sameOrNaN(x, y float32) bool {
	return math.Float32bits(x) == math.Float32bits(y) || x != x && y != y
}
