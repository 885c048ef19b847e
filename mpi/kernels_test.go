//go:build mpi && cgo

package mpi

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

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
