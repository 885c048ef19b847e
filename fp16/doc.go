// Package fp16 converts between float32 and the two 16-bit floating-point
// formats used to compress gradients, IEEE 754 binary16 ("half") and
// bfloat16, and sums vectors of them.
//
// Every function is bit-exact and deterministic for non-NaN results:
//
//   - float32 to binary16 rounds to nearest, ties to even; subnormal results
//     are produced, never flushed; magnitudes of 65520 and above become ±Inf.
//     A NaN keeps its sign and the top 10 bits of its payload and is made
//     quiet (0x7E00), exactly as x86 F16C's VCVTPS2PH does.
//   - binary16 to float32 is exact; a NaN's payload moves into the top of the
//     float32 payload and the quiet bit is set (as VCVTPH2PS does).
//   - float32 to bfloat16 rounds the upper 16 bits to nearest, ties to even;
//     subnormals are kept; a NaN keeps its sign and top payload bits and is
//     made quiet (0x0040). bfloat16 to float32 is exact (a shift).
//
// The scaled and summing kernels compute in float32 and round to 16 bits once
// per element: ScaleToHalf stores half(float32(src*scale)); SumHalf stores
// half(((s0 + s1) + s2) + ...), the sources added in order in float32;
// SumScaledHalf stores half(float32(scale*sum)). When such a result is a NaN
// its sign and payload are unspecified (IEEE 754 leaves them so, and
// processors differ).
//
// The bulk functions take a destination and a source of equal length and
// panic, naming both lengths, when they differ: a silent partial conversion
// of a gradient would be a wrong gradient. They never allocate and are safe
// for concurrent use on disjoint memory. On amd64 they run AVX2+F16C or
// AVX-512 code chosen once at start-up from CPUID (see Impl and
// CPUFeatures); elsewhere, or with the purego build tag, portable Go code
// that gives identical results. On amd64 a conversion whose destination is
// 2 MiB or larger writes it with non-temporal stores: it goes to memory
// without passing through (and evicting) the cache.
package fp16
