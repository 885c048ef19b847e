package ddp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// runRanks runs f on every rank concurrently and returns the errors by rank.
func runRanks(cs []comm.Communicator, f func(rank int, c comm.Communicator) error) []error {
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}

func firstErr(errs []error) error {
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// hookBound is the error bound of hooks' documentation for one element:
// S is sum_r |g_r| / n, u the unit roundoff of the wire type and eta half
// its smallest subnormal.
func hookBound(u, eta float64, n int, S float64) float64 {
	a := u + 2*0x1p-24
	k := float64(n - 1)
	gamma := k * u / (1 - k*u)
	return (a+gamma*(1+a))*S + 2*float64(n)*eta
}

type wire struct {
	name   string
	hook   func() hooks.Hook
	u, eta float64
}

var wires = []wire{
	{"avg", hooks.Avg, 0x1p-24, 0x1p-150},
	{"allreduce", hooks.AllReduce, 0x1p-24, 0x1p-150},
	{"fp16", hooks.FP16, 0x1p-11, 0x1p-25},
	{"bf16", hooks.BF16, 0x1p-8, 0x1p-134},
}

// trainResult is what one rank saw while training.
type trainResult struct {
	local   [][][]float32 // per step, per parameter: the rank's own gradient
	reduced [][][]float32 // per step, per parameter: Grad after Wait
	weights [][]float32
	layouts [][]BucketInfo // before the first step, after the last
	stats   []StepStats
}

type trainConfig struct {
	n, steps   int
	opts       func() Options
	concurrent bool // mark ready from two goroutines
	setGrad    bool // use SetGrad instead of Grad+Ready
}

// train runs data-parallel SGD on m with the batch split into n contiguous
// shards, marking gradients ready in a different random order every step.
func train(t *testing.T, cs []comm.Communicator, cfg trainConfig, m *mlp, xs, ys [][]float32) []trainResult {
	t.Helper()
	n := len(cs)
	res := make([]trainResult, n)
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		ctx := context.Background()
		mine := m.clone()
		r, err := New(ctx, c, mine.params(), cfg.opts())
		if err != nil {
			return err
		}
		defer r.Close()
		out := &res[rank]
		out.layouts = append(out.layouts, r.Buckets())
		per := len(xs) / n
		rng := rand.New(rand.NewPCG(uint64(rank), 7))
		for step := range cfg.steps {
			g := mine.grads(xs[rank*per:(rank+1)*per], ys[rank*per:(rank+1)*per])
			if err := r.Begin(Sync); err != nil {
				return err
			}
			order := rng.Perm(len(g))
			mark := func(ps []int) error {
				for _, p := range ps {
					if cfg.setGrad {
						if err := r.SetGrad(p, g[p]); err != nil {
							return err
						}
						continue
					}
					copy(mustGrad(r, p), g[p])
					if err := r.Ready(p); err != nil {
						return err
					}
				}
				return nil
			}
			if cfg.concurrent {
				var e2 error
				var wg sync.WaitGroup
				wg.Go(func() { e2 = mark(order[len(order)/2:]) })
				err = mark(order[:len(order)/2])
				wg.Wait()
				err = errors.Join(err, e2)
			} else {
				err = mark(order)
			}
			if err != nil {
				return err
			}
			if err := r.Wait(ctx); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			red := make([][]float32, len(g))
			for p := range g {
				red[p] = slices.Clone(mustGrad(r, p))
			}
			var st StepStats
			r.StatsInto(&st)
			out.local = append(out.local, g)
			out.reduced = append(out.reduced, red)
			out.stats = append(out.stats, st)
			mine.sgd(red, 0.1)
		}
		out.layouts = append(out.layouts, r.Buckets())
		out.weights = mine.w
		return r.Close()
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	return res
}

func smallOpts(h func() hooks.Hook, mod func(*Options)) func() Options {
	return func() Options {
		o := Options{BucketCap: 128, FirstBucketCap: 64, Hook: h(), Timeout: time.Minute}
		if mod != nil {
			mod(&o)
		}
		return o
	}
}

// TestEquivalence trains with N ranks on shards and compares with one rank
// on the whole batch: float32 within 1e-6 relative (norm per parameter), the
// half-precision hooks within the derived per-element bound of the exact
// average of what the ranks contributed.
func TestEquivalence(t *testing.T) {
	testutil.NoLeak(t)
	rng := rand.New(rand.NewPCG(1, 2))
	m := newMLP(rng, 5, 7, 3)
	xs, ys := randomData(rng, 24, 5, 3)
	const steps = 4

	// The reference: one rank, the whole batch.
	ref := m.clone()
	var refGrads [][][]float32
	for range steps {
		g := ref.grads(xs, ys)
		refGrads = append(refGrads, g)
		ref.sgd(g, 0.1)
	}

	for n := 1; n <= 4; n++ {
		for _, w := range wires {
			for _, v := range []struct {
				name string
				mod  func(*Options)
				cfg  trainConfig
			}{
				{"view", nil, trainConfig{}},
				{"view-nozero", func(o *Options) { o.NoZeroGrad = true }, trainConfig{}},
				{"view-keep", func(o *Options) { o.KeepLayout = true }, trainConfig{concurrent: true}},
				{"copy", func(o *Options) { o.CopyGrads = true }, trainConfig{concurrent: true}},
				{"copy-setgrad", func(o *Options) { o.CopyGrads = true }, trainConfig{setGrad: true}},
			} {
				t.Run(fmt.Sprintf("n=%d/%s/%s", n, w.name, v.name), func(t *testing.T) {
					cfg := v.cfg
					cfg.n, cfg.steps, cfg.opts = n, steps, smallOpts(w.hook, v.mod)
					cs := newTestGroup(t, n)
					res := train(t, cs, cfg, m, xs, ys)
					checkTraining(t, w, res, refGrads, ref)
				})
			}
		}
	}
}

func checkTraining(t *testing.T, w wire, res []trainResult, refGrads [][][]float32, ref *mlp) {
	t.Helper()
	n := len(res)
	for r := 1; r < n; r++ {
		for s := range res[r].reduced {
			for p := range res[r].reduced[s] {
				if !slices.Equal(res[r].reduced[s][p], res[0].reduced[s][p]) {
					t.Fatalf("step %d parameter %d: rank %d's reduced gradient differs from rank 0's", s, p, r)
				}
			}
		}
	}
	for s := range res[0].reduced {
		for p := range res[0].reduced[s] {
			got := res[0].reduced[s][p]
			for i := range got {
				var exact, S float64
				for r := range res {
					v := float64(res[r].local[s][p][i])
					exact += v / float64(n)
					S += math.Abs(v) / float64(n)
				}
				if d, b := math.Abs(float64(got[i])-exact), hookBound(w.u, w.eta, n, S); d > b {
					t.Fatalf("step %d param %d elem %d: got %g, exact average %g: error %g > bound %g", s, p, i, got[i], exact, d, b)
				}
			}
			if w.name == "allreduce" || w.name == "avg" {
				if e := relErr(got, refGrads[s][p]); e > 1e-6 {
					t.Errorf("step %d param %d: gradient differs from the single-rank full batch by %g relative", s, p, e)
				}
			}
		}
	}
	if w.name == "allreduce" || w.name == "avg" {
		for p := range ref.w {
			if e := relErr(res[0].weights[p], ref.w[p]); e > 1e-6 {
				t.Errorf("param %d: weights differ from single-rank training by %g relative", p, e)
			}
		}
	}
	st := res[0].stats[len(res[0].stats)-1]
	var wantBytes int64
	for _, g := range res[0].local[0] {
		wantBytes += int64(len(g)) * 4
	}
	if w.name == "fp16" || w.name == "bf16" {
		wantBytes /= 2
	}
	if st.Bytes != wantBytes {
		t.Errorf("Stats.Bytes = %d, want %d", st.Bytes, wantBytes)
	}
}

// TestRebuild checks that the first synced step rebuilds the buckets from
// rank 0's ready order, every rank adopts the same layout at the next Begin,
// Grad keeps the reduced values until then, and results match a run that
// keeps the initial layout.
func TestRebuild(t *testing.T) {
	testutil.NoLeak(t)
	rng := rand.New(rand.NewPCG(3, 4))
	m := newMLP(rng, 5, 7, 3)
	xs, ys := randomData(rng, 12, 5, 3)
	run := func(keep bool) []trainResult {
		cs := newTestGroup(t, 3)
		cfg := trainConfig{n: 3, steps: 3, opts: smallOpts(hooks.AllReduce, func(o *Options) { o.KeepLayout = keep })}
		return train(t, cs, cfg, m, xs, ys)
	}
	rebuilt, kept := run(false), run(true)
	for r := range rebuilt {
		if !slices.EqualFunc(rebuilt[r].layouts[1], rebuilt[0].layouts[1], bucketInfoEqual) {
			t.Fatalf("rank %d adopted a different layout from rank 0", r)
		}
		if !slices.EqualFunc(kept[r].layouts[1], kept[r].layouts[0], bucketInfoEqual) {
			t.Fatalf("KeepLayout: layout changed")
		}
	}
	if slices.EqualFunc(rebuilt[0].layouts[0], rebuilt[0].layouts[1], bucketInfoEqual) {
		t.Fatalf("layout not rebuilt: %v", rebuilt[0].layouts[0])
	}
	for s := range kept[0].reduced {
		for p := range kept[0].reduced[s] {
			if e := relErr(rebuilt[0].reduced[s][p], kept[0].reduced[s][p]); e > 1e-6 {
				t.Errorf("step %d param %d: rebuilt and kept layouts differ by %g", s, p, e)
			}
		}
	}
}

func bucketInfoEqual(a, b BucketInfo) bool {
	return a.Bytes == b.Bytes && slices.Equal(a.Params, b.Params)
}

// TestRebuildKeepsValues checks the view-validity rule around a rebuild:
// after the first Wait, Grad still returns the reduced values (and slices
// taken during the step agree); the new layout arrives at the next Begin.
func TestRebuildKeepsValues(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	params := []Param{{Name: "a", Shape: []int{16}}, {Name: "b", Shape: []int{16}}, {Name: "c", Shape: []int{16}}}
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		ctx := context.Background()
		r, err := New(ctx, c, params, Options{BucketCap: 64, FirstBucketCap: 64})
		if err != nil {
			return err
		}
		defer r.Close()
		before := r.Buckets()
		if err := r.Begin(Sync); err != nil {
			return err
		}
		views := make([][]float32, len(params))
		for _, p := range []int{0, 2, 1} { // not the initial (reverse) order
			views[p] = mustGrad(r, p)
			for i := range views[p] {
				views[p][i] = float32(100*p + i + rank)
			}
			if err := r.Ready(p); err != nil {
				return err
			}
		}
		if err := r.Wait(ctx); err != nil {
			return err
		}
		for p := range params {
			g := mustGrad(r, p)
			for i := range g {
				want := float32(100*p+i) + 0.5
				if g[i] != want || views[p][i] != want {
					return fmt.Errorf("param %d elem %d after Wait: Grad %g, view %g, want %g", p, i, g[i], views[p][i], want)
				}
			}
		}
		if err := r.Begin(Sync); err != nil {
			return err
		}
		after := r.Buckets()
		if slices.EqualFunc(before, after, bucketInfoEqual) {
			return fmt.Errorf("layout not rebuilt: %v", after)
		}
		if want := []int{0, 2, 1}; !slices.Equal(after[0].Params, want[:len(after[0].Params)]) {
			return fmt.Errorf("rebuilt layout %v does not follow the ready order", after)
		}
		for p := range params {
			if g := mustGrad(r, p); slices.ContainsFunc(g, func(v float32) bool { return v != 0 }) {
				return fmt.Errorf("param %d not zero after Begin: %v", p, g)
			}
		}
		for p := range params {
			if err := r.Ready(p); err != nil {
				return err
			}
		}
		return r.Wait(ctx)
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestNoSync checks that no-sync steps accumulate locally and the next
// synced step reduces the accumulated sum.
func TestNoSync(t *testing.T) {
	testutil.NoLeak(t)
	for _, copyGrads := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copyGrads), func(t *testing.T) {
			const n = 3
			cs := newTestGroup(t, n)
			params := []Param{{Name: "w", Shape: []int{4, 5}}, {Name: "b", Shape: []int{5}}}
			local := func(rank, micro, p, i int) float32 {
				return float32(math.Sin(float64(1000*rank+100*micro+10*p+i))) * 3
			}
			errs := runRanks(cs, func(rank int, c comm.Communicator) error {
				ctx := context.Background()
				r, err := New(ctx, c, params, Options{CopyGrads: copyGrads, BucketCap: 32, FirstBucketCap: 32})
				if err != nil {
					return err
				}
				defer r.Close()
				for step := range 2 { // the second round checks zeroing after a synced step
					acc := [][]float32{make([]float32, 20), make([]float32, 5)}
					for micro := range 3 {
						if err := r.Begin(modeOf(micro == 2)); err != nil {
							return err
						}
						for p := range params {
							g := mustGrad(r, p)
							for i := range g {
								v := local(rank, micro+step, p, i)
								g[i] += v
								acc[p][i] += v
							}
							if err := r.Ready(p); err != nil {
								return err
							}
						}
						if micro < 2 {
							for p := range params {
								if !slices.Equal(mustGrad(r, p), acc[p]) {
									return fmt.Errorf("no-sync step %d: param %d holds %v, want the local sum %v", micro, p, mustGrad(r, p), acc[p])
								}
							}
						}
					}
					if err := r.Wait(ctx); err != nil {
						return err
					}
					for p := range params {
						g := mustGrad(r, p)
						for i := range g {
							var exact float64
							for q := range n {
								var s float32
								for micro := range 3 {
									s += local(q, micro+step, p, i)
								}
								exact += float64(s) / n
							}
							if d := math.Abs(float64(g[i]) - exact); d > 1e-6*math.Max(1, math.Abs(exact)) {
								return fmt.Errorf("step %d param %d elem %d: %g, want %g", step, p, i, g[i], exact)
							}
						}
					}
				}
				st := r.Stats()
				if !st.Sync || st.Step != 6 {
					return fmt.Errorf("stats of step %d sync=%v, want step 6 synced", st.Step, st.Sync)
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestConcurrentReady marks many parameters from many goroutines per rank,
// across rebuilds and no-sync steps, and checks every average.
func TestConcurrentReady(t *testing.T) {
	testutil.NoLeak(t)
	const n, np, workers = 4, 64, 8
	params := make([]Param, np)
	for i := range params {
		params[i] = Param{Name: fmt.Sprintf("p%d", i), Shape: []int{1 + i%7, 3}}
	}
	cs := newTestGroup(t, n)
	val := func(rank, step, p, j int) float32 { return float32(rank*1000 + step*100 + p + j) }
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		ctx := context.Background()
		r, err := New(ctx, c, params, Options{BucketCap: 200, FirstBucketCap: 40})
		if err != nil {
			return err
		}
		defer r.Close()
		rng := rand.New(rand.NewPCG(uint64(rank), 5))
		for step := range 8 {
			synced := step%3 != 1 // every third step is a no-sync step, accumulated into the next
			if err := r.Begin(modeOf(synced)); err != nil {
				return err
			}
			order := rng.Perm(np)
			errc := make(chan error, workers)
			for w := range workers {
				go func() {
					for _, p := range order[w*np/workers : (w+1)*np/workers] {
						g := mustGrad(r, p)
						for j := range g {
							g[j] += val(rank, step, p, j)
						}
						if err := r.Ready(p); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
			}
			for range workers {
				if err := <-errc; err != nil {
					return err
				}
			}
			if !synced {
				continue
			}
			if err := r.Wait(ctx); err != nil {
				return err
			}
			for p := range params {
				for j, v := range mustGrad(r, p) {
					var want float64
					for q := range n {
						want += float64(val(q, step, p, j)) / n
						if step%3 == 2 {
							want += float64(val(q, step-1, p, j)) / n
						}
					}
					if math.Abs(float64(v)-want) > 1e-6*want {
						return fmt.Errorf("step %d param %d elem %d: %v, want %v", step, p, j, v, want)
					}
				}
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// mustGrad is Grad for tests whose calls are valid: it panics on an error.
func mustGrad(r *Reducer, i int) []float32 {
	g, err := r.Grad(i)
	if err != nil {
		panic(err)
	}
	return g
}

// mustGradBuffer is GradBuffer for tests whose calls are valid.
func mustGradBuffer(r *Reducer, i int) comm.Buffer {
	b, err := r.GradBuffer(i)
	if err != nil {
		panic(err)
	}
	return b
}

// modeOf is Sync for true, NoSync for false.
func modeOf(sync bool) SyncMode {
	if sync {
		return Sync
	}
	return NoSync
}
