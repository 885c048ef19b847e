package ddp

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestPowerSGDAcrossRebuild trains three ranks' PowerSGD steps, compressed
// from the first, once with the rebuild of the buckets after the first
// step (the ready order, not the registration order, lays them out anew)
// and once with KeepLayout: the hook keeps its errors and Qs per
// parameter, so both runs must give the same gradients, bit for bit, at
// every step, on every rank.
func TestPowerSGDAcrossRebuild(t *testing.T) {
	testutil.NoLeak(t)
	params := []Param{
		{Name: "conv", Shape: []int{16, 8, 3, 3}}, {Name: "bn", Shape: []int{16}},
		{Name: "fc1", Shape: []int{64, 32}}, {Name: "b1", Shape: []int{64}},
		{Name: "fc2", Shape: []int{10, 64}}, {Name: "b2", Shape: []int{10}},
	}
	const n, steps = 3, 5
	// Ready order: an interleaving that differs from the reverse of
	// registration, so that the rebuilt buckets hold other parameters.
	order := []int{2, 5, 0, 4, 1, 3}
	run := func(keep bool) (out [][][]float32, gens []uint64, layouts [][]BucketInfo) {
		cs := newTestGroup(t, n)
		out = make([][][]float32, n)
		gens = make([]uint64, n)
		layouts = make([][]BucketInfo, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for rank, c := range cs {
			wg.Go(func() {
				ctx := context.Background()
				o := hooks.DefaultPowerSGDOptions()
				o.Rank, o.StartIter = 2, 0
				r, err := New(ctx, c, params, Options{Hook: hooks.PowerSGD(o), BucketCap: 4000, FirstBucketCap: 2000, KeepLayout: keep})
				if err != nil {
					errs[rank] = err
					return
				}
				defer r.Close()
				rng := rand.New(rand.NewPCG(uint64(rank), 1))
				for range steps {
					if err := r.Begin(Sync); err != nil {
						errs[rank] = err
						return
					}
					for _, i := range order {
						g, err := r.Grad(i)
						if err != nil {
							errs[rank] = err
							return
						}
						for j := range g {
							g[j] = float32(rng.NormFloat64())
						}
						if err := r.Ready(i); err != nil {
							errs[rank] = err
							return
						}
					}
					if err := r.Wait(ctx); err != nil {
						errs[rank] = err
						return
					}
					var all []float32
					for i := range params {
						all = append(all, mustGrad(r, i)...)
					}
					out[rank] = append(out[rank], all)
				}
				gens[rank] = r.Generation()
				layouts[rank] = r.Buckets()
			})
		}
		wg.Wait()
		for rank, err := range errs {
			if err != nil {
				t.Fatalf("KeepLayout %v: rank %d: %v", keep, rank, err)
			}
		}
		return out, gens, layouts
	}
	rebuilt, gens, lay := run(false)
	kept, keptGens, keptLay := run(true)
	if gens[0] != 2 || keptGens[0] != 1 || slices.EqualFunc(lay[0], keptLay[0], func(a, b BucketInfo) bool { return slices.Equal(a.Params, b.Params) }) {
		t.Fatalf("generations %d and %d, layouts %v and %v: want the first run's buckets rebuilt, the second's kept", gens[0], keptGens[0], lay[0], keptLay[0])
	}
	for rank := range n {
		for s := range steps {
			for i, v := range rebuilt[rank][s] {
				if w := kept[0][s][i]; math.Float32bits(v) != math.Float32bits(w) {
					t.Fatalf("step %d, rank %d, element %d: %g with the rebuilt buckets, %g with the kept ones (rank 0)", s, rank, i, v, w)
				}
			}
		}
	}
	// And compression happened: PowerSGD's rank-2 average is not the mean.
	if fmt.Sprint(rebuilt[0][steps-1][:4]) == "[0 0 0 0]" {
		t.Fatal("zero gradients")
	}
}

// TestPowerSGDStepAllocs: a warm PowerSGD step of two in-process ranks
// allocates nothing on the Go heap (the hook's goroutine and its Works
// included).
func TestPowerSGDStepAllocs(t *testing.T) {
	testutil.NoLeak(t)
	params := []Param{
		{Name: "conv", Shape: []int{32, 16, 3, 3}}, {Name: "bn", Shape: []int{32}},
		{Name: "fc", Shape: []int{64, 288}}, {Name: "b", Shape: []int{64}},
	}
	p := newPair(t, newTestGroup(t, 2), params, func() Options {
		o := hooks.DefaultPowerSGDOptions()
		o.Rank, o.StartIter = 4, 0
		return Options{Hook: hooks.PowerSGD(o), BucketCap: 20000, FirstBucketCap: 10000}
	})
	for range 4 {
		if err := p.step(); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	allocs := testing.AllocsPerRun(20, func() {
		if e := p.step(); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("%v allocations per warm step, want 0", allocs)
	}
}
