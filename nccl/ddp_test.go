//go:build cgo

package nccl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
)

// TestReducer runs ddp's Reducer over two communicators on devices 0 and
// 1 with device pools (Source): the Reducer's Buffers must carry each
// rank's device, and the gradients are written and read through the
// kernels only. A configuration the device kernels cannot reduce (float16
// gradients under the allreduce hook, which scales them over more than
// one rank) is refused by New on both ranks, naming the parameter, the
// rank and the dtype; one rank scales nothing, so it is not refused.
func TestReducer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hook   func() hooks.Hook
		dtype  comm.DType
		refuse bool
	}{
		{"avg", hooks.Avg, comm.Float32, false},
		{"fp16", hooks.FP16, comm.Float32, false},
		{"allreduce/float16", hooks.AllReduce, comm.Float16, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := groupSize(2)
			cs := newGroup(t, n, nil)
			params := []ddp.Param{{Name: "w", Shape: []int{300}}, {Name: "v", Shape: []int{7}, DType: tc.dtype}}
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r, c := range cs {
				wg.Go(func() { errs[r] = reduceOnDevice(c, params, tc.hook()) })
			}
			wg.Wait()
			for r, err := range errs {
				switch {
				case (!tc.refuse || n == 1) && err != nil:
					t.Errorf("rank %d (device %d): %v", r, cs[r].Device(), err)
				case tc.refuse && n > 1 && (!errors.Is(err, ddp.ErrUnsupported) || !strings.Contains(err.Error(), fmt.Sprintf(`rank %d: parameter 1 ("v") is half`, r))):
					t.Errorf("rank %d: %v; want ErrUnsupported naming rank %d, parameter v and its dtype", r, err, r)
				}
			}
		})
	}
}

// reduceOnDevice runs two synced steps over c with a device pool: rank r
// uploads r+1 into every float32 gradient, and every rank must read back
// the average.
func reduceOnDevice(c *Comm, params []ddp.Param, h hooks.Hook) error {
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 64 << 20, SlabSize: 1 << 20})
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx := context.Background()
	r, err := ddp.New(ctx, c, params, ddp.Options{Pool: pool, Hook: h, BucketCap: 512, FirstBucketCap: 256})
	if err != nil {
		return err
	}
	defer r.Close()
	k := c.Kernels()
	n := c.Size()
	for step := range 2 {
		if err := r.Begin(ddp.Sync); err != nil {
			return err
		}
		for i, p := range params {
			g, err := r.GradBuffer(i)
			if err != nil {
				return err
			}
			if g.Device != c.Device() {
				return fmt.Errorf("parameter %d's gradient is on device %d, the rank's is %d", i, g.Device, c.Device())
			}
			if p.DType == comm.Float32 || p.DType == 0 {
				k.Upload(g, f32Bytes(fill(p.Numel(), float32(c.Rank()+1))))
			}
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		if err := r.Wait(ctx); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		g, err := r.GradBuffer(0)
		if err != nil {
			return err
		}
		out := make([]float32, params[0].Numel())
		k.Download(f32Bytes(out), g)
		want := float32(n+1) / 2
		for j, v := range out {
			if v != want {
				return fmt.Errorf("step %d: w[%d] = %v, want %v", step, j, v, want)
			}
		}
	}
	return k.Sync()
}

func fill(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func f32Bytes(s []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))
}

// TestBenchLaunched runs bench.Run as a launched job runs it, one call per
// rank with that rank's communicator alone (as two processes would), so
// each step's statistics cross the communicator in host memory between
// the Reducer's grouped, compressed all-reduces on device memory: several
// buckets, the rebuild after the first step, three warmup steps and then
// measured ones, every average checked.
func TestBenchLaunched(t *testing.T) {
	n := groupSize(2)
	if n < 2 {
		t.Skip("needs 2 devices")
	}
	params := make([]ddp.Param, 24)
	for i := range params {
		params[i] = ddp.Param{Name: fmt.Sprintf("p%d", i), Shape: []int{64, 1024}}
	}
	cs := newGroup(t, n, nil)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() {
			pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 1 << 30, SlabSize: 16 << 20})
			if err != nil {
				t.Error(err)
				return
			}
			defer pool.Close()
			res, err := bench.Run(t.Context(), bench.Config{Params: params, Comms: []comm.Communicator{c}, Pools: []*allocator.Pool{pool},
				BucketCap: 1 << 20, FirstBucketCap: 256 << 10, Hook: hooks.FP16, Steps: 4, Warmup: 3,
				Compute: bench.ComputeSleep, Rate: 24 * 64 * 1024 / 0.005, Timeout: 30 * time.Second})
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
				return
			}
			if res.Steps != 4 {
				t.Errorf("rank %d: %d steps measured, want 4", r, res.Steps)
			}
		})
	}
	wg.Wait()
}
