//go:build !purego

package fp16

import (
	"strings"
	"unsafe"
)

// Assembly kernels (fp16_amd64.s for AVX2+F16C, avx512_amd64.s for
// AVX-512). Each converts n elements, n a positive multiple of its block
// (8 for AVX2, 16 for AVX-512); the Go wrappers below finish the rest with
// the portable code. With stream set, dst must be 64-byte aligned and the
// stores bypass the cache. The sums cover elements lo..hi-1, hi-lo a
// positive multiple of the block, reading srcs[0..nsrc-1] and always
// multiplying by scale (1 when not scaled: x*1 is x for every sum they can
// produce).

//go:noescape
func f32ToHalfAVX2(dst *uint16, src *float32, n int, stream bool)

//go:noescape
func halfToF32AVX2(dst *float32, src *uint16, n int, stream bool)

//go:noescape
func f32ToBF16AVX2(dst *uint16, src *float32, n int, stream bool)

//go:noescape
func bf16ToF32AVX2(dst *float32, src *uint16, n int, stream bool)

//go:noescape
func scaleToHalfAVX2(dst *uint16, src *float32, n int, scale float32, stream bool)

//go:noescape
func scaleToBF16AVX2(dst *uint16, src *float32, n int, scale float32, stream bool)

//go:noescape
func sumHalfAVX2(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)

//go:noescape
func sumBF16AVX2(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)

//go:noescape
func f32ToHalfAVX512(dst *uint16, src *float32, n int, stream bool)

//go:noescape
func halfToF32AVX512(dst *float32, src *uint16, n int, stream bool)

//go:noescape
func f32ToBF16AVX512(dst *uint16, src *float32, n int, stream bool)

//go:noescape
func bf16ToF32AVX512(dst *float32, src *uint16, n int, stream bool)

//go:noescape
func scaleToHalfAVX512(dst *uint16, src *float32, n int, scale float32, stream bool)

//go:noescape
func scaleToBF16AVX512(dst *uint16, src *float32, n int, scale float32, stream bool)

//go:noescape
func sumHalfAVX512(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)

//go:noescape
func sumBF16AVX512(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)

func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)

func xgetbv0() (eax, edx uint32)

// streamBytes is the destination size from which conversions store with
// non-temporal hints. Below it the result may well be read again soon
// from the cache (a bucket handed to the collective); above it the cache
// cannot hold it anyway, and skipping the read-for-ownership of each
// destination line saves memory bandwidth (a third for HalfToFloat32).
// It is a variable only so that a benchmark can move it.
var streamBytes = 2 << 20

// maxRun bounds the elements one assembly call handles (a multiple of
// every block size and of 64 bytes of any element size). Assembly cannot
// be preempted, so a gigabyte-sized conversion is cut into runs of well
// under a millisecond, and the garbage collector and scheduler never wait
// on it for long.
const maxRun = 1 << 20

// plan splits a conversion of n elements whose destination, of elemSize
// bytes per element, starts at p: the first head elements go to the
// portable code so that the SIMD part's destination is 64-byte aligned
// when it streams, the next body elements (a multiple of block, a power of
// two) go to SIMD, and the rest to the portable code again.
func plan(p unsafe.Pointer, n, elemSize, block int) (head, body int, stream bool) {
	if n*elemSize >= streamBytes {
		mis := int(uintptr(p) & 63)
		if mis != 0 {
			head = min((64-mis)/elemSize, n)
		}
		// A destination not aligned to its own element size (possible
		// only through unsafe) cannot be brought to a 64-byte boundary.
		stream = (mis+head*elemSize)&63 == 0
	}
	return head, (n - head) &^ (block - 1), stream
}

// convert runs a SIMD conversion kernel over src into dst as plan says.
func convert[D, S any](dst []D, src []S, elemSize, block int,
	simd func(*D, *S, int, bool), generic func([]D, []S)) {
	if len(src) == 0 {
		return
	}
	head, body, stream := plan(unsafe.Pointer(&dst[0]), len(src), elemSize, block)
	generic(dst[:head], src[:head])
	for i := head; i < head+body; i += maxRun {
		simd(&dst[i], &src[i], min(maxRun, head+body-i), stream)
	}
	generic(dst[head+body:], src[head+body:])
}

// scaleConvert is convert for the kernels that also scale.
func scaleConvert(dst []uint16, src []float32, scale float32, block int,
	simd func(*uint16, *float32, int, float32, bool), generic func([]uint16, []float32, float32)) {
	if len(src) == 0 {
		return
	}
	head, body, stream := plan(unsafe.Pointer(&dst[0]), len(src), 2, block)
	generic(dst[:head], src[:head], scale)
	for i := head; i < head+body; i += maxRun {
		simd(&dst[i], &src[i], min(maxRun, head+body-i), scale, stream)
	}
	generic(dst[head+body:], src[head+body:], scale)
}

// sum runs a SIMD sum kernel over dst as far as whole blocks go, then
// the portable kernel over the rest.
func sum(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool, block int,
	simd func(*uint16, *[]uint16, int, int, int, float32), generic func([]uint16, [][]uint16, int, float32, bool)) {
	hi := from + (len(dst)-from)&^(block-1)
	s := scale
	if !scaled {
		s = 1
	}
	for lo := from; lo < hi; lo += maxRun {
		simd(&dst[0], &srcs[0], len(srcs), lo, min(lo+maxRun, hi), s)
	}
	generic(dst, srcs, hi, scale, scaled)
}

var avx2Kernels = kernels{
	name: "avx2+f16c",
	f32ToHalf: func(dst []uint16, src []float32) {
		convert(dst, src, 2, 8, f32ToHalfAVX2, f32ToHalfGeneric)
	},
	halfToF32: func(dst []float32, src []uint16) {
		convert(dst, src, 4, 8, halfToF32AVX2, halfToF32Generic)
	},
	f32ToBF16: func(dst []uint16, src []float32) {
		convert(dst, src, 2, 8, f32ToBF16AVX2, f32ToBF16Generic)
	},
	bf16ToF32: func(dst []float32, src []uint16) {
		convert(dst, src, 4, 8, bf16ToF32AVX2, bf16ToF32Generic)
	},
	scaleToHalf: func(dst []uint16, src []float32, scale float32) {
		scaleConvert(dst, src, scale, 8, scaleToHalfAVX2, scaleToHalfGeneric)
	},
	scaleToBF16: func(dst []uint16, src []float32, scale float32) {
		scaleConvert(dst, src, scale, 8, scaleToBF16AVX2, scaleToBF16Generic)
	},
	sumHalf: func(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool) {
		sum(dst, srcs, from, scale, scaled, 8, sumHalfAVX2, sumHalfGeneric)
	},
	sumBF16: func(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool) {
		sum(dst, srcs, from, scale, scaled, 8, sumBF16AVX2, sumBF16Generic)
	},
}

var avx512Kernels = kernels{
	name: "avx512",
	f32ToHalf: func(dst []uint16, src []float32) {
		convert(dst, src, 2, 16, f32ToHalfAVX512, f32ToHalfGeneric)
	},
	halfToF32: func(dst []float32, src []uint16) {
		convert(dst, src, 4, 16, halfToF32AVX512, halfToF32Generic)
	},
	f32ToBF16: func(dst []uint16, src []float32) {
		convert(dst, src, 2, 16, f32ToBF16AVX512, f32ToBF16Generic)
	},
	bf16ToF32: func(dst []float32, src []uint16) {
		convert(dst, src, 4, 16, bf16ToF32AVX512, bf16ToF32Generic)
	},
	scaleToHalf: func(dst []uint16, src []float32, scale float32) {
		scaleConvert(dst, src, scale, 16, scaleToHalfAVX512, scaleToHalfGeneric)
	},
	scaleToBF16: func(dst []uint16, src []float32, scale float32) {
		scaleConvert(dst, src, scale, 16, scaleToBF16AVX512, scaleToBF16Generic)
	},
	sumHalf: func(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool) {
		sum(dst, srcs, from, scale, scaled, 16, sumHalfAVX512, sumHalfGeneric)
	},
	sumBF16: func(dst []uint16, srcs [][]uint16, from int, scale float32, scaled bool) {
		sum(dst, srcs, from, scale, scaled, 16, sumBF16AVX512, sumBF16Generic)
	},
}

// features is what CPUID and XGETBV report, restricted to what the
// operating system lets a program use.
type features struct {
	avx, avx2, f16c, fma        bool
	avx512f, avx512bw, avx512vl bool
	avx512dq                    bool
	avx512fp16, avx512bf16      bool
}

func detect() features {
	var f features
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 1 {
		return f
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const osxsave, avx, f16c, fma = 1 << 27, 1 << 28, 1 << 29, 1 << 12
	if ecx1&osxsave == 0 {
		return f // no XGETBV: the OS does not save YMM state
	}
	xcr0, _ := xgetbv0()
	osAVX := xcr0&0x6 == 0x6      // XMM and YMM state
	osAVX512 := xcr0&0xe6 == 0xe6 // and opmask, ZMM_Hi256, Hi16_ZMM
	if !osAVX {
		return f
	}
	f.avx = ecx1&avx != 0
	f.f16c = f.avx && ecx1&f16c != 0
	f.fma = f.avx && ecx1&fma != 0
	if maxLeaf < 7 {
		return f
	}
	_, ebx7, _, edx7 := cpuid(7, 0)
	f.avx2 = f.avx && ebx7&(1<<5) != 0
	if osAVX512 {
		f.avx512f = ebx7&(1<<16) != 0
		f.avx512bw = f.avx512f && ebx7&(1<<30) != 0
		f.avx512vl = f.avx512f && ebx7&(1<<31) != 0
		f.avx512dq = f.avx512f && ebx7&(1<<17) != 0
		f.avx512fp16 = f.avx512f && edx7&(1<<23) != 0
		eax71, _, _, _ := cpuid(7, 1)
		f.avx512bf16 = f.avx512f && eax71&(1<<5) != 0
	}
	return f
}

func (f features) String() string {
	var b strings.Builder
	for _, x := range []struct {
		ok   bool
		name string
	}{
		{f.avx, "avx"}, {f.avx2, "avx2"}, {f.f16c, "f16c"}, {f.fma, "fma"},
		{f.avx512f, "avx512f"}, {f.avx512bw, "avx512bw"}, {f.avx512dq, "avx512dq"}, {f.avx512vl, "avx512vl"},
		{f.avx512fp16, "avx512fp16"}, {f.avx512bf16, "avx512bf16"},
	} {
		if x.ok {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(x.name)
		}
	}
	return b.String()
}

var (
	cpu         = detect()
	cpuFeatures = cpu.String()
	bestKernels = *availableKernels()[0]
)

// availableKernels lists the implementations this machine can run, best
// first; the portable one is always last.
func availableKernels() []*kernels {
	var ks []*kernels
	if cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl && cpu.avx2 && cpu.f16c {
		ks = append(ks, &avx512Kernels)
	}
	if cpu.avx2 && cpu.f16c {
		ks = append(ks, &avx2Kernels)
	}
	return append(ks, &genericKernels)
}
