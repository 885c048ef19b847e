package ddp

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/models"
)

// loadManifest returns the parameters of a built-in model manifest
// (package models: name and shape of every parameter, in registration
// order).
func loadManifest(t testing.TB, name string) []Param {
	t.Helper()
	m, err := models.Builtin(name)
	if err != nil {
		t.Fatal(err)
	}
	ps := make([]Param, len(m.Params))
	for i, p := range m.Params {
		ps[i] = Param{Name: p.Name, Shape: p.Shape}
	}
	return ps
}

// pair is two ranks' Reducers driven in lockstep: rank 1 runs each step on
// its own goroutine when poked, so a step of the pair allocates nothing
// beyond what the Reducers do.
type pair struct {
	rs   [2]*Reducer // rs[1] is nil for a one-rank group
	cs   []comm.Communicator
	go1  chan bool // true: a Reducer step; false: the floor (bare all-reduces)
	done chan error
	quit chan struct{}
	// stepFn is the step both ranks run; nil means benchStep. Set it
	// before the first step.
	stepFn func(*Reducer) error
}

func newPair(t testing.TB, cs []comm.Communicator, params []Param, opts func() Options) *pair {
	t.Helper()
	p := &pair{cs: cs, go1: make(chan bool), done: make(chan error), quit: make(chan struct{})}
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		var err error
		p.rs[rank], err = New(context.Background(), c, params, opts())
		return err
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	if len(cs) == 1 {
		t.Cleanup(func() { p.rs[0].Close() })
		return p
	}
	go func() {
		for {
			select {
			case <-p.quit:
				return
			case step := <-p.go1:
				if step {
					p.done <- p.run(p.rs[1])
				} else {
					p.done <- floorStep(p.rs[1], p.cs[1])
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(p.quit)
		p.rs[0].Close()
		p.rs[1].Close()
	})
	return p
}

// benchStep is one synced step with negligible backward compute: the
// gradients are marked ready in reverse registration order, as backward
// produces them; one element per gradient is written.
func benchStep(r *Reducer) error {
	if err := r.Begin(Sync); err != nil {
		return err
	}
	for i := len(r.params) - 1; i >= 0; i-- {
		if g := mustGrad(r, i); len(g) > 0 {
			g[0] += 1
		}
		if err := r.Ready(i); err != nil {
			return err
		}
	}
	if err := r.Wait(context.Background()); err != nil {
		return err
	}
	return nil
}

// run is one step of r with the pair's step function.
func (p *pair) run(r *Reducer) error {
	if p.stepFn != nil {
		return p.stepFn(r)
	}
	return benchStep(r)
}

// writeStep is benchStep with every element of every gradient written:
// add, as accumulating backward does after a zeroing Begin, or, with
// assign, overwrite (what NoZeroGrad requires of the first step of a
// window).
func writeStep(assign bool) func(*Reducer) error {
	return func(r *Reducer) error {
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := len(r.params) - 1; i >= 0; i-- {
			g := mustGrad(r, i)
			if assign {
				for j := range g {
					g[j] = 1
				}
			} else {
				for j := range g {
					g[j] += 1
				}
			}
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		return r.Wait(context.Background())
	}
}

// addGradStep is benchStep with every gradient given by AddGrad, from
// src[i].
func addGradStep(src [][]float32) func(*Reducer) error {
	return func(r *Reducer) error {
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := len(r.params) - 1; i >= 0; i-- {
			if err := r.AddGrad(i, src[i]); err != nil {
				return err
			}
		}
		return r.Wait(context.Background())
	}
}

func (p *pair) step() error {
	if p.rs[1] == nil {
		return p.run(p.rs[0])
	}
	p.go1 <- true
	err0 := p.run(p.rs[0])
	err1 := <-p.done
	if err0 != nil {
		return err0
	}
	return err1
}

// floorStep is what a step cannot beat: the bare all-reduce (Sum) of every
// bucket of r's layout, one after the other, without the Reducer.
func floorStep(r *Reducer, c comm.Communicator) error {
	for _, hb := range r.lay.Load().hb {
		if err := c.AllReduce(hb.Buf, hb.Buf, comm.Sum).Wait(context.Background()); err != nil {
			return err
		}
	}
	return nil
}

func (p *pair) floor() error {
	p.go1 <- false
	err0 := floorStep(p.rs[0], p.cs[0])
	err1 := <-p.done
	if err0 != nil {
		return err0
	}
	return err1
}

// TestStepAllocs asserts that a warm synced step allocates nothing on the
// Go heap, for every hook, on ResNet-50's parameters: with one rank on a
// communicator that allocates nothing itself (what the Reducer and the hooks
// do), and with two in-process ranks (the whole step).
func TestStepAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("ResNet-50 sized buckets")
	}
	testutil.NoLeak(t)
	params := loadManifest(t, "resnet50")
	for _, ranks := range allocRanks {
		for _, w := range wires {
			for _, noZero := range []bool{false, true} {
				t.Run(fmt.Sprintf("ranks=%d/%s/nozero=%v", ranks, w.name, noZero), func(t *testing.T) {
					var cs []comm.Communicator
					if ranks == 1 {
						cs = []comm.Communicator{commtest.Solo{}}
					} else {
						cs = newTestGroup(t, ranks)
					}
					p := newPair(t, cs, params, func() Options { return Options{Hook: w.hook(), NoZeroGrad: noZero} })
					for range 3 { // the first step rebuilds; the second adopts the new layout
						if err := p.step(); err != nil {
							t.Fatal(err)
						}
					}
					var err error
					allocs := testing.AllocsPerRun(5, func() {
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
				})
			}
		}
	}
}

// BenchmarkStepResNet50 measures a DDP step on ResNet-50's 161 parameter
// shapes, 2 ranks in process, negligible backward compute, 25 MiB buckets.
// It reports the median step time and allocations per step.
func BenchmarkStepResNet50(b *testing.B) {
	params := loadManifest(b, "resnet50")
	type variant struct {
		name string
		opts func() Options
		step func(*Reducer) error // nil: benchStep
	}
	src := make([][]float32, len(params))
	for i := range src {
		src[i] = make([]float32, params[i].Numel())
		for j := range src[i] {
			src[i][j] = 1
		}
	}
	vs := []variant{{"default", func() Options { return Options{} }, nil}}
	// Backward writing whole gradients: adding after a zeroing Begin,
	// AddGrad, and assigning without zeroing (the floor of the three).
	vs = append(vs, variant{"default/add-all", func() Options { return Options{} }, writeStep(false)})
	vs = append(vs, variant{"default/addgrad", func() Options { return Options{} }, addGradStep(src)})
	vs = append(vs, variant{"nozero/assign-all", func() Options { return Options{NoZeroGrad: true} }, writeStep(true)})
	for _, w := range wires {
		vs = append(vs, variant{w.name + "/nozero", func() Options { return Options{Hook: w.hook(), NoZeroGrad: true} }, nil})
	}
	vs = append(vs, variant{"avg/zero", func() Options { return Options{Hook: hooks.Avg()} }, nil})
	// Uneven inputs on: one small all-reduce per step (the join flag).
	vs = append(vs, variant{"default/join", func() Options { return Options{Join: JoinWorld} }, nil})
	// The Reducer's own cost: a hook that only sums (no averaging), so
	// that step/floor compares the same collectives with and without the
	// Reducer around them.
	vs = append(vs, variant{"sumonly/nozero", func() Options { return Options{Hook: &sumHook{}, NoZeroGrad: true} }, nil})
	for _, v := range vs {
		b.Run(v.name, func(b *testing.B) {
			p := newPair(b, newTestGroup(b, 2), params, v.opts)
			p.stepFn = v.step
			for range 3 {
				if err := p.step(); err != nil {
					b.Fatal(err)
				}
			}
			// Each iteration times a step and, right after, the floor, so
			// that their ratio survives a machine whose load changes.
			times := make([]time.Duration, 0, 1<<16)
			floors := make([]time.Duration, 0, 1<<16)
			var ms0, ms1 runtime.MemStats
			var allocs uint64
			steps := 0
			for b.Loop() {
				runtime.ReadMemStats(&ms1)
				t0 := time.Now()
				if err := p.step(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				runtime.ReadMemStats(&ms0)
				allocs += ms0.Mallocs - ms1.Mallocs
				if err := p.floor(); err != nil {
					b.Fatal(err)
				}
				if len(times) < cap(times) {
					times = append(times, t1.Sub(t0))
					floors = append(floors, time.Since(t1))
				}
				steps++
			}
			slices.Sort(times)
			slices.Sort(floors)
			median, floor := times[len(times)/2], floors[len(floors)/2]
			b.ReportMetric(float64(median.Microseconds())/1000, "ms/step-median")
			b.ReportMetric(float64(floor.Microseconds())/1000, "ms/floor-median")
			b.ReportMetric(float64(median)/float64(floor), "step/floor")
			b.ReportMetric(float64(allocs)/float64(steps), "allocs/step")
			st := p.rs[0].Stats()
			b.ReportMetric(float64(st.Bytes)/float64(st.Comm.Seconds())/1e9, "GB/s-comm")
			b.ReportMetric(float64(len(st.Buckets)), "buckets")
		})
	}
}

// allocRanks are the group sizes TestStepAllocs runs: one rank on commtest.Solo
// (the Reducer and hooks alone) and two in-process ranks (the whole step).
var allocRanks = []int{1, 2}

// TestStepAllocsVariants asserts that no-sync accumulation, unused
// parameters (FindUnusedParameters, StaticGraph), CopyGrads, SetGrad and
// StatsInto allocate nothing either, on a communicator that allocates
// nothing itself.
func TestStepAllocsVariants(t *testing.T) {
	testutil.NoLeak(t)
	ctx := context.Background()
	g := make([]float32, threeParams[2].Numel())
	for _, tt := range []struct {
		name string
		o    func() Options
	}{
		{"find-unused", func() Options { return Options{FindUnusedParameters: true} }},
		{"static-graph", func() Options { return Options{StaticGraph: true} }},
		{"copy", func() Options { return Options{CopyGrads: true, FindUnusedParameters: true} }},
		{"nozero-fp16", func() Options { return Options{NoZeroGrad: true, FindUnusedParameters: true, Hook: hooks.FP16()} }},
		{"shard-fp16", func() Options { return Options{Shard: ShardElements, FindUnusedParameters: true, Hook: hooks.FP16()} }},
		{"shard-values", func() Options { return Options{Shard: ShardParams, FindUnusedParameters: true} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(ctx, commtest.Solo{}, threeParams, tt.o())
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var st StepStats
			var stepErr error
			values := zeroValues(threeParams)
			if tt.name == "shard-values" {
				for i := range values {
					if values[i], err = r.Values(i); err != nil {
						t.Fatal(err)
					}
				}
			}
			step := func() {
				for _, synced := range []bool{false, true} {
					if err := r.Begin(modeOf(synced)); err != nil {
						stepErr = err
						return
					}
					if err := r.SetGrad(2, g); err != nil { // parameter 1 stays unused
						stepErr = err
						return
					}
					if err := r.Ready(0); err != nil {
						stepErr = err
						return
					}
				}
				if err := r.Wait(ctx); err != nil {
					stepErr = err
					return
				}
				if r.o.Shard != ShardOff {
					for k := range r.lay.Load().buckets {
						if err := r.Gather(k, values); err != nil {
							stepErr = err
							return
						}
					}
					if err := r.WaitGather(ctx); err != nil {
						stepErr = err
						return
					}
				}
				r.StatsInto(&st)
			}
			for range 3 {
				step()
			}
			allocs := testing.AllocsPerRun(10, step)
			if stepErr != nil {
				t.Fatal(stepErr)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per step, want 0", allocs)
			}
			if len(st.Unused) != 1 || st.Unused[0] != 1 {
				t.Errorf("Unused = %v, want [1]", st.Unused)
			}
		})
	}
}

// sumHook all-reduces a bucket with Sum and nothing else: not an average,
// only a way to measure what the Reducer adds around the collectives.
type sumHook struct{ c comm.Communicator }

func (*sumHook) Name() string                                      { return "sumonly" }
func (*sumHook) Wire(dt comm.DType) comm.DType                     { return dt }
func (*sumHook) Scratch(int, comm.DType) int                       { return 0 }
func (h *sumHook) Setup(c comm.Communicator, _ comm.Kernels) error { h.c = c; return nil }
func (*sumHook) Finish(*hooks.Bucket) error                        { return nil }
func (*sumHook) Close() error                                      { return nil }
func (h *sumHook) Launch(b *hooks.Bucket) (comm.Work, error) {
	b.WireBytes = int64(b.Buf.Bytes())
	return h.c.AllReduce(b.Buf, b.Buf, comm.Sum), nil
}

// sgdState is one rank's optimizer state: weights and momentum.
type sgdState struct{ w, v [][]float32 }

func newSGDState(params []Param) *sgdState {
	s := &sgdState{w: make([][]float32, len(params)), v: make([][]float32, len(params))}
	for i, p := range params {
		s.w[i], s.v[i] = make([]float32, p.Numel()), make([]float32, p.Numel())
	}
	return s
}

// update is SGD with momentum and weight decay on parameter i.
func (s *sgdState) update(r *Reducer, i int) error {
	g, err := r.Grad(i)
	if err != nil {
		return err
	}
	w, v := s.w[i], s.v[i]
	const lr, mu, wd = 0.1, 0.9, 1e-4
	for j := range g {
		v[j] = mu*v[j] + g[j] + wd*w[j]
		w[j] -= lr * v[j]
	}
	return nil
}

// optimizerStep is benchStep followed by the optimizer over every
// parameter: after Wait, or, with overlap, bucket by bucket from WaitEach
// while later buckets are still being reduced. It records how long the
// wait and the optimizer took when timed is set.
func optimizerStep(states map[*Reducer]*sgdState, overlap bool, timed *[2]time.Duration) func(*Reducer) error {
	return func(r *Reducer) error {
		st := states[r]
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := len(r.params) - 1; i >= 0; i-- {
			if g, err := r.Grad(i); err != nil {
				return err
			} else if len(g) > 0 {
				g[0] += 1
			}
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		if overlap {
			var uerr error
			err := r.WaitEach(context.Background(), func(b Reduced) {
				for _, p := range b.Params {
					if err := st.update(r, p); err != nil && uerr == nil {
						uerr = err
					}
				}
			})
			if err != nil {
				return err
			}
			return uerr
		}
		t0 := time.Now()
		if err := r.Wait(context.Background()); err != nil {
			return err
		}
		t1 := time.Now()
		for i := range r.params {
			if err := st.update(r, i); err != nil {
				return err
			}
		}
		if timed != nil && r.Rank() == 0 {
			timed[0], timed[1] = t1.Sub(t0), time.Since(t1)
		}
		return nil
	}
}

// BenchmarkOptimizerOverlap measures WaitEach on ResNet-50's parameters,
// 2 ranks in process: an SGD step with momentum and weight decay run after
// Wait (sequential) and bucket by bucket from WaitEach (overlap),
// alternating in one loop. It reports both medians and their ratio, and,
// from the sequential step, the median time spent waiting for the
// reduction and in the optimizer.
//
// On "inproc" the reduction is the ranks' own memory traffic, which
// competes with the optimizer for the same cores. On "link" each
// all-reduce also crosses a simulated link (wireComm), as it crosses a
// network whose adapter moves the data while the cores are free; the
// link's speed is set, from a measurement of the optimizer, so that one
// step's transfers take as long as its optimizer.
func BenchmarkOptimizerOverlap(b *testing.B) {
	params := loadManifest(b, "resnet50")
	for _, link := range []bool{false, true} {
		name := "inproc"
		if link {
			name = "link"
		}
		b.Run(name, func(b *testing.B) {
			cs := newTestGroup(b, 2)
			var wires []*wireComm
			if link {
				for r, c := range cs {
					w := &wireComm{Communicator: c, ops: map[uint64]*wireOp{}}
					wires, cs[r] = append(wires, w), w
				}
			}
			p := newPair(b, cs, params, func() Options { return Options{} })
			states := map[*Reducer]*sgdState{p.rs[0]: newSGDState(params), p.rs[1]: newSGDState(params)}
			var timed [2]time.Duration
			seq, ovl := optimizerStep(states, false, &timed), optimizerStep(states, true, nil)
			var warm []time.Duration
			for j, f := range []func(*Reducer) error{seq, ovl, seq, ovl, seq, seq, seq} { // through the rebuild
				p.stepFn = f
				if err := p.step(); err != nil {
					b.Fatal(err)
				}
				if j >= 4 {
					warm = append(warm, timed[1])
				}
			}
			if link {
				var bytes int
				for _, bi := range p.rs[0].Buckets() {
					bytes += bi.Bytes
				}
				slices.Sort(warm)
				for _, w := range wires {
					w.setLink(bytes, warm[len(warm)/2])
				}
			}
			var seqs, ovls, waits, opts []time.Duration
			for b.Loop() {
				p.stepFn = seq
				t0 := time.Now()
				if err := p.step(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				p.stepFn = ovl
				if err := p.step(); err != nil {
					b.Fatal(err)
				}
				seqs, ovls = append(seqs, t1.Sub(t0)), append(ovls, time.Since(t1))
				waits, opts = append(waits, timed[0]), append(opts, timed[1])
			}
			median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
			s, o := median(seqs), median(ovls)
			b.ReportMetric(float64(s.Microseconds())/1000, "ms/step-sequential")
			b.ReportMetric(float64(o.Microseconds())/1000, "ms/step-overlap")
			b.ReportMetric(float64(o)/float64(s), "overlap/sequential")
			b.ReportMetric(float64(median(waits).Microseconds())/1000, "ms/wait")
			b.ReportMetric(float64(median(opts).Microseconds())/1000, "ms/optimizer")
			b.ReportMetric(float64(len(p.rs[0].Buckets())), "buckets")
		})
	}
}

// wireComm delays the completion of each all-reduce of its communicator
// until its bytes have crossed a simulated link of a set speed, one
// transfer at a time from the moment it is issued, as a network adapter
// moves data while the cores are free (and at least until the in-process
// reduction, which computes the result, has completed). Other collectives
// pass through.
type wireComm struct {
	comm.Communicator
	mu   sync.Mutex
	ns   float64 // per byte; 0 until setLink: no delay
	free time.Time
	seq  uint64
	ops  map[uint64]*wireOp
}

type wireOp struct {
	done chan struct{}
	err  error
}

// setLink sets the link's speed so that bytes take d.
func (c *wireComm) setLink(bytes int, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ns = float64(d) / float64(bytes)
}

func (c *wireComm) Capabilities() comm.Caps { return comm.CapsOf(c.Communicator) }

func (c *wireComm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	inner := c.Communicator.AllReduce(send, recv, op)
	o := &wireOp{done: make(chan struct{})}
	c.mu.Lock()
	c.seq++
	id := c.seq
	c.ops[id] = o
	start := time.Now()
	if c.free.After(start) {
		start = c.free
	}
	c.free = start.Add(time.Duration(c.ns * float64(send.Bytes())))
	end := c.free
	c.mu.Unlock()
	go func() {
		err := inner.Wait(context.Background())
		time.Sleep(time.Until(end))
		o.err = err
		close(o.done)
	}()
	return comm.NewWork(c, id)
}

func (c *wireComm) op(id uint64) *wireOp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[id]
}

func (c *wireComm) WaitOp(ctx context.Context, id uint64) error {
	o := c.op(id)
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *wireComm) TestOp(id uint64) (bool, error) {
	o := c.op(id)
	select {
	case <-o.done:
		return true, o.err
	default:
		return false, nil
	}
}
