// Package reduce holds the element-wise reduction kernels of the in-process
// backend: dst[i] = a[i] op b[i] for every element type a collective
// carries, with SIMD versions of the hot float32 kernels on amd64, and the
// floating-point averages (AvgFloat32, AvgFloat64, AvgBFloat16), which stay
// finite wherever the exact average is: see avg.go for how they round.
//
// Every kernel allows dst to alias a or b element for element (the same
// start address), which is what in-place collectives need. Kernels never
// allocate. The purego build tag forces the portable Go versions; the tests
// check that both agree bit for bit.
package reduce
