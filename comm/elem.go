package comm

import (
	"math"
	"unsafe"

	"github.com/ddpgo/ddpgo/fp16"
)

// PutElem writes x, rounded once to dt (round to nearest even for the
// float types, truncated for the integers), as the element at the start
// of b, which must hold at least dt.Size() bytes of host memory. Tests and
// benchmarks use it to fill buffers of any dtype from exact values.
func PutElem(dt DType, b []byte, x float64) {
	p := unsafe.Pointer(&b[:dt.Size()][0])
	switch dt {
	case Float32:
		*(*float32)(p) = float32(x)
	case Float64:
		*(*float64)(p) = x
	case Float16:
		*(*uint16)(p) = fp16.FromFloat32(float32(x))
	case BFloat16:
		*(*uint16)(p) = fp16.BFloat16FromFloat32(float32(x))
	case Int32:
		*(*int32)(p) = int32(x)
	case Int64:
		*(*int64)(p) = int64(x)
	case Uint8:
		*(*uint8)(p) = uint8(x)
	}
}

// Elem returns the element of dtype dt at the start of b as a float64
// (NaN for an invalid dtype), the inverse of PutElem.
func Elem(dt DType, b []byte) float64 {
	if !dt.Valid() {
		return math.NaN()
	}
	p := unsafe.Pointer(&b[:dt.Size()][0])
	switch dt {
	case Float32:
		return float64(*(*float32)(p))
	case Float64:
		return *(*float64)(p)
	case Float16:
		return float64(fp16.ToFloat32(*(*uint16)(p)))
	case BFloat16:
		return float64(fp16.BFloat16ToFloat32Scalar(*(*uint16)(p)))
	case Int32:
		return float64(*(*int32)(p))
	case Int64:
		return float64(*(*int64)(p))
	case Uint8:
		return float64(*(*uint8)(p))
	}
	return math.NaN()
}
