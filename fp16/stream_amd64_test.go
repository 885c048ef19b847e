//go:build !purego

package fp16

import (
	"fmt"
	"math"
	"testing"
	"unsafe"
)

// BenchmarkStreaming compares plain and non-temporal stores across sizes,
// the evidence for streamBytes. Sizes are of the float32 side.
func BenchmarkStreaming(b *testing.B) {
	d := benchBuffers()
	saved := streamBytes
	defer func() { streamBytes = saved }()
	for _, size := range []int{256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20} {
		n := size / 4
		for _, stream := range []bool{false, true} {
			for _, c := range []struct {
				name string
				f    func()
			}{
				{"Float32ToHalf", func() { Float32ToHalf(d.h2[:n], d.f32[:n]) }},
				{"HalfToFloat32", func() { HalfToFloat32(d.f32b[:n], d.h0[:n]) }},
				{"Float32ToBFloat16", func() { Float32ToBFloat16(d.h2[:n], d.f32[:n]) }},
				{"ScaleToBFloat16", func() { ScaleToBFloat16(d.h2[:n], d.f32[:n], 0.5) }},
			} {
				b.Run(fmt.Sprintf("%s/%dKiB/stream=%v", c.name, size>>10, stream), func(b *testing.B) {
					streamBytes = 1 << 62
					if stream {
						streamBytes = 0
					}
					c.f()
					for b.Loop() {
						c.f()
					}
					b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// TestStreamingMisaligned converts into a float32 destination that is not
// 4-byte aligned (only unsafe can make one): the kernels must not use
// aligned streaming stores there, and must still be right.
func TestStreamingMisaligned(t *testing.T) {
	n := streamBytes/4 + 99
	src := make([]uint16, n)
	for i := range src {
		src[i] = uint16(i * 7919)
	}
	raw := make([]float32, n+1)
	dst := unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(&raw[0]), 2)), n)
	forEachImpl(t, func(t *testing.T) {
		HalfToFloat32(dst, src)
		for i, h := range src {
			if math.Float32bits(dst[i]) != math.Float32bits(ToFloat32(h)) {
				t.Fatalf("[%d] = %#08x, want %#08x", i, math.Float32bits(dst[i]), math.Float32bits(ToFloat32(h)))
			}
		}
	})
}
