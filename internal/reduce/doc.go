// Package reduce holds the element-wise reduction kernels of the in-process
// backend: dst[i] = a[i] op b[i] for every element type a collective
// carries, with SIMD versions of the hot float32 kernels on amd64, and the
// floating-point averages (AvgFloat32, AvgFloat64, AvgBFloat16), which stay
// finite wherever the exact average is: see avg.go for how they round.
//
// SumFloat32Twice and AvgFloat32Twice write both outputs of a two-rank
// all-reduce in one pass. Their NT variants compute the same bits but write
// with non-temporal (streaming) stores, which go to memory past the caches.
// With ordinary stores each output line is first read for ownership (six
// streams of memory traffic where four are needed), and the outputs evict
// the inputs; streamed, the outputs are not in any cache afterwards. So the
// NT kernels pay out of place when the four buffers together are larger than
// the last-level cache, and lose when they fit in a core's own cache:
// ordinary stores then hit lines the cache already holds, and the next
// reader finds the result there. In between the two are close. The NT
// kernels stream where the CPU has AVX2 and dst0 and dst1 sit at the same
// offset from a 32-byte boundary (the elements before the first boundary are
// stored ordinarily), and are the ordinary kernels elsewhere; they fence
// their stores, so a store the caller makes after them (one that publishes
// the result to another core) is not seen before them.
//
// Every kernel allows dst to alias a or b element for element (the same
// start address), which is what in-place collectives need. Kernels never
// allocate. The purego build tag forces the portable Go versions; the tests
// check that both agree bit for bit.
package reduce
