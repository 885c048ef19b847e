//go:build mpi && cgo

package mpi

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/internal/reduce"
)

// TestHalfReductions checks the C reductions MPI applies to Float16 and
// BFloat16 against package fp16 and internal/reduce, bit for bit (NaNs by
// being NaN): every binary16 value against a spread of others, and random
// pairs, with and without F16C.
func TestHalfReductions(t *testing.T) {
	if os.Getenv("OMPI_COMM_WORLD_SIZE") != "" {
		t.Skip("no MPI involved: runs in the single-process run only")
	}
	const n = 1 << 16
	a := make([]uint16, n)
	for i := range a {
		a[i] = uint16(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	partners := []uint16{0, 0x8000, 0x3c00, 0xbc00, 0x0001, 0x8001, 0x03ff, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x3f80, 0x4049}
	for range 6 {
		partners = append(partners, uint16(rng.Uint32()))
	}
	for _, f16c := range []bool{true, false} {
		for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
			for _, op := range []comm.Op{comm.Sum, comm.Max, comm.Min} {
				check := func(in, io []uint16) {
					t.Helper()
					want := expectHalf(dt, op, in, io)
					got := append([]uint16(nil), io...)
					reduceHalves(dt, op, in, got, f16c)
					for i := range got {
						if got[i] != want[i] && !(isNaN(dt, got[i]) && isNaN(dt, want[i])) {
							t.Fatalf("%s %s (F16C %v): %#04x op %#04x = %#04x, want %#04x", dt, op, f16c, in[i], io[i], got[i], want[i])
						}
					}
				}
				b := make([]uint16, n)
				for _, p := range partners {
					for i := range b {
						b[i] = p
					}
					check(a, b)
					check(b, a)
				}
				for range 4 {
					x, y := make([]uint16, n+5), make([]uint16, n+5)
					for i := range x {
						x[i], y[i] = uint16(rng.Uint32()), uint16(rng.Uint32())
					}
					check(x, y)
				}
			}
		}
	}
}

func expectHalf(dt comm.DType, op comm.Op, in, io []uint16) []uint16 {
	out := make([]uint16, len(in))
	switch op {
	case comm.Max:
		reduce.MaxHalf(out, io, in)
		return out
	case comm.Min:
		reduce.MinHalf(out, io, in)
		return out
	}
	for i := range in {
		if dt == comm.Float16 {
			out[i] = fp16.FromFloat32(fp16.ToFloat32(in[i]) + fp16.ToFloat32(io[i]))
		} else {
			out[i] = fp16.BFloat16FromFloat32(fp16.BFloat16ToFloat32Scalar(in[i]) + fp16.BFloat16ToFloat32Scalar(io[i]))
		}
	}
	return out
}

func isNaN(dt comm.DType, h uint16) bool {
	if dt == comm.Float16 {
		return h&0x7c00 == 0x7c00 && h&0x3ff != 0
	}
	return math.IsNaN(float64(fp16.BFloat16ToFloat32Scalar(h)))
}

// TestPairAverages checks the operations that average two ranks inside
// MPI's reduction: float32 and float64 bit for bit against inproc's Avg
// kernels (the pre-multiplied sum), float16 and bfloat16 against halving
// in float32 and rounding once; at the edges (the largest finite values,
// whose sum overflows, subnormals, infinities, NaN) and on random pairs.
func TestPairAverages(t *testing.T) {
	if os.Getenv("OMPI_COMM_WORLD_SIZE") != "" {
		t.Skip("no MPI involved: runs in the single-process run only")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	edges32 := []float32{0, -0.0, 1, -1, math.MaxFloat32, -math.MaxFloat32, 3e38, 0x1p-149, 0x1p-126, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	var a32, b32 []float32
	for _, x := range edges32 {
		for _, y := range edges32 {
			a32, b32 = append(a32, x), append(b32, y)
		}
	}
	for range 1000 {
		a32 = append(a32, math.Float32frombits(rng.Uint32()))
		b32 = append(b32, math.Float32frombits(rng.Uint32()))
	}
	want32 := make([]float32, len(a32))
	reduce.AvgFloat32(want32, [][]float32{b32, a32}, nil)
	got32 := append([]float32(nil), b32...)
	averagePair(comm.Float32, unsafe.Pointer(&a32[0]), unsafe.Pointer(&got32[0]), len(a32))
	for i := range got32 {
		if math.Float32bits(got32[i]) != math.Float32bits(want32[i]) && !(got32[i] != got32[i] && want32[i] != want32[i]) {
			t.Fatalf("float32 average of %g and %g: %g, inproc's %g", a32[i], b32[i], got32[i], want32[i])
		}
	}
	a64, b64 := make([]float64, len(a32)), make([]float64, len(a32))
	for i := range a64 {
		a64[i], b64[i] = float64(a32[i])*1e300, float64(b32[i])*1e-300
	}
	a64[0], b64[0] = math.MaxFloat64, math.MaxFloat64
	want64 := make([]float64, len(a64))
	reduce.AvgFloat64(want64, [][]float64{b64, a64}, nil)
	got64 := append([]float64(nil), b64...)
	averagePair(comm.Float64, unsafe.Pointer(&a64[0]), unsafe.Pointer(&got64[0]), len(a64))
	for i := range got64 {
		if math.Float64bits(got64[i]) != math.Float64bits(want64[i]) && !(got64[i] != got64[i] && want64[i] != want64[i]) {
			t.Fatalf("float64 average of %g and %g: %g, inproc's %g", a64[i], b64[i], got64[i], want64[i])
		}
	}
	if got64[0] != math.MaxFloat64 {
		t.Errorf("the average of the largest float64 with itself overflowed: %g", got64[0])
	}
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		toF, fromF := fp16.ToFloat32, fp16.FromFloat32
		if dt == comm.BFloat16 {
			toF, fromF = fp16.BFloat16ToFloat32Scalar, fp16.BFloat16FromFloat32
		}
		const n = 1 << 16
		a, b := make([]uint16, n), make([]uint16, n)
		for i := range a {
			a[i], b[i] = uint16(i), uint16(rng.Uint32())
		}
		b[0x7bff], b[0x7f7f] = 0x7bff, 0x7f7f // the largest finite values, with themselves
		got := append([]uint16(nil), b...)
		averagePair(dt, unsafe.Pointer(&a[0]), unsafe.Pointer(&got[0]), n)
		for i := range got {
			want := fromF(float32(toF(a[i])*0.5) + float32(toF(b[i])*0.5))
			if got[i] != want && !(isNaN(dt, got[i]) && isNaN(dt, want)) {
				t.Fatalf("%s average of %#04x and %#04x: %#04x, want %#04x", dt, a[i], b[i], got[i], want)
			}
		}
		if got[0x7bff] != 0x7bff && dt == comm.Float16 || got[0x7f7f] != 0x7f7f && dt == comm.BFloat16 {
			t.Errorf("%s: the average of the largest finite value with itself is not itself", dt)
		}
	}
}
