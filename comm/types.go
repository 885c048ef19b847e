package comm

import "fmt"

// DType is the element type of a Buffer.
type DType uint8

// The element types every backend carries. Float16 is IEEE 754 binary16,
// BFloat16 is the upper half of a float32; both are stored as uint16.
const (
	Float32 DType = iota + 1
	Float16
	BFloat16
	Float64
	Int32
	Int64
	Uint8
)

// DTypes lists every DType, in declaration order.
var DTypes = []DType{Float32, Float16, BFloat16, Float64, Int32, Int64, Uint8}

// Size returns the size of one element in bytes, or 0 for an invalid DType.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float16, BFloat16:
		return 2
	case Float64, Int64:
		return 8
	case Uint8:
		return 1
	}
	return 0
}

// Valid reports whether d is one of the declared DTypes.
func (d DType) Valid() bool { return d.Size() != 0 }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float32 || d == Float16 || d == BFloat16 || d == Float64
}

// String returns the nccl-tests spelling of d ("float", "half", "bfloat16",
// "double", "int32", "int64", "uint8").
func (d DType) String() string {
	switch d {
	case Float32:
		return "float"
	case Float16:
		return "half"
	case BFloat16:
		return "bfloat16"
	case Float64:
		return "double"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Uint8:
		return "uint8"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseDType accepts the nccl-tests names ("float", "half", "bfloat16",
// "double", "int32", "int64", "uint8") and the Go-style aliases "float32",
// "float16", "bf16", "fp16", "fp32", "float64", "fp64".
func ParseDType(s string) (DType, error) {
	switch s {
	case "float", "float32", "fp32", "f32":
		return Float32, nil
	case "half", "float16", "fp16", "f16":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "double", "float64", "fp64", "f64":
		return Float64, nil
	case "int32", "int":
		return Int32, nil
	case "int64":
		return Int64, nil
	case "uint8", "byte":
		return Uint8, nil
	}
	return 0, fmt.Errorf("comm: unknown dtype %q (want one of float, half, bfloat16, double, int32, int64, uint8)", s)
}

// Op is a reduction operation.
type Op uint8

// Reduction operations. Avg is Sum divided by the group size, computed in
// the element type's own arithmetic (integers divide with truncation).
const (
	Sum Op = iota + 1
	Avg
	Max
	Min
)

// Ops lists every Op, in declaration order.
var Ops = []Op{Sum, Avg, Max, Min}

// Valid reports whether o is one of the declared Ops.
func (o Op) Valid() bool { return o >= Sum && o <= Min }

// String returns the nccl-tests spelling of o ("sum", "avg", "max", "min").
func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Max:
		return "max"
	case Min:
		return "min"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// ParseOp is the inverse of Op.String.
func ParseOp(s string) (Op, error) {
	switch s {
	case "sum":
		return Sum, nil
	case "avg":
		return Avg, nil
	case "max":
		return Max, nil
	case "min":
		return Min, nil
	}
	return 0, fmt.Errorf("comm: unknown reduction op %q (want sum, avg, max or min)", s)
}

// Kind names a collective operation, for errors, statistics and bandwidth.
type Kind uint8

// The collective kinds of the contract.
const (
	KindAllReduce Kind = iota + 1
	KindBroadcast
	KindReduce
	KindAllGather
	KindReduceScatter
	KindSend
	KindRecv
	KindBarrier
)

// String returns the nccl-tests name of k ("all_reduce", "broadcast", ...).
func (k Kind) String() string {
	switch k {
	case KindAllReduce:
		return "all_reduce"
	case KindBroadcast:
		return "broadcast"
	case KindReduce:
		return "reduce"
	case KindAllGather:
		return "all_gather"
	case KindReduceScatter:
		return "reduce_scatter"
	case KindSend:
		return "send"
	case KindRecv:
		return "recv"
	case KindBarrier:
		return "barrier"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}
