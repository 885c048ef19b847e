package ddp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestDeviceMemory runs steps with every hook over the test device: the
// Reducer must reach the gradients through GradBuffer and the kernels
// only (host accesses panic), rebuild its layout, broadcast parameters and
// zero unused gradients, and still average correctly.
func TestDeviceMemory(t *testing.T) {
	testutil.NoLeak(t)
	const n, steps = 3, 3
	params := []Param{{Name: "w1", Shape: []int{33, 7}}, {Name: "b1", Shape: []int{7}}, {Name: "w2", Shape: []int{7, 5}}, {Name: "unused", Shape: []int{4}}}
	for _, w := range wires {
		t.Run(w.name, func(t *testing.T) {
			cs := newTestGroup(t, n)
			grads := make([][][][]float32, n) // rank, step, param
			got := make([][][][]float32, n)
			bcast := make([][][]float32, n)
			errs := runRanks(cs, func(rank int, c comm.Communicator) error {
				pool, err := allocator.New(allocator.Options{Source: commtest.NewDeviceSource()})
				if err != nil {
					return err
				}
				defer pool.Close()
				dc := commtest.DeviceComm{Communicator: c, Ordinal: 1}
				kern := dc.Kernels()
				r, err := New(context.Background(), dc, params, Options{Pool: pool, Hook: w.hook(), BucketCap: 256, FirstBucketCap: 128, FindUnusedParameters: true})
				if err != nil {
					return err
				}
				defer r.Close()
				if g, err := r.Grad(0); g != nil || !errors.Is(err, ErrOptions) {
					return fmt.Errorf("Grad of device memory returned %v, %v; want ErrOptions", g, err)
				}
				vals := make([][]float32, len(params))
				for i, p := range params {
					vals[i] = make([]float32, p.Numel())
					for j := range vals[i] {
						vals[i][j] = float32(rank*1000 + i*100 + j)
					}
				}
				if err := r.BroadcastParameters(context.Background(), vals); err != nil {
					return err
				}
				bcast[rank] = vals
				rng := rand.New(rand.NewPCG(uint64(rank), 3))
				for step := range steps {
					if err := r.Begin(Sync); err != nil {
						return err
					}
					gs := make([][]float32, len(params))
					for i := range 3 { // "unused" gets no gradient
						gs[i] = make([]float32, params[i].Numel())
						for j := range gs[i] {
							gs[i][j] = float32(rng.NormFloat64())
						}
						if i == 1 {
							if err := r.SetGrad(i, gs[i]); err != nil {
								return err
							}
							continue
						}
						kern.Upload(mustGradBuffer(r, i), bytesOf(gs[i]))
						if err := r.Ready(i); err != nil {
							return err
						}
					}
					if err := r.Wait(context.Background()); err != nil {
						return fmt.Errorf("step %d: %w", step, err)
					}
					out := make([][]float32, len(params))
					for i, p := range params {
						out[i] = make([]float32, p.Numel())
						kern.Download(bytesOf(out[i]), mustGradBuffer(r, i))
					}
					grads[rank] = append(grads[rank], gs)
					got[rank] = append(got[rank], out)
				}
				if err := r.AddGrad(0, make([]float32, 33*7)); !errors.Is(err, ErrNoStep) && !errors.Is(err, ErrOptions) {
					return fmt.Errorf("AddGrad on device memory: %v", err)
				}
				return r.Close()
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			for rank := range n {
				for i := range params {
					for j, v := range bcast[rank][i] {
						if v != bcast[0][i][j] {
							t.Fatalf("rank %d: parameter %d[%d] = %v after the broadcast, rank 0 has %v", rank, i, j, v, bcast[0][i][j])
						}
					}
				}
			}
			for step := range steps {
				for i := range params {
					for j := range params[i].Numel() {
						var exact, S float64
						for rank := range n {
							if g := grads[rank][step][i]; g != nil {
								exact += float64(g[j]) / n
								S += math.Abs(float64(g[j])) / n
							}
						}
						for rank := range n {
							v := got[rank][step][i][j]
							if d := math.Abs(float64(v) - exact); d > hookBound(w.u, w.eta, n, S) {
								t.Fatalf("step %d rank %d parameter %d[%d] = %v, want %v", step, rank, i, j, v, exact)
							}
						}
					}
				}
			}
		})
	}
}

func bytesOf(s []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))
}

// float32Kernels are commtest.DeviceKernels that, like a GPU backend's, add and
// scale float32 only (comm.KernelSupporter), and panic for what they do
// not do, as a device's kernels do.
type float32Kernels struct{ commtest.DeviceKernels }

func (float32Kernels) Supports(op string, dt comm.DType) bool {
	switch op {
	case comm.OpAdd, comm.OpScale:
		return dt == comm.Float32
	}
	return true
}

func (k float32Kernels) Scale(b comm.Buffer, s float32) {
	if b.DType != comm.Float32 {
		panic(fmt.Sprintf("float32Kernels: Scale of %s", b.DType))
	}
	k.DeviceKernels.Scale(b, s)
}

// TestKernelSupportRefused: New refuses, on every rank, a parameter whose
// dtype needs a kernel that the pool's kernels do not do for it, naming
// the parameter, the rank and the dtype; what they do is accepted and
// reduced.
func TestKernelSupportRefused(t *testing.T) {
	testutil.NoLeak(t)
	f16 := Param{Name: "half.weight", Shape: []int{8}, DType: comm.Float16}
	bf16 := Param{Name: "bf.weight", Shape: []int{8}, DType: comm.BFloat16}
	f32 := Param{Name: "fc.weight", Shape: []int{8}}
	for _, tc := range []struct {
		name   string
		hook   func() hooks.Hook
		join   JoinMode
		params []Param
		refuse string // the parameter named, "" when accepted
		op     string
	}{
		{"allreduce/float16", hooks.AllReduce, JoinOff, []Param{f32, f16}, `parameter 1 ("half.weight") is half`, "hook allreduce needs Scale of half"},
		{"fp16/bfloat16", hooks.FP16, JoinOff, []Param{bf16, f32}, `parameter 0 ("bf.weight") is bfloat16`, "hook fp16 needs Scale of bfloat16"},
		{"avg/joinactive/float16", hooks.Avg, JoinActive, []Param{f16}, `parameter 0 ("half.weight") is half`, "JoinActive's rescaling needs Scale of half"},
		{"avg/float16", hooks.Avg, JoinOff, []Param{f32, f16, bf16}, "", ""},
		{"fp16/float32", hooks.FP16, JoinOff, []Param{f32}, "", ""},
		{"allreduce/float32", hooks.AllReduce, JoinActive, []Param{f32}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 2
			cs := newTestGroup(t, n)
			errs := runRanks(cs, func(rank int, c comm.Communicator) error {
				pool, err := allocator.New(allocator.Options{Source: commtest.NewDeviceSource()})
				if err != nil {
					return err
				}
				defer pool.Close()
				k := float32Kernels{commtest.DeviceKernels{Ordinal: 1}}
				r, err := New(context.Background(), commtest.DeviceComm{Communicator: c, Ordinal: 1}, tc.params, Options{Pool: pool, Kernels: k, Hook: tc.hook(), Join: tc.join})
				if err != nil {
					return err
				}
				defer r.Close()
				if err := r.Begin(Sync); err != nil {
					return err
				}
				for i := range tc.params {
					if err := r.Ready(i); err != nil {
						return err
					}
				}
				return r.Wait(context.Background())
			})
			for rank, err := range errs {
				if tc.refuse == "" {
					if err != nil {
						t.Errorf("rank %d: %v", rank, err)
					}
					continue
				}
				want := fmt.Sprintf("rank %d: %s", rank, tc.refuse)
				if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tc.op) {
					t.Errorf("rank %d: New: %v; want ErrUnsupported naming %q and %q", rank, err, want, tc.op)
				}
			}
		})
	}
}
