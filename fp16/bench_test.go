package fp16

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

// The benchmarks convert 64 MiB of float32 (16 Mi elements), far more than
// the caches hold, so they measure what a gradient bucket costs. Each
// reports GB/s of the float32 side (4 bytes per element, 1 GB = 1e9 bytes)
// and moved-GB/s, the bytes read plus written. BenchmarkCopy is the
// baseline: Go's copy over the same 64 MiB of float32.

const benchElems = 64 << 20 / 4

type benchBufs struct {
	once       sync.Once
	f32, f32b  []float32
	h0, h1, h2 []uint16 // half precision
	b0, b1     []uint16 // bfloat16
}

var benchData benchBufs

// benchBuffers returns the benchmark vectors, made (and faulted in) once.
func benchBuffers() *benchBufs {
	d := &benchData
	d.once.Do(func() {
		rng := rand.New(rand.NewPCG(7, 8))
		d.f32 = make([]float32, benchElems)
		d.f32b = make([]float32, benchElems)
		d.h0 = make([]uint16, benchElems)
		d.h1 = make([]uint16, benchElems)
		d.h2 = make([]uint16, benchElems)
		for i := range d.f32 {
			d.f32[i] = float32(rng.NormFloat64())
		}
		Float32ToHalf(d.h0, d.f32)
		copy(d.h1, d.h0)
		copy(d.h2, d.h0)
		copy(d.f32b, d.f32)
		d.b0 = make([]uint16, benchElems)
		d.b1 = make([]uint16, benchElems)
		Float32ToBFloat16(d.b0, d.f32)
		copy(d.b1, d.b0)
		runtime.GC()
		// A few passes over every buffer before any timing: the first
		// benchmark of a process otherwise runs measurably slower.
		for range 8 {
			copy(d.f32b, d.f32)
			copy(d.h2, d.h0)
			copy(d.h1, d.h0)
			copy(d.b1, d.b0)
		}
	})
	return d
}

// run times f over the 64 MiB and reports the metrics; moved is the bytes
// moved per float32 element.
func run(b *testing.B, moved float64, f func()) {
	b.Helper()
	f() // warm: page faults and caches out of the loop
	for b.Loop() {
		f()
	}
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(benchElems)*4*float64(b.N)/s/1e9, "GB/s")
	b.ReportMetric(float64(benchElems)*moved*float64(b.N)/s/1e9, "moved-GB/s")
}

// benchImpls runs f as a sub-benchmark for every implementation.
func benchImpls(b *testing.B, f func(b *testing.B)) {
	for _, k := range availableKernels() {
		b.Run(k.name, func(b *testing.B) {
			saved := active
			active = k
			defer func() { active = saved }()
			f(b)
		})
	}
}

func BenchmarkCopy(b *testing.B) {
	d := benchBuffers()
	run(b, 8, func() { copy(d.f32b, d.f32) })
}

func BenchmarkFloat32ToHalf(b *testing.B) {
	d := benchBuffers()
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { Float32ToHalf(d.h2, d.f32) }) })
}

func BenchmarkHalfToFloat32(b *testing.B) {
	d := benchBuffers()
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { HalfToFloat32(d.f32b, d.h0) }) })
}

func BenchmarkFloat32ToBFloat16(b *testing.B) {
	d := benchBuffers()
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { Float32ToBFloat16(d.h2, d.f32) }) })
}

func BenchmarkBFloat16ToFloat32(b *testing.B) {
	d := benchBuffers()
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { BFloat16ToFloat32(d.f32b, d.b0) }) })
}

func BenchmarkScaleToHalf(b *testing.B) {
	d := benchBuffers()
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { ScaleToHalf(d.h2, d.f32, 0.5) }) })
}

func BenchmarkScaleToBFloat16(b *testing.B) {
	d := benchBuffers()
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { ScaleToBFloat16(d.h2, d.f32, 0.5) }) })
}

// BenchmarkSumHalf sums two half vectors into a third: GB/s counts 4 bytes
// per element, as for the conversions; moved-GB/s counts 6.
func BenchmarkSumHalf(b *testing.B) {
	d := benchBuffers()
	srcs := [][]uint16{d.h0, d.h1}
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { SumHalf(d.h2, srcs) }) })
}

func BenchmarkSumBFloat16(b *testing.B) {
	d := benchBuffers()
	srcs := [][]uint16{d.b0, d.b1}
	benchImpls(b, func(b *testing.B) { run(b, 6, func() { SumBFloat16(d.h2, srcs) }) })
}

// BenchmarkInCache runs the kernels over 32 Ki elements (128 KiB of
// float32), which stay in the L2 cache: it measures the arithmetic rather
// than the memory.
func BenchmarkInCache(b *testing.B) {
	const n = 32 << 10
	d := benchBuffers()
	f, f2, h, h2 := d.f32[:n], d.f32b[:n], d.h0[:n], d.h2[:n]
	bf, srcs, bsrcs := d.b0[:n], [][]uint16{d.h0[:n], d.h1[:n]}, [][]uint16{d.b0[:n], d.b1[:n]}
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"Float32ToHalf", func() { Float32ToHalf(h2, f) }},
		{"HalfToFloat32", func() { HalfToFloat32(f2, h) }},
		{"Float32ToBFloat16", func() { Float32ToBFloat16(h2, f) }},
		{"BFloat16ToFloat32", func() { BFloat16ToFloat32(f2, bf) }},
		{"ScaleToHalf", func() { ScaleToHalf(h2, f, 0.5) }},
		{"ScaleToBFloat16", func() { ScaleToBFloat16(h2, f, 0.5) }},
		{"SumHalf", func() { SumHalf(h2, srcs) }},
		{"SumBFloat16", func() { SumBFloat16(h2, bsrcs) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			benchImpls(b, func(b *testing.B) {
				c.f()
				for b.Loop() {
					c.f()
				}
				b.ReportMetric(float64(n)*4*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		})
	}
}
