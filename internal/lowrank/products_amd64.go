//go:build !purego

package lowrank

import "unsafe"

// mulQ8AVX2 sets rows 0..7 of p (n×4) to rows 0..7 of c (n×m) times q
// (m×4), each sum in column order from 0, as dot4x2 does. m > 0.
//
//go:noescape
func mulQ8AVX2(p, c, q unsafe.Pointer, m int)

// axpy4x4AVX2 is axpy4x4 for r = 4, k = 0, the first m columns of the
// four rows of c that start at c, stride elements apart, and p the four
// rows of p one after the other. m is a multiple of 8.
//
//go:noescape
func axpy4x4AVX2(q, c, p unsafe.Pointer, m, stride int)

// mulQ4 sets the first rows of p (n×4) to c times q, eight rows at a
// time, and returns how many it set.
func mulQ4(p, c, q []float32, n, m int) int {
	if !useAVX2 || m == 0 {
		return 0
	}
	i := 0
	for ; i+8 <= n; i += 8 {
		mulQ8AVX2(unsafe.Pointer(&p[4*i]), unsafe.Pointer(&c[i*m]), unsafe.Pointer(&q[0]), m)
	}
	return i
}

// axpy4 adds rows i..i+3 of c times rows i..i+3 of p into q, all columns
// but the last m%8 at rank 4, and returns how many columns it did.
func axpy4(q, c, p []float32, i, m int) int {
	m8 := m &^ 7
	if !useAVX2 || m8 == 0 {
		return 0
	}
	_ = c[(i+4)*m-1]
	_ = p[4*i+15]
	axpy4x4AVX2(unsafe.Pointer(&q[0]), unsafe.Pointer(&c[i*m]), unsafe.Pointer(&p[4*i]), m8, m)
	return m8
}
