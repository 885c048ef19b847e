//go:build !purego

package fp16

import (
	"fmt"
	"testing"
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
