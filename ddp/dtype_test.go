package ddp

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// mixedParams has parameters of every dtype the Reducer reduces,
// interleaved, so that the buckets of each dtype are built apart.
var mixedParams = []Param{
	{Name: "a32", Shape: []int{7}},
	{Name: "a64", Shape: []int{5, 3}, DType: comm.Float64},
	{Name: "a16", Shape: []int{9}, DType: comm.Float16},
	{Name: "abf", Shape: []int{11}, DType: comm.BFloat16},
	{Name: "b32", Shape: []int{4, 4}, DType: comm.Float32},
	{Name: "b64", Shape: []int{6}, DType: comm.Float64},
	{Name: "b16", Shape: []int{33}, DType: comm.Float16},
	{Name: "bbf", Shape: []int{2}, DType: comm.BFloat16},
}

// dtypeUnit is the unit roundoff and half the smallest subnormal of dt.
func dtypeUnit(dt comm.DType) (u, eta float64) {
	switch dt {
	case comm.Float64:
		return 0x1p-53, 0
	case comm.Float16:
		return 0x1p-11, 0x1p-25
	case comm.BFloat16:
		return 0x1p-8, 0x1p-134
	}
	return 0x1p-24, 0x1p-150
}

// TestDTypeEquivalence trains steps over parameters of every dtype with
// every hook, N ranks, random gradients marked in a random order, through
// the rebuild, with views and with CopyGrads: every rank ends each step
// with the same values, each within the hook's bound (package hooks,
// "Dtypes") of the exact average of what the ranks contributed, as the
// dtype holds it. The statistics name each bucket's dtype and wire dtype.
func TestDTypeEquivalence(t *testing.T) {
	testutil.NoLeak(t)
	for n := 1; n <= 3; n++ {
		for _, w := range wires {
			for _, copyGrads := range []bool{false, true} {
				params := mixedParams
				if w.name == "fp16" || w.name == "bf16" {
					params = nil // they refuse float64: TestNewErrors
					for _, p := range mixedParams {
						if p.DType != comm.Float64 {
							params = append(params, p)
						}
					}
				}
				t.Run(fmt.Sprintf("n=%d/%s/copy=%v", n, w.name, copyGrads), func(t *testing.T) {
					dtypeSteps(t, n, w, params, copyGrads)
				})
			}
		}
	}
}

func dtypeSteps(t *testing.T, n int, w wire, params []Param, copyGrads bool) {
	const steps = 3
	rng := rand.New(rand.NewPCG(uint64(n), 99))
	// in[step][rank][param][elem], as float64 values the dtype holds.
	in := make([][][][]float64, steps)
	for s := range in {
		in[s] = make([][][]float64, n)
		for r := range in[s] {
			in[s][r] = make([][]float64, len(params))
			for p, pr := range params {
				in[s][r][p] = make([]float64, pr.Numel())
				for i := range in[s][r][p] {
					v := rng.NormFloat64() * math.Pow(10, -3+4*rng.Float64())
					in[s][r][p][i] = holdAs(dtypeOf(pr), v)
				}
			}
		}
	}
	out := make([][][][]float64, n) // [rank][step][param][elem]
	cs := newTestGroup(t, n)
	errs := withReducers(t, cs, params, func() Options {
		return Options{Hook: w.hook(), BucketCap: 40, FirstBucketCap: 24, CopyGrads: copyGrads, Timeout: time.Minute}
	}, func(rank int, r *Reducer) error {
		rng := rand.New(rand.NewPCG(uint64(rank), 5))
		for s := range steps {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for _, p := range rng.Perm(len(params)) {
				b, err := r.GradBuffer(p)
				if err != nil {
					return err
				}
				for i, v := range in[s][rank][p] {
					setElem(b, i, v)
				}
				if err := r.Ready(p); err != nil {
					return err
				}
			}
			if err := r.Wait(context.Background()); err != nil {
				return err
			}
			got := make([][]float64, len(params))
			for p := range params {
				b, err := r.GradBuffer(p)
				if err != nil {
					return err
				}
				got[p] = make([]float64, b.Count)
				for i := range got[p] {
					got[p][i] = elem(b, i)
				}
			}
			out[rank] = append(out[rank], got)
			var st StepStats
			r.StatsInto(&st)
			for _, bs := range st.Buckets {
				if want := w.hook().Wire(bs.DType); bs.Wire != want || bs.DType == 0 {
					return fmt.Errorf("step %d bucket %d: dtype %v wire %v, want wire %v", s+1, bs.Index, bs.DType, bs.Wire, want)
				}
				if want := bs.Bytes / int64(bs.DType.Size()) * int64(bs.Wire.Size()); bs.WireBytes != want {
					return fmt.Errorf("step %d bucket %d (%s): %d wire bytes, want %d", s+1, bs.Index, bs.DType, bs.WireBytes, want)
				}
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	for s := range steps {
		for p, pr := range params {
			dt := dtypeOf(pr)
			u, eta := dtypeUnit(dt)
			if dt == comm.Float32 {
				u, eta = w.u, w.eta // compressed on the wire
			}
			for i := range out[0][s][p] {
				for r := 1; r < n; r++ {
					if a, b := out[r][s][p][i], out[0][s][p][i]; a != b && !(a != a && b != b) {
						t.Fatalf("step %d %s[%d]: rank %d has %g, rank 0 %g", s+1, pr.Name, i, r, a, b)
					}
				}
				sum := new(big.Float).SetPrec(256)
				var S float64
				for r := range n {
					v := in[s][r][p][i]
					sum.Add(sum, big.NewFloat(v))
					S += math.Abs(v) / float64(n)
				}
				exact, _ := sum.Quo(sum, big.NewFloat(float64(n))).Float64()
				bound := hookBound(u, eta, n, S)
				if dt == comm.Float64 {
					bound = hookBound(u, 0, n, S) - 2*0x1p-24*S // no float32 factor: comm.Avg in float64
				}
				bound += math.Abs(exact) * 0x1p-53 // exact is rounded to float64
				if d := math.Abs(out[0][s][p][i] - exact); d > bound {
					t.Fatalf("step %d %s (%s) [%d]: got %g, exact average %g: error %g > bound %g", s+1, pr.Name, dt, i, out[0][s][p][i], exact, d, bound)
				}
			}
		}
	}
}

// dtypeOf is p's dtype, Float32 for 0.
func dtypeOf(p Param) comm.DType {
	if p.DType == 0 {
		return comm.Float32
	}
	return p.DType
}

// holdAs rounds v to a value dtype dt holds.
func holdAs(dt comm.DType, v float64) float64 {
	switch dt {
	case comm.Float32:
		return float64(float32(v))
	case comm.Float16:
		return float64(fp16.ToFloat32(fp16.FromFloat32(float32(v))))
	case comm.BFloat16:
		return float64(fp16.BFloat16ToFloat32Scalar(fp16.BFloat16FromFloat32(float32(v))))
	}
	return v
}

func setElem(b comm.Buffer, i int, v float64) {
	switch b.DType {
	case comm.Float32:
		b.AsFloat32()[i] = float32(v)
	case comm.Float64:
		b.AsFloat64()[i] = v
	case comm.Float16:
		b.AsUint16()[i] = fp16.FromFloat32(float32(v))
	case comm.BFloat16:
		b.AsUint16()[i] = fp16.BFloat16FromFloat32(float32(v))
	}
}

func elem(b comm.Buffer, i int) float64 {
	switch b.DType {
	case comm.Float32:
		return float64(b.AsFloat32()[i])
	case comm.Float64:
		return b.AsFloat64()[i]
	case comm.Float16:
		return float64(fp16.ToFloat32(b.AsUint16()[i]))
	}
	return float64(fp16.BFloat16ToFloat32Scalar(b.AsUint16()[i]))
}

// TestDTypeAPI: Grad, SetGrad and AddGrad of a parameter that is not
// float32 fail with ErrDType naming it; Broadcast carries every dtype.
func TestDTypeAPI(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	errs := withReducers(t, cs, mixedParams, func() Options { return Options{Hook: hooks.AllReduce()} }, func(rank int, r *Reducer) error {
		if rank == 0 {
			_, err := r.Grad(1)
			wantErr(t, err, ErrDType, `Grad(1): parameter "a64" is double`, "GradBuffer")
		}
		vals := make([]comm.Buffer, len(mixedParams))
		for i, p := range mixedParams {
			switch p.DType {
			case comm.Float64:
				v := make([]float64, p.Numel())
				for j := range v {
					v[j] = float64(10*rank+i) + 1e-12*float64(j)
				}
				vals[i] = comm.Float64s(v)
			case comm.Float16, comm.BFloat16:
				v := make([]uint16, p.Numel())
				for j := range v {
					v[j] = uint16(100*rank + i + j)
				}
				vals[i] = comm.HostBuffer(comm.Halves(v).Addr, len(v), p.DType)
			default:
				v := make([]float32, p.Numel())
				for j := range v {
					v[j] = float32(10*rank + i + j)
				}
				vals[i] = comm.Float32s(v)
			}
		}
		if err := r.Broadcast(context.Background(), 1, vals); err != nil {
			return err
		}
		for i, p := range mixedParams {
			for j := range vals[i].Count {
				var want float64
				switch p.DType {
				case comm.Float64:
					want = float64(10+i) + 1e-12*float64(j)
				case comm.Float16, comm.BFloat16:
					if got := vals[i].AsUint16()[j]; got != uint16(100+i+j) {
						return fmt.Errorf("%s[%d] = %#x after Broadcast from rank 1", p.Name, j, got)
					}
					continue
				default:
					want = float64(10 + i + j)
				}
				if got := elem(vals[i], j); got != want {
					return fmt.Errorf("%s[%d] = %v after Broadcast from rank 1, want %v", p.Name, j, got, want)
				}
			}
		}
		if err := r.Begin(Sync); err != nil {
			return err
		}
		if rank == 0 {
			wantErr(t, r.SetGrad(2, make([]float32, 9)), ErrDType, `SetGrad of parameter 2 ("a16"): it is half`, "GradBuffer")
			wantErr(t, r.AddGrad(3, make([]float32, 11)), ErrDType, `AddGrad of parameter 3 ("abf"): it is bfloat16`)
		}
		for i := range mixedParams {
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		return r.Wait(context.Background())
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}
