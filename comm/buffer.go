package comm

import (
	"fmt"
	"unsafe"
)

// Location says where a Buffer's memory lives.
type Location uint8

// Host memory is addressable from Go; Device memory is not.
const (
	Host Location = iota
	Device
)

// Buffer describes Count elements of type DType starting at Addr. It does
// not own the memory. A host Buffer's memory must stay valid (and, if it is
// Go memory, reachable) until every Work that uses it has completed; memory
// from the CommPool is off the Go heap and may be kept by C libraries.
type Buffer struct {
	Addr   unsafe.Pointer // first element; nil only when Count is 0
	Count  int            // number of elements
	DType  DType
	Loc    Location
	Device int // device ordinal when Loc == Device
}

// HostBuffer describes count elements of dt at p in host memory.
func HostBuffer(p unsafe.Pointer, count int, dt DType) Buffer {
	return Buffer{Addr: p, Count: count, DType: dt, Loc: Host}
}

// Float32s describes a []float32.
func Float32s(s []float32) Buffer {
	return HostBuffer(unsafe.Pointer(unsafe.SliceData(s)), len(s), Float32)
}

// Float64s describes a []float64.
func Float64s(s []float64) Buffer {
	return HostBuffer(unsafe.Pointer(unsafe.SliceData(s)), len(s), Float64)
}

// Halves describes a []uint16 holding IEEE binary16 values.
func Halves(s []uint16) Buffer {
	return HostBuffer(unsafe.Pointer(unsafe.SliceData(s)), len(s), Float16)
}

// BFloat16s describes a []uint16 holding bfloat16 values.
func BFloat16s(s []uint16) Buffer {
	return HostBuffer(unsafe.Pointer(unsafe.SliceData(s)), len(s), BFloat16)
}

// Int32s describes a []int32.
func Int32s(s []int32) Buffer {
	return HostBuffer(unsafe.Pointer(unsafe.SliceData(s)), len(s), Int32)
}

// Int64s describes a []int64.
func Int64s(s []int64) Buffer {
	return HostBuffer(unsafe.Pointer(unsafe.SliceData(s)), len(s), Int64)
}

// Uint8s describes a []uint8.
func Uint8s(s []uint8) Buffer {
	return HostBuffer(unsafe.Pointer(unsafe.SliceData(s)), len(s), Uint8)
}

// Bytes returns the buffer's size in bytes.
func (b Buffer) Bytes() int { return b.Count * b.DType.Size() }

// Slice returns the sub-buffer of n elements starting at element off.
// It panics if the range is outside the buffer.
func (b Buffer) Slice(off, n int) Buffer {
	if off < 0 || n < 0 || off+n > b.Count {
		panic(fmt.Sprintf("comm: Buffer.Slice(%d, %d) out of range for %d elements", off, n, b.Count))
	}
	if n == 0 {
		b.Addr = nil
	} else {
		b.Addr = unsafe.Add(b.Addr, off*b.DType.Size())
	}
	b.Count = n
	return b
}

func (b Buffer) host(dt DType) unsafe.Pointer {
	if b.Loc != Host {
		panic("comm: Go slice view of a device Buffer")
	}
	if b.DType.Size() != dt.Size() {
		panic(fmt.Sprintf("comm: %s view of a %s Buffer", dt, b.DType))
	}
	return b.Addr
}

// AsFloat32 returns a host buffer's elements as a []float32. It panics for a
// device buffer or an element size other than 4 bytes.
func (b Buffer) AsFloat32() []float32 {
	return unsafe.Slice((*float32)(b.host(Float32)), b.Count)
}

// AsFloat64 returns a host buffer's elements as a []float64.
func (b Buffer) AsFloat64() []float64 {
	return unsafe.Slice((*float64)(b.host(Float64)), b.Count)
}

// AsUint16 returns a host buffer's elements as a []uint16 (for Float16 and
// BFloat16 buffers).
func (b Buffer) AsUint16() []uint16 {
	return unsafe.Slice((*uint16)(b.host(Float16)), b.Count)
}

// AsInt32 returns a host buffer's elements as a []int32.
func (b Buffer) AsInt32() []int32 {
	return unsafe.Slice((*int32)(b.host(Int32)), b.Count)
}

// AsInt64 returns a host buffer's elements as a []int64.
func (b Buffer) AsInt64() []int64 {
	return unsafe.Slice((*int64)(b.host(Int64)), b.Count)
}

// AsBytes returns a host buffer's memory as a []byte of b.Bytes() bytes.
func (b Buffer) AsBytes() []byte {
	if b.Loc != Host {
		panic("comm: Go slice view of a device Buffer")
	}
	return unsafe.Slice((*byte)(b.Addr), b.Bytes())
}
