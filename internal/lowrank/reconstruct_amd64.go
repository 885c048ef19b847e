//go:build !purego

package lowrank

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

var useAVX2 = cpu.X86.HasAVX2

// span is the number of columns of c that the rank-4 kernel takes at a
// time: their four columns of q, laid out one after the other (8 KiB of
// stack at most), stay in the L1 cache while every row of c uses them, and
// one call of the assembly, which cannot be preempted, stays short.
// recon4AVX2 has it built in (qt's rows 2048 bytes apart).
const span = 512

// recon4AVX2 sets c[j] = ((p[0]*qt[j] + p[1]*qt[span+j]) + p[2]*qt[2*span+j])
// + p[3]*qt[3*span+j] for j < n, each product rounded, and if e is not nil
// sets e[j] to the old c[j] minus it. n is a multiple of 8, at most span.
//
//go:noescape
func recon4AVX2(c, e, qt unsafe.Pointer, n int, p *float32)

// recon1AVX2 sets c[j] = s*q[j] for j < n and if e is not nil sets e[j] to
// the old c[j] minus it. n is a multiple of 8.
//
//go:noescape
func recon1AVX2(c, e, q unsafe.Pointer, n int, s float32)

// elem returns the address of s[i], or nil if s is nil.
func elem(s []float32, i int) unsafe.Pointer {
	if s == nil {
		return nil
	}
	return unsafe.Pointer(&s[i])
}

func reconstruct(c, e, p, q []float32, n, m, r int) {
	if !useAVX2 || m < 8 || (r != 1 && r != 4) {
		reconstructGo(c, e, p, q, n, m, r, 0)
		return
	}
	m8 := m &^ 7
	if r == 1 {
		for i := range n {
			for j := 0; j < m8; j += span {
				recon1AVX2(elem(c, i*m+j), elem(e, i*m+j), elem(q, j), min(span, m8-j), p[i])
			}
		}
	} else {
		var qt [4 * span]float32
		for j0 := 0; j0 < m8; j0 += span {
			w := min(span, m8-j0)
			x := q[4*j0 : 4*(j0+w)]
			for j := range w {
				y := x[4*j : 4*j+4 : 4*j+4]
				qt[j], qt[span+j], qt[2*span+j], qt[3*span+j] = y[0], y[1], y[2], y[3]
			}
			for i := range n {
				recon4AVX2(elem(c, i*m+j0), elem(e, i*m+j0), unsafe.Pointer(&qt[0]), w, &p[4*i])
			}
		}
	}
	if m8 < m {
		reconstructGo(c, e, p, q, n, m, r, m8)
	}
}
