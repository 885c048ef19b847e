package inproc

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/internal/reduce"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestAvgAtTheEdges runs floating-point Avg collectives whose sums
// overflow while their averages do not, and averages of subnormals, on 2,
// 3 and 4 ranks, small (one rank does the work) and large (every rank
// takes a share), through AllReduce (in and out of place), Reduce and
// ReduceScatter. Every result must be finite and equal what the reduction
// kernels give for the same inputs.
func TestAvgAtTheEdges(t *testing.T) {
	type edge struct {
		dt   comm.DType
		vals []float64 // per-rank values, cycled over ranks and elements
		want float64   // the average of every element whose ranks all hold vals[0]; NaN if not checked
	}
	edges := []edge{
		{comm.Float32, []float64{3e38}, float64(float32(3e38))},
		{comm.Float32, []float64{math.MaxFloat32, -math.MaxFloat32, 1e-45, 3e-45}, math.MaxFloat32},
		{comm.Float64, []float64{1e308}, 1e308},
		{comm.Float64, []float64{math.MaxFloat64, 5e-324, -math.MaxFloat64}, math.MaxFloat64},
		{comm.BFloat16, []float64{float64(fp16.BFloat16ToFloat32Scalar(0x7f7f)), 1e-40}, float64(fp16.BFloat16ToFloat32Scalar(0x7f7f))},
		{comm.Float16, []float64{65504, 6e-8, -65504}, 65504},
	}
	for _, n := range []int{2, 3, 4} {
		cs := testGroup(t, n, Options{})
		for _, e := range edges {
			for _, count := range []int{5, 20000} {
				for _, kind := range []comm.Kind{comm.KindAllReduce, comm.KindReduce, comm.KindReduceScatter} {
					for _, inPlace := range []bool{true, false} {
						name := fmt.Sprintf("%d ranks, %s, %d x %s, in place %v", n, kind, count, e.dt, inPlace)
						checkAvgEdge(t, name, cs, kind, e.dt, count, inPlace, e.vals, e.want)
					}
				}
			}
		}
	}
}

// value returns the element i of rank r's input: vals[0] at every
// element that is a multiple of 3, so those elements average to it.
func value(vals []float64, r, i int) float64 {
	if i%3 == 0 {
		return vals[0]
	}
	return vals[(r+i)%len(vals)]
}

func checkAvgEdge(t *testing.T, name string, cs []*Comm, kind comm.Kind, dt comm.DType, count int, inPlace bool, vals []float64, want float64) {
	t.Helper()
	n := len(cs)
	total := count
	if kind == comm.KindReduceScatter {
		total = count * n
	}
	sends := make([][]byte, n)
	recvs := make([][]byte, n)
	ws := make([]comm.Work, n)
	in := make([][]float64, n)
	for r := range n {
		in[r] = make([]float64, total)
		sends[r] = make([]byte, total*dt.Size())
		for i := range total {
			in[r][i] = value(vals, r, i)
			put(sends[r], dt, i, in[r][i])
		}
		recvs[r] = sends[r][:count*dt.Size()]
		if !inPlace || kind == comm.KindReduce && r != 0 {
			recvs[r] = make([]byte, count*dt.Size())
		}
		if kind == comm.KindReduceScatter && inPlace {
			recvs[r] = sends[r][r*count*dt.Size() : (r+1)*count*dt.Size()]
		}
		send := comm.HostBuffer(ptr(sends[r]), total, dt)
		recv := comm.HostBuffer(ptr(recvs[r]), count, dt)
		switch kind {
		case comm.KindAllReduce:
			ws[r] = cs[r].AllReduce(send, recv, comm.Avg)
		case comm.KindReduce:
			ws[r] = cs[r].Reduce(send, recv, comm.Avg, 0)
		case comm.KindReduceScatter:
			ws[r] = cs[r].ReduceScatter(send, recv, comm.Avg)
		}
	}
	for r, err := range testutil.WaitAll(t, ws...) {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", name, r, err)
		}
	}
	for r := range n {
		if kind == comm.KindReduce && r != 0 {
			continue
		}
		off := 0
		if kind == comm.KindReduceScatter {
			off = r * count
		}
		for i := range count {
			xs := make([]float64, n)
			for q := range n {
				xs[q] = in[q][off+i]
			}
			exp := kernelAvg(dt, xs)
			got := get(recvs[r], dt, i)
			if math.Float64bits(got) != math.Float64bits(exp) {
				t.Fatalf("%s: rank %d element %d = %v, the reduction kernels give %v for %v", name, r, i, got, exp, xs)
			}
			if math.IsInf(got, 0) || math.IsNaN(got) {
				t.Fatalf("%s: rank %d element %d = %v, the average of finite %v", name, r, i, got, xs)
			}
			// Ranks that all hold want average to it: exactly when 1/n is
			// exact, otherwise within the rounding of 1/n, the products
			// and the sums (and the last rounding of a 16-bit type).
			if (off+i)%3 == 0 && (n&(n-1) == 0 && got != want || math.Abs(got-want) > tolerance(dt, n)*math.Abs(want)) {
				t.Fatalf("%s: rank %d element %d = %v, want %v", name, r, i, got, want)
			}
		}
	}
}

// tolerance is the relative error allowed for an average of n equal values.
func tolerance(dt comm.DType, n int) float64 {
	u := map[comm.DType]float64{comm.Float32: 0x1p-24, comm.Float64: 0x1p-53, comm.BFloat16: 0x1p-24, comm.Float16: 0x1p-24}[dt]
	last := map[comm.DType]float64{comm.BFloat16: 0x1p-8, comm.Float16: 0x1p-11}[dt]
	return float64(n+2)*u + last
}

// kernelAvg is the average of xs as the reduction kernels compute it.
func kernelAvg(dt comm.DType, xs []float64) float64 {
	n := len(xs)
	switch dt {
	case comm.Float32:
		srcs := make([][]float32, n)
		for j, x := range xs {
			srcs[j] = []float32{float32(x)}
		}
		out := []float32{0}
		reduce.AvgFloat32(out, srcs, make([]float32, 1))
		return float64(out[0])
	case comm.Float64:
		srcs := make([][]float64, n)
		for j, x := range xs {
			srcs[j] = []float64{x}
		}
		out := []float64{0}
		reduce.AvgFloat64(out, srcs, make([]float64, 1))
		return out[0]
	case comm.BFloat16:
		srcs := make([][]uint16, n)
		for j, x := range xs {
			srcs[j] = []uint16{fp16.BFloat16FromFloat32(float32(x))}
		}
		out := []uint16{0}
		reduce.AvgBFloat16(out, srcs, make([]float32, 1), make([]float32, 1))
		return float64(fp16.BFloat16ToFloat32Scalar(out[0]))
	case comm.Float16:
		var sum float32
		for _, x := range xs {
			sum += fp16.ToFloat32(fp16.FromFloat32(float32(x)))
		}
		return float64(fp16.ToFloat32(fp16.FromFloat32(sum * (1 / float32(n)))))
	}
	panic(dt)
}

func put(b []byte, dt comm.DType, i int, v float64) {
	switch dt {
	case comm.Float32:
		comm.HostBuffer(ptr(b), len(b)/4, dt).AsFloat32()[i] = float32(v)
	case comm.Float64:
		comm.HostBuffer(ptr(b), len(b)/8, dt).AsFloat64()[i] = v
	case comm.BFloat16:
		comm.HostBuffer(ptr(b), len(b)/2, dt).AsUint16()[i] = fp16.BFloat16FromFloat32(float32(v))
	case comm.Float16:
		comm.HostBuffer(ptr(b), len(b)/2, dt).AsUint16()[i] = fp16.FromFloat32(float32(v))
	}
}

func get(b []byte, dt comm.DType, i int) float64 {
	switch dt {
	case comm.Float32:
		return float64(comm.HostBuffer(ptr(b), len(b)/4, dt).AsFloat32()[i])
	case comm.Float64:
		return comm.HostBuffer(ptr(b), len(b)/8, dt).AsFloat64()[i]
	case comm.BFloat16:
		return float64(fp16.BFloat16ToFloat32Scalar(comm.HostBuffer(ptr(b), len(b)/2, dt).AsUint16()[i]))
	case comm.Float16:
		return float64(fp16.ToFloat32(comm.HostBuffer(ptr(b), len(b)/2, dt).AsUint16()[i]))
	}
	panic(dt)
}

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
