package lowrank

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func randMat(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// within checks got against the float64 product want, each element within
// k·u·(sum of the magnitudes of its terms), k the number of terms: the
// classic bound of a float32 dot product.
func within(t *testing.T, what string, got []float32, want, mag []float64, k int) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > float64(k+1)*0x1p-24*mag[i]+1e-30 {
			t.Fatalf("%s: element %d is %g, want %g (bound %g)", what, i, got[i], want[i], float64(k+1)*0x1p-24*mag[i])
		}
	}
}

var shapes = [][3]int{{1, 1, 1}, {3, 5, 1}, {7, 9, 2}, {16, 33, 3}, {8, 64, 4}, {33, 17, 4}, {5, 30, 5}, {12, 40, 8}, {9, 11, 9}}

func TestProducts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, s := range shapes {
		n, m, r := s[0], s[1], s[2]
		t.Run(fmt.Sprintf("%dx%d_r%d", n, m, r), func(t *testing.T) {
			c, q, p := randMat(rng, n*m), randMat(rng, m*r), randMat(rng, n*r)
			got := make([]float32, n*r)
			MulQ(got, c, q, n, m, r)
			want, mag := make([]float64, n*r), make([]float64, n*r)
			for i := range n {
				for k := range r {
					for j := range m {
						x := float64(c[i*m+j]) * float64(q[j*r+k])
						want[i*r+k] += x
						mag[i*r+k] += math.Abs(x)
					}
				}
			}
			within(t, "MulQ", got, want, mag, m)

			gotQ := make([]float32, m*r)
			MulTP(gotQ, c, p, n, m, r)
			want, mag = make([]float64, m*r), make([]float64, m*r)
			for j := range m {
				for k := range r {
					for i := range n {
						x := float64(c[i*m+j]) * float64(p[i*r+k])
						want[j*r+k] += x
						mag[j*r+k] += math.Abs(x)
					}
				}
			}
			within(t, "MulTP", gotQ, want, mag, n)

			// The error is what the product replaced minus the product,
			// whatever e held before.
			gotC := randMat(rng, n*m)
			c0 := append([]float32(nil), gotC...)
			e := make([]float32, n*m)
			for i := range e {
				e[i] = float32(math.NaN())
			}
			Reconstruct(gotC, e, p, q, n, m, r)
			want, mag = make([]float64, n*m), make([]float64, n*m)
			for i := range n {
				for j := range m {
					for k := range r {
						x := float64(p[i*r+k]) * float64(q[j*r+k])
						want[i*m+j] += x
						mag[i*m+j] += math.Abs(x)
					}
				}
			}
			within(t, "Reconstruct", gotC, want, mag, r)
			for i := range e {
				if math.Float32bits(e[i]) != math.Float32bits(c0[i]-gotC[i]) {
					t.Fatalf("Reconstruct: error element %d is %g, want %g - %g", i, e[i], c0[i], gotC[i])
				}
			}
		})
	}
}

// TestReconstructOverlap checks that Reconstruct refuses an error matrix
// that shares elements with the product, whose old values it must read
// before it writes them.
func TestReconstructOverlap(t *testing.T) {
	const n, m, r = 2, 16, 1
	buf := make([]float32, 3*n*m)
	p, q := make([]float32, n*r), make([]float32, m*r)
	for _, tc := range []struct {
		name   string
		c, e   []float32
		panics bool
	}{
		{"same", buf[:n*m], buf[:n*m], true},
		{"e inside", buf[1 : 1+n*m], buf[n*m-1 : 2*n*m-1], true},
		{"c inside", buf[n*m-1 : 2*n*m-1], buf[1 : 1+n*m], true},
		{"adjacent", buf[:n*m], buf[n*m : 2*n*m], false},
		{"apart", buf[:n*m], buf[2*n*m:], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if got := recover() != nil; got != tc.panics {
					t.Errorf("panicked: %v, want %v", got, tc.panics)
				}
			}()
			Reconstruct(tc.c, tc.e, p, q, n, m, r)
		})
	}
}

// TestFastPathsMatch checks that the paths for ranks 1 and 4 compute what
// the general ones do, bit for bit: each column's sum is the same sequence
// of roundings whatever the rank.
func TestFastPathsMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	const n, m = 13, 37
	c := randMat(rng, n*m)
	q4, p4 := randMat(rng, m*4), randMat(rng, n*4)
	// The same columns with a fifth, zero, column: the general paths.
	q5, p5 := make([]float32, m*5), make([]float32, n*5)
	for j := range m {
		copy(q5[j*5:j*5+4], q4[j*4:j*4+4])
	}
	for i := range n {
		copy(p5[i*5:i*5+4], p4[i*4:i*4+4])
	}
	a, b := make([]float32, n*4), make([]float32, n*5)
	MulQ(a, c, q4, n, m, 4)
	MulQ(b, c, q5, n, m, 5)
	for i := range n {
		for k := range 4 {
			if a[i*4+k] != b[i*5+k] {
				t.Fatalf("MulQ rank 4 [%d,%d] = %g, general %g", i, k, a[i*4+k], b[i*5+k])
			}
		}
	}
	x, y := make([]float32, n*m), make([]float32, n*m)
	Reconstruct(x, nil, p4, q4, n, m, 4)
	Reconstruct(y, nil, p5, q5, n, m, 5)
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("Reconstruct rank 4 [%d] = %g, general %g", i, x[i], y[i])
		}
	}
	// Rank 1's contiguous dot product against a strided column.
	q1 := randMat(rng, m)
	q3 := make([]float32, m*3)
	for j := range m {
		q3[j*3+2] = q1[j]
	}
	a, b = make([]float32, n), make([]float32, n*3)
	MulQ(a, c, q1, n, m, 1)
	MulQ(b, c, q3, n, m, 3)
	for i := range n {
		if a[i] != b[i*3+2] {
			t.Fatalf("MulQ rank 1 [%d] = %g, strided %g", i, a[i], b[i*3+2])
		}
	}
}

func TestOrthogonalize(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, s := range [][2]int{{1, 1}, {10, 1}, {10, 4}, {100, 8}, {7, 7}} {
		rows, r := s[0], s[1]
		a := randMat(rng, rows*r)
		Orthogonalize(a, rows, r, 0)
		for k := range r {
			for l := range r {
				var dot float64
				for i := range rows {
					dot += float64(a[i*r+k]) * float64(a[i*r+l])
				}
				want := 0.0
				if k == l {
					want = 1
				}
				if math.Abs(dot-want) > 1e-5 {
					t.Fatalf("%dx%d: column %d · column %d = %g, want %g", rows, r, k, l, dot, want)
				}
			}
		}
	}
	// Columns that are (nearly) multiples of the first, as the Ps of a
	// gradient of rank one are: one Gram-Schmidt pass leaves noise that
	// leans on the first column; the result must still be orthonormal
	// wherever a column is not zero.
	const rows = 64
	a := make([]float32, rows*4)
	for i := range rows {
		v := float32(1 + i%3)
		a[i*4], a[i*4+1], a[i*4+2], a[i*4+3] = v, 3*v, -v*0.7, v*1.0000001
	}
	Orthogonalize(a, rows, 4, 0)
	for k := range 4 {
		for l := range k + 1 {
			var dot, nk float64
			for i := range rows {
				dot += float64(a[i*4+k]) * float64(a[i*4+l])
				nk += float64(a[i*4+k]) * float64(a[i*4+k])
			}
			if k != l && nk != 0 && math.Abs(dot) > 1e-5 {
				t.Fatalf("nearly dependent columns: column %d · column %d = %g", k, l, dot)
			}
		}
	}

	// A zero column stays zero with epsilon 0; epsilon shrinks the norm.
	a = []float32{0, 3, 0, 4}
	Orthogonalize(a, 2, 2, 0)
	if a[0] != 0 || a[2] != 0 || a[1] != 0.6 || a[3] != 0.8 {
		t.Errorf("zero column: %v", a)
	}
	b := []float32{3, 4}
	Orthogonalize(b, 2, 1, 5)
	if b[0] != 0.3 || b[1] != 0.4 {
		t.Errorf("epsilon 5 on norm 5: %v, want [0.3 0.4]", b)
	}
}

func TestNoAlloc(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	const n, m, r = 32, 48, 4
	c, q, p, e := randMat(rng, n*m), randMat(rng, m*r), randMat(rng, n*r), randMat(rng, n*m)
	if a := testing.AllocsPerRun(5, func() {
		MulQ(p, c, q, n, m, r)
		Orthogonalize(p, n, r, 0)
		MulTP(q, c, p, n, m, r)
		Reconstruct(c, e, p, q, n, m, r)
	}); a != 0 {
		t.Errorf("%v allocations", a)
	}
}
