package comm

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ddpgo/ddpgo/fp16"
)

// Kernels are the element-wise operations that the reducer and the hooks
// apply to bucket memory. They are the only way ddp and hooks touch a
// Buffer's elements, so that the same code runs on host memory (HostKernels,
// with package fp16's SIMD conversions) and on device memory (a backend's
// device kernels), which Go cannot address.
//
// A kernel may return before its effect is complete only if every later
// kernel and every collective the rank issues is ordered after it (a
// device stream); Sync waits for everything issued so far. Host kernels
// are complete when they return. Buffers of mismatched counts or dtypes
// are a programming error and panic, naming both.
type Kernels interface {
	// Location is the memory these kernels operate on.
	Location() Location
	// Zero sets every element of b to zero.
	Zero(b Buffer)
	// Copy copies src into dst (same count and dtype; no overlap).
	Copy(dst, src Buffer)
	// Add adds src into dst, element by element (same count and a
	// floating-point dtype: Float32, Float64, Float16 or BFloat16). Half
	// precision adds in float32 and rounds once to the element type,
	// which is the correctly rounded half-precision sum.
	Add(dst, src Buffer)
	// Scale multiplies every element of b by s (Float32, Float64, Float16
	// or BFloat16). Float64 multiplies by float64(s), exactly that value;
	// half precision multiplies in float32, as Compress does, and rounds
	// the product to the element type.
	Scale(b Buffer, s float32)
	// Compress writes src (Float32) times scale into dst (Float16 or
	// BFloat16), rounding once to nearest even.
	Compress(dst, src Buffer, scale float32)
	// Decompress converts src (Float16 or BFloat16) into dst (Float32),
	// exactly.
	Decompress(dst, src Buffer)
	// Overflows counts the elements of wire (Float16 or BFloat16) that are
	// Inf or NaN where the same element of in (Float32) is finite. It
	// waits for the kernels issued before it.
	Overflows(wire, in Buffer) int64
	// Upload copies len(src) bytes of host memory into dst.
	Upload(dst Buffer, src []byte)
	// Download copies src into dst (len(dst) == src.Bytes()), waiting for
	// the kernels and collectives issued before it.
	Download(dst []byte, src Buffer)
	// Sync waits until every kernel issued so far has completed, and
	// returns the first error a kernel met (a device fault).
	Sync() error
}

// KernelSource is implemented by a backend that provides kernels for the
// memory it carries (a device backend's kernels on its stream).
type KernelSource interface {
	Kernels() Kernels
}

// The names of the Kernels operations that may be limited to some dtypes,
// as KernelSupporter.Supports and Supports take them.
const (
	OpAdd        = "Add"
	OpScale      = "Scale"
	OpCompress   = "Compress"   // dt: the half-precision dtype written
	OpDecompress = "Decompress" // dt: the half-precision dtype read
	OpOverflows  = "Overflows"  // dt: the half-precision dtype counted
)

// KernelSupporter is implemented by Kernels that do some operations for
// some dtypes only (a device's kernels, whose code exists for float32
// alone) and panic for the others, as a programming error. Supports
// reports whether op (OpAdd, ...) on buffers of dt is done. Callers that
// choose kernels from data (the Reducer, from its parameters' dtypes and
// its hook) ask before issuing anything, since a kernel's failure on a
// device would surface only at Sync, which nothing may call.
type KernelSupporter interface {
	Supports(op string, dt DType) bool
}

// Supports reports whether k does op on dt: what k's Supports says, and
// true for Kernels that do not implement KernelSupporter (HostKernels
// do every operation for every dtype the contract names).
func Supports(k Kernels, op string, dt DType) bool {
	if s, ok := k.(KernelSupporter); ok {
		return s.Supports(op, dt)
	}
	return true
}

// HostKernels returns the kernels for host memory.
func HostKernels() Kernels { return hostKernels{} }

type hostKernels struct{}

func (hostKernels) Location() Location { return Host }

// piece bounds the bytes one call of a runtime copy or clear handles: those
// cannot be preempted, so large buffers are cut into pieces of well under a
// millisecond, and the garbage collector never waits on them for long.
const piece = 1 << 20

func (hostKernels) Zero(b Buffer) {
	p := b.AsBytes()
	for len(p) > 0 {
		k := min(len(p), piece)
		clear(p[:k])
		p = p[k:]
	}
}

func (hostKernels) Copy(dst, src Buffer) {
	same("Copy", dst, src)
	d, s := dst.AsBytes(), src.AsBytes()
	for len(d) > 0 {
		k := min(len(d), piece)
		copy(d[:k], s[:k])
		d, s = d[k:], s[k:]
	}
}

func (hostKernels) Add(dst, src Buffer) {
	same("Add", dst, src)
	switch dst.DType {
	case Float32:
		addTo(dst.AsFloat32(), src.AsFloat32())
	case Float64:
		addTo(dst.AsFloat64(), src.AsFloat64())
	case Float16, BFloat16:
		addHalf(dst.DType, dst.AsUint16(), src.AsUint16())
	default:
		panic(fmt.Sprintf("comm: Add of %s buffers", dst.DType))
	}
}

func (hostKernels) Scale(b Buffer, s float32) {
	switch b.DType {
	case Float32:
		scale(b.AsFloat32(), s)
	case Float64:
		scale(b.AsFloat64(), float64(s))
	case Float16, BFloat16:
		scaleHalf(b.DType, b.AsUint16(), s)
	default:
		panic(fmt.Sprintf("comm: Scale of a %s buffer", b.DType))
	}
}

func addTo[T float32 | float64](d, s []T) {
	s = s[:len(d)]
	for i, v := range s {
		d[i] += v
	}
}

func scale[T float32 | float64](v []T, s T) {
	i := 0
	for ; i+8 <= len(v); i += 8 {
		w := v[i : i+8 : i+8]
		w[0] *= s
		w[1] *= s
		w[2] *= s
		w[3] *= s
		w[4] *= s
		w[5] *= s
		w[6] *= s
		w[7] *= s
	}
	for ; i < len(v); i++ {
		v[i] *= s
	}
}

// halfChunk is how many half-precision elements the half kernels widen to
// float32 at a time.
const halfChunk = 512

// widened holds the float32 chunks of the half kernels. They come from a
// pool rather than the stack because the SIMD conversions are called
// through function values, which makes the compiler move stack arrays to
// the heap on every call.
var widened = sync.Pool{New: func() any { return new([2][halfChunk]float32) }}

// addHalf adds s into d (both dt: Float16 or BFloat16) through float32:
// the float32 sum of two half-precision values rounds to the same value
// as their exact sum would, since float32 carries more than twice their
// precision plus two bits.
func addHalf(dt DType, d, s []uint16) {
	w := widened.Get().(*[2][halfChunk]float32)
	defer widened.Put(w)
	a, b := &w[0], &w[1]
	s = s[:len(d)]
	for len(d) > 0 {
		k := min(len(d), halfChunk)
		widen(dt, a[:k], d[:k])
		widen(dt, b[:k], s[:k])
		for i := range k {
			a[i] += b[i]
		}
		narrow(dt, d[:k], a[:k], 1)
		d, s = d[k:], s[k:]
	}
}

// scaleHalf multiplies v (dt: Float16 or BFloat16) by s in float32 and
// rounds each product to dt.
func scaleHalf(dt DType, v []uint16, s float32) {
	w := widened.Get().(*[2][halfChunk]float32)
	defer widened.Put(w)
	a := &w[0]
	for len(v) > 0 {
		k := min(len(v), halfChunk)
		widen(dt, a[:k], v[:k])
		narrow(dt, v[:k], a[:k], s)
		v = v[k:]
	}
}

func widen(dt DType, dst []float32, src []uint16) {
	if dt == Float16 {
		fp16.HalfToFloat32(dst, src)
	} else {
		fp16.BFloat16ToFloat32(dst, src)
	}
}

func narrow(dt DType, dst []uint16, src []float32, scale float32) {
	if dt == Float16 {
		fp16.ScaleToHalf(dst, src, scale)
	} else {
		fp16.ScaleToBFloat16(dst, src, scale)
	}
}

func (hostKernels) Compress(dst, src Buffer, scale float32) {
	halfPair("Compress", dst, src)
	if dst.DType == Float16 {
		fp16.ScaleToHalf(dst.AsUint16(), src.AsFloat32(), scale)
	} else {
		fp16.ScaleToBFloat16(dst.AsUint16(), src.AsFloat32(), scale)
	}
}

func (hostKernels) Decompress(dst, src Buffer) {
	halfPair("Decompress", src, dst)
	if src.DType == Float16 {
		fp16.HalfToFloat32(dst.AsFloat32(), src.AsUint16())
	} else {
		fp16.BFloat16ToFloat32(dst.AsFloat32(), src.AsUint16())
	}
}

func (hostKernels) Overflows(wire, in Buffer) int64 {
	halfPair("Overflows", wire, in)
	exp := uint16(0x7c00)
	if wire.DType == BFloat16 {
		exp = 0x7f80
	}
	s := wire.AsUint16()
	if !anyNonfinite(s, exp) {
		return 0
	}
	f := in.AsFloat32()
	var n int64
	for i, v := range s {
		if v&exp == exp && f[i]-f[i] == 0 { // f[i] finite: Inf-Inf and NaN-NaN are NaN
			n++
		}
	}
	return n
}

func (hostKernels) Upload(dst Buffer, src []byte) {
	if len(src) != dst.Bytes() {
		panic(fmt.Sprintf("comm: Upload of %d bytes into a buffer of %d", len(src), dst.Bytes()))
	}
	copy(dst.AsBytes(), src)
}

func (hostKernels) Download(dst []byte, src Buffer) {
	if len(dst) != src.Bytes() {
		panic(fmt.Sprintf("comm: Download of a buffer of %d bytes into %d", src.Bytes(), len(dst)))
	}
	copy(dst, src.AsBytes())
}

func (hostKernels) Sync() error { return nil }

func same(op string, a, b Buffer) {
	if a.Count != b.Count || a.DType != b.DType {
		panic(fmt.Sprintf("comm: %s of %d x %s and %d x %s", op, a.Count, a.DType, b.Count, b.DType))
	}
}

// halfPair checks a (Float16 or BFloat16) against b (Float32), same count.
func halfPair(op string, half, f32 Buffer) {
	if half.Count != f32.Count || (half.DType != Float16 && half.DType != BFloat16) || f32.DType != Float32 {
		panic(fmt.Sprintf("comm: %s between %d x %s and %d x %s", op, half.Count, half.DType, f32.Count, f32.DType))
	}
}

// anyNonfinite reports whether some element of s has an all-ones exponent
// (Inf or NaN) under mask exp, four elements per 64-bit word.
func anyNonfinite(s []uint16, exp uint16) bool {
	const ones, highs = 0x0001_0001_0001_0001, 0x8000_8000_8000_8000
	m := uint64(exp) * ones
	nw := len(s) / 4
	if nw > 0 {
		words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(s))), nw)
		var acc uint64
		for _, w := range words {
			// A lane of t is zero exactly where the exponent is all ones;
			// (t - ones) &^ t has a lane's high bit set if some lane is zero.
			t := w&m ^ m
			acc |= (t - ones) &^ t
		}
		if acc&highs != 0 {
			return true
		}
	}
	for _, v := range s[nw*4:] {
		if v&exp == exp {
			return true
		}
	}
	return false
}
