// Package lowrank holds the float32 matrix kernels of PowerSGD (package
// hooks): the products of a gradient matrix C (n×m) with thin factors P
// (n×r) and Q (m×r), and the orthogonalization of a factor's columns. Every
// matrix is a dense row-major []float32, as a gradient lies in its bucket
// and as PyTorch lays out P and Q.
//
// The kernels are deterministic: each result is computed by one fixed
// sequence of float32 operations, whatever the CPU, and every product is
// rounded before it is added (an explicit conversion keeps the compiler
// from fusing a multiply and an add on machines with FMA), so ranks that
// run the same kernels on the same inputs agree bit for bit. On amd64 with
// AVX2, Reconstruct (ranks 1 and 4), MulQ and MulTP (rank 4) run assembly
// kernels that perform the same multiplies and adds in the same order,
// without FMA, so they give the pure-Go kernels' bits (the build tag
// purego keeps to pure Go), NaNs aside: which of two NaN operands an
// operation passes on depends on the order of its operands in the
// machine's instruction, which the compiler chooses, so a NaN result may
// come out with another sign or payload. The kernels never allocate. Ranks of 1 and
// multiples of 4 are the fastest: the columns of a factor are taken four
// at a time, and the rest one at a time.
package lowrank

import (
	"math"
	"unsafe"
)

// MulQ sets p (n×r) to c (n×m) times q (m×r).
func MulQ(p, c, q []float32, n, m, r int) {
	check(len(p), n*r, len(c), n*m, len(q), m*r)
	i := 0
	if r == 4 {
		i = mulQ4(p, c, q, n, m)
		// Two rows at once: eight independent sums, so that the additions
		// do not wait on each other, each in the order of one row alone.
		for ; i+2 <= n; i += 2 {
			p0, p1 := p[i*4:i*4+4:i*4+4], p[i*4+4:i*4+8:i*4+8]
			p0[0], p0[1], p0[2], p0[3], p1[0], p1[1], p1[2], p1[3] = dot4x2(c[i*m:(i+1)*m:(i+1)*m], c[(i+1)*m:(i+2)*m:(i+2)*m], q)
		}
	}
	for ; i < n; i++ {
		row := c[i*m : (i+1)*m : (i+1)*m]
		out := p[i*r : (i+1)*r : (i+1)*r]
		k := 0
		for ; k+4 <= r; k += 4 {
			out[k], out[k+1], out[k+2], out[k+3] = dot4(row, q, r, k)
		}
		for ; k < r; k++ {
			out[k] = dot1(row, q, r, k)
		}
	}
}

// dot4x2 is dot4 of rows c0 and c1 with the four columns of q (stride 4).
func dot4x2(c0, c1, q []float32) (a0, a1, a2, a3, b0, b1, b2, b3 float32) {
	c1 = c1[:len(c0)]
	q = q[:4*len(c0)]
	for j, x := range c0 {
		y := c1[j]
		w := q[4*j : 4*j+4 : 4*j+4]
		w0, w1, w2, w3 := w[0], w[1], w[2], w[3]
		a0 += float32(x * w0)
		a1 += float32(x * w1)
		a2 += float32(x * w2)
		a3 += float32(x * w3)
		b0 += float32(y * w0)
		b1 += float32(y * w1)
		b2 += float32(y * w2)
		b3 += float32(y * w3)
	}
	return
}

// dot4 returns the dot products of row with columns k..k+3 of q (len(row)
// rows of stride r).
func dot4(row, q []float32, r, k int) (a0, a1, a2, a3 float32) {
	if r == 4 {
		q = q[:4*len(row)]
		for j, c := range row {
			x := q[4*j : 4*j+4 : 4*j+4]
			a0 += float32(c * x[0])
			a1 += float32(c * x[1])
			a2 += float32(c * x[2])
			a3 += float32(c * x[3])
		}
		return
	}
	for j, c := range row {
		x := q[j*r+k : j*r+k+4 : j*r+k+4]
		a0 += float32(c * x[0])
		a1 += float32(c * x[1])
		a2 += float32(c * x[2])
		a3 += float32(c * x[3])
	}
	return
}

// dot1 returns the dot product of row with column k of q, in four
// interleaved partial sums so that the additions do not wait on each
// other.
func dot1(row, q []float32, r, k int) float32 {
	var a0, a1, a2, a3 float32
	j := 0
	if r == 1 {
		q = q[:len(row)]
		for ; j+4 <= len(row); j += 4 {
			x, c := q[j:j+4:j+4], row[j:j+4:j+4]
			a0 += float32(c[0] * x[0])
			a1 += float32(c[1] * x[1])
			a2 += float32(c[2] * x[2])
			a3 += float32(c[3] * x[3])
		}
	} else {
		for ; j+4 <= len(row); j += 4 {
			o := j*r + k
			c := row[j : j+4 : j+4]
			_ = q[o+3*r]
			a0 += float32(c[0] * q[o])
			a1 += float32(c[1] * q[o+r])
			a2 += float32(c[2] * q[o+2*r])
			a3 += float32(c[3] * q[o+3*r])
		}
	}
	for ; j < len(row); j++ {
		a0 += float32(row[j] * q[j*r+k])
	}
	return (a0 + a1) + (a2 + a3)
}

// MulTP sets q (m×r) to the transpose of c (n×m) times p (n×r). It reads c
// row by row, adding each row's contribution into q in row order, four
// rows per pass over q.
func MulTP(q, c, p []float32, n, m, r int) {
	check(len(p), n*r, len(c), n*m, len(q), m*r)
	clear(q)
	i := 0
	for ; i+4 <= n; i += 4 {
		c0 := c[i*m : (i+1)*m : (i+1)*m]
		c1 := c[(i+1)*m : (i+2)*m : (i+2)*m]
		c2 := c[(i+2)*m : (i+3)*m : (i+3)*m]
		c3 := c[(i+3)*m : (i+4)*m : (i+4)*m]
		k := 0
		if r == 4 {
			if j := axpy4(q, c, p, i, m); j > 0 {
				axpy4x4(q[4*j:], 4, 0, c0[j:], c1[j:], c2[j:], c3[j:], p[i*4:i*4+4], p[i*4+4:i*4+8], p[i*4+8:i*4+12], p[i*4+12:i*4+16])
				k = 4
			}
		}
		for ; k+4 <= r; k += 4 {
			axpy4x4(q, r, k, c0, c1, c2, c3, p[i*r+k:i*r+k+4], p[(i+1)*r+k:(i+1)*r+k+4], p[(i+2)*r+k:(i+2)*r+k+4], p[(i+3)*r+k:(i+3)*r+k+4])
		}
		for ; k < r; k++ {
			axpy4x1(q, r, k, c0, c1, c2, c3, p[i*r+k], p[(i+1)*r+k], p[(i+2)*r+k], p[(i+3)*r+k])
		}
	}
	for ; i < n; i++ {
		row := c[i*m : (i+1)*m : (i+1)*m]
		for k := range r {
			s := p[i*r+k]
			for j, x := range row {
				q[j*r+k] += float32(x * s)
			}
		}
	}
}

// axpy4x4 adds rows c0..c3 times the 4-vectors p0..p3 into columns
// k..k+3 of q, row c0 first.
func axpy4x4(q []float32, r, k int, c0, c1, c2, c3, p0, p1, p2, p3 []float32) {
	p00, p01, p02, p03 := p0[0], p0[1], p0[2], p0[3]
	p10, p11, p12, p13 := p1[0], p1[1], p1[2], p1[3]
	p20, p21, p22, p23 := p2[0], p2[1], p2[2], p2[3]
	p30, p31, p32, p33 := p3[0], p3[1], p3[2], p3[3]
	c1, c2, c3 = c1[:len(c0)], c2[:len(c0)], c3[:len(c0)]
	for j, x0 := range c0 {
		x1, x2, x3 := c1[j], c2[j], c3[j]
		y := q[j*r+k : j*r+k+4 : j*r+k+4]
		y0 := y[0] + float32(x0*p00)
		y1 := y[1] + float32(x0*p01)
		y2 := y[2] + float32(x0*p02)
		y3 := y[3] + float32(x0*p03)
		y0 += float32(x1 * p10)
		y1 += float32(x1 * p11)
		y2 += float32(x1 * p12)
		y3 += float32(x1 * p13)
		y0 += float32(x2 * p20)
		y1 += float32(x2 * p21)
		y2 += float32(x2 * p22)
		y3 += float32(x2 * p23)
		y[0] = y0 + float32(x3*p30)
		y[1] = y1 + float32(x3*p31)
		y[2] = y2 + float32(x3*p32)
		y[3] = y3 + float32(x3*p33)
	}
}

// axpy4x1 adds rows c0..c3 times s0..s3 into column k of q, row c0 first.
func axpy4x1(q []float32, r, k int, c0, c1, c2, c3 []float32, s0, s1, s2, s3 float32) {
	c1, c2, c3 = c1[:len(c0)], c2[:len(c0)], c3[:len(c0)]
	for j, x0 := range c0 {
		o := j*r + k
		y := q[o] + float32(x0*s0)
		y += float32(c1[j] * s1)
		y += float32(c2[j] * s2)
		q[o] = y + float32(c3[j]*s3)
	}
}

// Reconstruct sets c (n×m) to p (n×r) times the transpose of q (m×r). If e
// is not nil, it also sets each element of e (n×m) to the element of c it
// replaces minus the one it writes: the error feedback of PowerSGD, what
// the approximation lost, computed in the same pass. e and c must not
// overlap.
func Reconstruct(c, e, p, q []float32, n, m, r int) {
	check(len(p), n*r, len(c), n*m, len(q), m*r)
	if e != nil {
		if len(e) != n*m {
			panic("lowrank: error matrix of the wrong size")
		}
		if overlap(c, e) {
			panic("lowrank: error matrix overlaps the product")
		}
	}
	reconstruct(c, e, p, q, n, m, r)
}

// overlap reports whether a and b share an element.
func overlap(a, b []float32) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+4*uintptr(len(b)) && pb < pa+4*uintptr(len(a))
}

// reconstructGo is the pure-Go Reconstruct of columns j0 and up, the
// reference of the assembly kernels and the finish of their rows.
func reconstructGo(c, e, p, q []float32, n, m, r, j0 int) {
	for i := range n {
		row := c[i*m+j0 : (i+1)*m : (i+1)*m]
		pi := p[i*r : (i+1)*r : (i+1)*r]
		if e == nil {
			switch r {
			case 1:
				s, q := pi[0], q[j0:m]
				for j := range row {
					row[j] = float32(s * q[j])
				}
			case 4:
				p0, p1, p2, p3 := pi[0], pi[1], pi[2], pi[3]
				q := q[4*j0 : 4*m]
				for j := range row {
					row[j] = inner4(p0, p1, p2, p3, q[4*j:4*j+4:4*j+4])
				}
			default:
				q := q[j0*r : m*r]
				for j := range row {
					row[j] = inner(pi, q[j*r:(j+1)*r:(j+1)*r])
				}
			}
			continue
		}
		erow := e[i*m+j0 : (i+1)*m : (i+1)*m]
		erow = erow[:len(row)]
		switch r {
		case 1:
			s, q := pi[0], q[j0:m]
			for j, x := range row {
				v := float32(s * q[j])
				erow[j], row[j] = x-v, v
			}
		case 4:
			p0, p1, p2, p3 := pi[0], pi[1], pi[2], pi[3]
			q := q[4*j0 : 4*m]
			for j, x := range row {
				v := inner4(p0, p1, p2, p3, q[4*j:4*j+4:4*j+4])
				erow[j], row[j] = x-v, v
			}
		default:
			q := q[j0*r : m*r]
			for j, x := range row {
				v := inner(pi, q[j*r:(j+1)*r:(j+1)*r])
				erow[j], row[j] = x-v, v
			}
		}
	}
}

// inner4 returns the dot product of (p0, p1, p2, p3) and the 4-vector x,
// summed from the first product.
func inner4(p0, p1, p2, p3 float32, x []float32) float32 {
	x = x[:4:4]
	v := float32(p0*x[0]) + float32(p1*x[1])
	v += float32(p2 * x[2])
	return v + float32(p3*x[3])
}

// inner returns the dot product of p and x (len(p) >= 1), summed from the
// first product.
func inner(p, x []float32) float32 {
	x = x[:len(p)]
	v := float32(p[0] * x[0])
	for k := 1; k < len(p); k++ {
		v += float32(p[k] * x[k])
	}
	return v
}

// Orthogonalize makes the r columns of a (rows×r, r <= rows) orthonormal
// by Gram-Schmidt, as PyTorch's PowerSGD does: each column in turn has its
// projections on the columns before it removed, then is divided by its
// norm plus eps. Norms and projections are accumulated in float64.
//
// Unlike a single Gram-Schmidt pass, it returns orthonormal columns (as
// Householder QR, PyTorch's choice above rank 2, does) even when a column
// is a combination of the ones before it, which is what the Ps of a
// gradient of lower rank than the approximation are: the projections are
// removed twice ("twice is enough"), and a column that this leaves at
// rounding noise (below 1e-5 of its norm) is replaced by the first unit
// vector e_k, e_k+1, ... that keeps a good part of itself once cleared of
// the earlier columns: an orthonormal completion, deterministic. Such a
// column carries nothing of the matrix (its product with it is noise), so
// the approximation P·Pᵀ·M is unchanged. A column that is all zeros stays
// zero.
func Orthogonalize(a []float32, rows, r int, eps float32) {
	if len(a) != rows*r || r > rows {
		panic("lowrank: factor of the wrong size")
	}
	norm := func(k int) float64 {
		var ss float64
		for i := range rows {
			v := float64(a[i*r+k])
			// Each product converted: the conversion rounds it, so no
			// compiler fuses it with the sum (FMA), and every build gets
			// the same bits (the Go spec's rule on fused operations).
			ss += float64(v * v)
		}
		return math.Sqrt(ss)
	}
	clean := func(k int) { // remove the projections on columns 0..k-1, twice
		for range 2 {
			for l := range k {
				var dot float64
				for i := range rows {
					dot += float64(float64(a[i*r+l]) * float64(a[i*r+k]))
				}
				for i := range rows {
					a[i*r+k] = float32(float64(a[i*r+k]) - float64(dot*float64(a[i*r+l])))
				}
			}
		}
	}
	for k := range r {
		before := norm(k)
		if before == 0 {
			continue
		}
		clean(k)
		d := norm(k)
		if d <= 1e-5*before {
			// Some unit vector keeps at least 1/sqrt(rows) of its norm.
			for j := range rows {
				for i := range rows {
					a[i*r+k] = 0
				}
				a[((k+j)%rows)*r+k] = 1
				clean(k)
				if d = norm(k); d >= 0.5/math.Sqrt(float64(rows)) {
					break
				}
			}
		} else {
			d += float64(eps)
		}
		inv := 1 / d
		for i := range rows {
			a[i*r+k] = float32(float64(a[i*r+k]) * inv)
		}
	}
}

func check(lp, np, lc, nc, lq, nq int) {
	if lp != np || lc != nc || lq != nq {
		panic("lowrank: matrices of the wrong sizes")
	}
}
