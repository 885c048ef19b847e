package reduce

import (
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
)

// Elem is the set of element types with native Go arithmetic.
type Elem interface {
	~float32 | ~float64 | ~int32 | ~int64 | ~uint8 | ~uint16
}

// Binary is an element-wise kernel: dst[i] = a[i] op b[i] for i < len(dst).
// a and b must be at least as long as dst; dst may alias a or b.
type Binary[T Elem] func(dst, a, b []T)

// Kernel returns the binary kernel of op for T. Avg returns the Sum kernel:
// the caller divides the final sum with Div, which is how integer Avg
// truncates; floating-point Avg is a pre-multiplied sum (AvgFloat32,
// AvgFloat64, AvgBFloat16), which never goes through Kernel.
func Kernel[T Elem](op comm.Op) Binary[T] {
	var zero T
	switch any(zero).(type) {
	case float32:
		switch op {
		case comm.Sum, comm.Avg:
			return any(Binary[float32](SumFloat32)).(Binary[T])
		case comm.Max:
			return any(Binary[float32](MaxFloat32)).(Binary[T])
		case comm.Min:
			return any(Binary[float32](MinFloat32)).(Binary[T])
		}
	case float64:
		if op == comm.Sum || op == comm.Avg {
			return any(Binary[float64](SumFloat64)).(Binary[T])
		}
	}
	switch op {
	case comm.Sum, comm.Avg:
		return Sum[T]
	case comm.Max:
		return Max[T]
	case comm.Min:
		return Min[T]
	}
	panic(fmt.Sprintf("reduce: invalid op %d", uint8(op)))
}

// N reduces every slice of srcs into dst with k: dst = srcs[0] op srcs[1]
// op ... in rank order. Every src must be at least len(dst) long, and tmp
// must be too when there are more than two srcs. dst may alias any src
// element for element.
func N[T Elem](k Binary[T], dst []T, srcs [][]T, tmp []T) {
	switch len(srcs) {
	case 0:
		return
	case 1:
		if len(dst) > 0 && &dst[0] != &srcs[0][0] {
			copy(dst, srcs[0][:len(dst)])
		}
	case 2:
		k(dst, srcs[0], srcs[1])
	default:
		tmp = tmp[:len(dst)]
		k(tmp, srcs[0], srcs[1])
		last := len(srcs) - 1
		for _, s := range srcs[2:last] {
			k(tmp, tmp, s)
		}
		k(dst, tmp, srcs[last])
	}
}

// Sum is the portable sum kernel: dst[i] = a[i] + b[i].
func Sum[T Elem](dst, a, b []T) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	i := 0
	for ; i+4 <= len(dst); i += 4 {
		d := dst[i : i+4 : i+4]
		x := a[i : i+4 : i+4]
		y := b[i : i+4 : i+4]
		d[0] = x[0] + y[0]
		d[1] = x[1] + y[1]
		d[2] = x[2] + y[2]
		d[3] = x[3] + y[3]
	}
	for ; i < len(dst); i++ {
		dst[i] = a[i] + b[i]
	}
}

// Max is the portable maximum kernel. For floats a NaN in b is ignored
// and a NaN in a is kept, as in a comparison-based maximum.
func Max[T Elem](dst, a, b []T) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		x, y := a[i], b[i]
		if y > x {
			x = y
		}
		dst[i] = x
	}
}

// Min is the portable minimum kernel.
func Min[T Elem](dst, a, b []T) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		x, y := a[i], b[i]
		if y < x {
			x = y
		}
		dst[i] = x
	}
}

// Div divides every element of dst by n >= 1: the final step of Avg.
// Floats divide in their own precision (one rounding); integers truncate
// toward zero, and when n does not fit in the integer type (a uint8
// average over 256 ranks or more) every element is smaller than n, so the
// quotient is 0.
func Div[T Elem](dst []T, n int) {
	d := T(n)
	if one := T(1); one/2 == 0 && int64(d) != int64(n) {
		clear(dst)
		return
	}
	for i := range dst {
		dst[i] /= d
	}
}

// halfKey maps the bits of an IEEE binary16 or bfloat16 value to an
// unsigned key with the same order (for values that are not NaN): both
// formats are sign-magnitude.
func halfKey(h uint16) uint16 {
	if h&0x8000 != 0 {
		return ^h
	}
	return h | 0x8000
}

// MaxHalf is the maximum kernel for binary16 and bfloat16 bit patterns.
// It returns one of its inputs unchanged, so it needs no rounding.
func MaxHalf(dst, a, b []uint16) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		x, y := a[i], b[i]
		if halfKey(y) > halfKey(x) {
			x = y
		}
		dst[i] = x
	}
}

// MinHalf is the minimum kernel for binary16 and bfloat16 bit patterns.
func MinHalf(dst, a, b []uint16) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		x, y := a[i], b[i]
		if halfKey(y) < halfKey(x) {
			x = y
		}
		dst[i] = x
	}
}

func sumTwice(dst0, dst1, a, b []float32) {
	dst1, a, b = dst1[:len(dst0)], a[:len(dst0)], b[:len(dst0)]
	for i := range dst0 {
		s := a[i] + b[i]
		dst0[i] = s
		dst1[i] = s
	}
}

func avgTwice(dst0, dst1, a, b []float32) {
	dst1, a, b = dst1[:len(dst0)], a[:len(dst0)], b[:len(dst0)]
	for i := range dst0 {
		s := float32(a[i]*0.5) + float32(b[i]*0.5)
		dst0[i] = s
		dst1[i] = s
	}
}
