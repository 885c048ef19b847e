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
					got, want := make([]float32, n*m), make([]float32, n*m)
					var gotE, wantE []float32
					if withErr {
						gotE = randMat(rng, n*m)
						wantE = append([]float32(nil), gotE...)
					}
					Reconstruct(got, gotE, p, q, n, m, r)
					reconstructGo(want, wantE, p, q, n, m, r)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("c[%d] = %g, pure Go %g", i, got[i], want[i])
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
