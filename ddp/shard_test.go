package ddp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/bucket"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/trace"
)

// shardParams have element counts that no bucket cap below divides
// evenly among 2, 3 or 4 ranks (77 elements in all).
var shardParams = []Param{
	{Name: "l1.weight", Shape: []int{7, 5}},
	{Name: "l1.bias", Shape: []int{5}},
	{Name: "l2.weight", Shape: []int{3, 7}},
	{Name: "l2.bias", Shape: []int{3}},
	{Name: "head", Shape: []int{13}},
}

// shardGrad is rank's gradient of parameter p at step, a function of the
// parameter's values, so that any difference between two runs grows.
func shardGrad(w []float32, rank, step, p int) []float32 {
	g := make([]float32, len(w))
	for j, v := range w {
		g[j] = float32(math.Sin(float64(v)*float64(rank+1)+float64(step)+float64(j)*0.37)) * float32(1+p%3)
	}
	return g
}

// elementwise is an optimizer written for the test: it steps the elements
// [Lo, Hi) of a parameter, keeping state for those elements only.
type elementwise interface {
	step(pt Part, w, g []float32)
}

// momentumSGD is SGD with momentum (PyTorch's: buf = μ·buf + g; w -= lr·buf).
type momentumSGD struct {
	lr, mu float32
	buf    map[Part][]float32
}

func (o *momentumSGD) step(pt Part, w, g []float32) {
	b, ok := o.buf[pt]
	if !ok {
		b = make([]float32, len(w))
		o.buf[pt] = b
	}
	for j := range w {
		b[j] = o.mu*b[j] + g[j]
		w[j] -= o.lr * b[j]
	}
}

// adam is Adam with bias correction, in float32.
type adam struct {
	lr, b1, b2, eps float32
	t               map[Part]int
	m, v            map[Part][]float32
}

func newAdam() *adam {
	return &adam{lr: 0.01, b1: 0.9, b2: 0.999, eps: 1e-8, t: map[Part]int{}, m: map[Part][]float32{}, v: map[Part][]float32{}}
}

func (o *adam) step(pt Part, w, g []float32) {
	m, v := o.m[pt], o.v[pt]
	if m == nil {
		m, v = make([]float32, len(w)), make([]float32, len(w))
		o.m[pt], o.v[pt] = m, v
	}
	o.t[pt]++
	t := float64(o.t[pt])
	c1 := float32(1 - math.Pow(float64(o.b1), t))
	c2 := float32(1 - math.Pow(float64(o.b2), t))
	for j := range w {
		m[j] = o.b1*m[j] + (1-o.b1)*g[j]
		v[j] = o.b2*v[j] + (1-o.b2)*g[j]*g[j]
		mh, vh := m[j]/c1, v[j]/c2
		w[j] -= o.lr * mh / (float32(math.Sqrt(float64(vh))) + o.eps)
	}
}

// shardRun is how a training run steps its optimizer.
type shardRun uint8

const (
	runPlain    shardRun = iota // no Shard: Wait, then step every parameter
	runEach                     // Shard: step and Gather inside WaitEach
	runAfter                    // Shard: Wait, then step and Gather each bucket
	runReversed                 // Shard: Wait, then Gather the buckets last to first
)

// shardVariant is what a training step does besides the synced step.
type shardVariant struct {
	micro  bool // a no-sync step first, which the synced step accumulates onto
	unused int  // a parameter never marked (FindUnusedParameters); 0: none
	// values keeps the parameters in the Reducer's memory (Values):
	// valuesAll every one, so the buckets are gathered in place there;
	// valuesSome the odd ones, so every bucket with an even one is copied
	// (in shardParams' buckets an odd one comes first, so a Gather that
	// looked at a bucket's first parameter only would take it for Values').
	values valuesUse
}

// valuesUse says which parameters a sharded run keeps in Values' memory.
type valuesUse uint8

const (
	valuesNone valuesUse = iota
	valuesAll
	valuesSome
)

// shardTrain trains shardParams for steps on every rank of a new group of
// n and returns every rank's values.
func shardTrain(t *testing.T, n, steps int, run shardRun, mode ShardMode, opt func() elementwise, o func() Options, v shardVariant) [][][]float32 {
	t.Helper()
	cs := newTestGroup(t, n)
	out := make([][][]float32, n)
	init := rand.New(rand.NewPCG(3, 4))
	start := make([][]float32, len(shardParams))
	for i, p := range shardParams {
		start[i] = make([]float32, p.Numel())
		for j := range start[i] {
			start[i][j] = float32(init.NormFloat64())
		}
	}
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		ctx := context.Background()
		opts := o()
		if run != runPlain {
			opts.Shard = mode
		}
		r, err := New(ctx, c, shardParams, opts)
		if err != nil {
			return err
		}
		defer r.Close()
		values := make([][]float32, len(start))
		for i := range start {
			values[i] = slices.Clone(start[i])
			if run == runPlain || v.values == valuesNone || (v.values == valuesSome && i%2 == 0) {
				continue
			}
			if values[i], err = r.Values(i); err != nil {
				return err
			}
			copy(values[i], start[i])
		}
		o := opt()
		stepBucket := func(k int, owned []Part) error {
			for _, pt := range owned {
				g, err := r.Grad(pt.Param)
				if err != nil {
					return err
				}
				o.step(pt, values[pt.Param][pt.Lo:pt.Hi], g[pt.Lo:pt.Hi])
			}
			return r.Gather(k, values)
		}
		for s := range steps {
			for _, micro := range []bool{true, false} {
				if micro && !v.micro {
					continue
				}
				if err := r.Begin(modeOf(!micro)); err != nil {
					return err
				}
				for i := len(shardParams) - 1; i >= 0; i-- {
					if v.unused != 0 && i == v.unused {
						continue
					}
					if err := r.AddGrad(i, shardGrad(values[i], rank, 2*s+boolInt(micro), i)); err != nil {
						return err
					}
				}
			}
			switch run {
			case runPlain:
				if err := r.Wait(ctx); err != nil {
					return err
				}
				for i := range values {
					g, err := r.Grad(i)
					if err != nil {
						return err
					}
					o.step(Part{Param: i, Lo: 0, Hi: len(g)}, values[i], g)
				}
				continue
			case runEach:
				var stepErr error
				err := r.WaitEach(ctx, func(b Reduced) {
					if err := stepBucket(b.Bucket, b.Owned); err != nil && stepErr == nil {
						stepErr = err
					}
				})
				if err != nil {
					return err
				}
				if stepErr != nil {
					return stepErr
				}
			case runAfter, runReversed:
				if err := r.Wait(ctx); err != nil {
					return err
				}
				nb := len(r.Buckets())
				for j := range nb {
					k := j
					if run == runReversed {
						k = nb - 1 - j
					}
					if err := stepBucket(k, r.Owned(k)); err != nil {
						return err
					}
				}
			}
			if err := r.WaitGather(ctx); err != nil {
				return err
			}
		}
		out[rank] = make([][]float32, len(values))
		for i := range values {
			out[rank][i] = slices.Clone(values[i]) // Values' memory goes back to the pool at Close
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestShardEquivalence trains with sharded optimizer state and without,
// on 1 to 4 ranks, and wants the same bits: the reduce-scatter leaves
// each rank the bits the all-reduce leaves in its part (the same
// elementwise reduction, in the same rank order), the optimizers are
// elementwise, and the gather copies bits.
func TestShardEquivalence(t *testing.T) {
	testutil.NoLeak(t)
	const steps = 4
	opts := []struct {
		name string
		opt  func() elementwise
	}{
		{"momentum", func() elementwise { return &momentumSGD{lr: 0.05, mu: 0.9, buf: map[Part][]float32{}} }},
		{"adam", func() elementwise { return newAdam() }},
	}
	cases := []struct {
		name string
		hook func() hooks.Hook
		caps [2]int // first, rest: 44 bytes is 11 elements, prime
		run  shardRun
		mode ShardMode
		mod  func(*Options)
		v    shardVariant
	}{
		{"avg/each", hooks.Avg, [2]int{44, 88}, runEach, ShardElements, nil, shardVariant{}},
		{"avg/after", hooks.Avg, [2]int{44, 88}, runAfter, ShardElements, nil, shardVariant{}},
		{"avg/reversed", hooks.Avg, [2]int{44, 88}, runReversed, ShardElements, nil, shardVariant{}},
		{"avg/one-bucket", hooks.Avg, [2]int{1 << 20, 1 << 20}, runEach, ShardElements, nil, shardVariant{}},
		{"allreduce/each", hooks.AllReduce, [2]int{44, 88}, runEach, ShardElements, nil, shardVariant{}},
		{"fp16/each", hooks.FP16, [2]int{44, 88}, runEach, ShardElements, nil, shardVariant{}},
		{"bf16/after", hooks.BF16, [2]int{44, 88}, runAfter, ShardElements, nil, shardVariant{}},
		{"avg/params", hooks.Avg, [2]int{44, 88}, runEach, ShardParams, nil, shardVariant{}},
		{"fp16/params-one-bucket", hooks.FP16, [2]int{1 << 20, 1 << 20}, runAfter, ShardParams, nil, shardVariant{}},
		{"avg/no-sync", hooks.Avg, [2]int{44, 88}, runEach, ShardElements, nil, shardVariant{micro: true}},
		{"fp16/unused-copy", hooks.FP16, [2]int{44, 88}, runEach, ShardElements, func(o *Options) { o.FindUnusedParameters, o.CopyGrads = true, true }, shardVariant{unused: 3}},
		{"avg/static-nozero", hooks.Avg, [2]int{44, 88}, runAfter, ShardElements, func(o *Options) { o.StaticGraph, o.NoZeroGrad = true, true }, shardVariant{unused: 1}},
		{"avg/each-values", hooks.Avg, [2]int{44, 88}, runEach, ShardElements, nil, shardVariant{values: valuesAll}},
		{"fp16/params-values-copy-unused", hooks.FP16, [2]int{44, 88}, runEach, ShardParams, func(o *Options) { o.FindUnusedParameters, o.CopyGrads = true, true }, shardVariant{unused: 3, values: valuesAll}},
		{"avg/some-values", hooks.Avg, [2]int{44, 88}, runAfter, ShardElements, nil, shardVariant{values: valuesSome}},
	}
	for n := 1; n <= 4; n++ {
		for _, op := range opts {
			for _, c := range cases {
				t.Run(fmt.Sprintf("n=%d/%s/%s", n, op.name, c.name), func(t *testing.T) {
					o := func() Options {
						o := Options{FirstBucketCap: c.caps[0], BucketCap: c.caps[1], Hook: c.hook(), KeepLayout: true, Timeout: time.Minute}
						if c.mod != nil {
							c.mod(&o)
						}
						return o
					}
					want := shardTrain(t, n, steps, runPlain, ShardOff, op.opt, o, c.v)
					got := shardTrain(t, n, steps, c.run, c.mode, op.opt, o, c.v)
					for rank := range n {
						for i := range want[rank] {
							if j := firstDiff(got[rank][i], want[rank][i]); j >= 0 {
								t.Fatalf("rank %d parameter %d (%q) element %d: sharded %v, unsharded %v", rank, i, shardParams[i].Name, j, got[rank][i][j], want[rank][i][j])
							}
						}
					}
					if moved := !slices.Equal(bitsOf(want[0][0]), bitsOf(shardTrain(t, n, 0, runPlain, ShardOff, op.opt, o, c.v)[0][0])); !moved {
						t.Fatal("training did not change the parameters: the comparison proves nothing")
					}
				})
			}
		}
	}
}

// firstDiff returns the first index where a and b differ in their bits,
// or -1.
func firstDiff(a, b []float32) int {
	for j := range a {
		if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
			return j
		}
	}
	return -1
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func bitsOf(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for j, x := range v {
		b[j] = math.Float32bits(x)
	}
	return b
}

// TestShardPartition checks that every element of every parameter is
// owned by exactly one rank, that each rank's share of a bucket is within
// the bound its mode promises, and that ShardParams owns whole
// parameters.
func TestShardPartition(t *testing.T) {
	testutil.NoLeak(t)
	for n := 1; n <= 4; n++ {
		for _, mode := range []ShardMode{ShardElements, ShardParams} {
			t.Run(fmt.Sprintf("n=%d/%v", n, mode), func(t *testing.T) {
				cs := newTestGroup(t, n)
				owned := make([][][]Part, n)
				var layout []BucketInfo
				errs := withReducers(t, cs, shardParams, func() Options {
					return Options{FirstBucketCap: 44, BucketCap: 88, Shard: mode}
				}, func(rank int, r *Reducer) error {
					mine := r.Buckets()
					if rank == 0 {
						layout = mine
					}
					for k := range mine {
						owned[rank] = append(owned[rank], r.Owned(k))
					}
					if r.Owned(len(mine)) != nil || r.Owned(-1) != nil {
						return fmt.Errorf("Owned out of range is not nil")
					}
					return nil
				})
				if err := firstErr(errs); err != nil {
					t.Fatal(err)
				}
				count := make([][]int, len(shardParams))
				for i, p := range shardParams {
					count[i] = make([]int, p.Numel())
				}
				for k, b := range layout {
					elems, largest := 0, 0
					for _, p := range b.Params {
						elems += shardParams[p].Numel()
						largest = max(largest, shardParams[p].Numel())
					}
					for rank := range n {
						share := 0
						for _, pt := range owned[rank][k] {
							if !slices.Contains(b.Params, pt.Param) || pt.Lo >= pt.Hi {
								t.Fatalf("rank %d bucket %d: part %+v", rank, k, pt)
							}
							if mode == ShardParams && (pt.Lo != 0 || pt.Hi != shardParams[pt.Param].Numel()) {
								t.Errorf("rank %d bucket %d: ShardParams part %+v is not a whole parameter", rank, k, pt)
							}
							for j := pt.Lo; j < pt.Hi; j++ {
								count[pt.Param][j]++
							}
							share += pt.Hi - pt.Lo
						}
						limit := (elems + n - 1) / n // ShardElements: 1/N, rounded up
						if mode == ShardParams {
							limit = elems/n + largest
						}
						if share > limit {
							t.Errorf("rank %d bucket %d: owns %d of %d elements, above %d", rank, k, share, elems, limit)
						}
					}
				}
				for i, c := range count {
					for j, v := range c {
						if v != 1 {
							t.Fatalf("parameter %d element %d owned by %d ranks", i, j, v)
						}
					}
				}
			})
		}
	}
}

// TestShardErrors covers the refusals and the misuse of the sharded step.
func TestShardErrors(t *testing.T) {
	testutil.NoLeak(t)
	ctx := context.Background()
	t.Run("powersgd", func(t *testing.T) {
		cs := newTestGroup(t, 2)
		errs := withReducers(t, cs, shardParams, func() Options {
			o := hooks.DefaultPowerSGDOptions()
			return Options{Shard: ShardElements, Hook: hooks.PowerSGD(o)}
		}, func(int, *Reducer) error { return nil })
		for _, err := range errs {
			wantErr(t, err, ErrOptions, "Options.Shard", "powersgd")
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		cs := newTestGroup(t, 2)
		errs := withReducers(t, cs, shardParams, func() Options { return Options{} }, func(int, *Reducer) error { return nil })
		if firstErr(errs) != nil {
			t.Fatal(firstErr(errs))
		}
		errs = runRanks(cs, func(rank int, c comm.Communicator) error {
			o := Options{KeepLayout: true}
			if rank == 1 {
				o.Shard = ShardElements
			}
			r, err := New(ctx, c, shardParams, o)
			if err == nil {
				r.Close()
			}
			return err
		})
		for _, err := range errs {
			wantErr(t, err, ErrParamMismatch, "Shard ShardOff", "Shard ShardElements")
		}
	})
	t.Run("misuse", func(t *testing.T) {
		cs := newTestGroup(t, 1)
		r, err := New(ctx, cs[0], shardParams, Options{Shard: ShardElements, FirstBucketCap: 44, BucketCap: 88})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		values := zeroValues(shardParams)
		wantErr(t, r.Gather(0, values), ErrNoStep)
		wantErr(t, r.WaitGather(ctx), ErrNoStep)
		if err := r.Begin(Sync); err != nil {
			t.Fatal(err)
		}
		wantErr(t, r.WaitGather(ctx), ErrStepInProgress, "call Wait")
		for i := range shardParams {
			if err := r.SetGrad(i, values[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		wantErr(t, r.Begin(Sync), ErrStepInProgress, "WaitGather")
		wantErr(t, r.Wait(ctx), ErrStepInProgress, "WaitGather")
		wantErr(t, r.Gather(99, values), ErrIndex)
		wantErr(t, r.Gather(0, values[:1]), ErrGradSize)
		if err := r.Gather(0, values); err != nil {
			t.Fatal(err)
		}
		wantErr(t, r.Gather(0, values), ErrGather, "already")
		p := r.Buckets()[0].Params[0]
		if _, err := r.Grad(p); err == nil {
			t.Fatal("Grad of a published bucket's parameter succeeded")
		} else {
			wantErr(t, err, ErrBusy, "WaitGather")
		}
		wantErr(t, r.WaitGather(ctx), ErrGather, "not gathered")
		for k := 1; k < len(r.Buckets()); k++ {
			if err := r.Gather(k, values); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.WaitGather(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Begin(Sync); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("values", func(t *testing.T) {
		cs := newTestGroup(t, 1)
		r, err := New(ctx, cs[0], shardParams, Options{Shard: ShardElements, FirstBucketCap: 44, BucketCap: 88})
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Values(len(shardParams))
		wantErr(t, err, ErrIndex, "Values(5)")
		_, err = r.Values(-1)
		wantErr(t, err, ErrIndex)
		v, err := r.Values(2)
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := r.Values(2); len(v) != shardParams[2].Numel() || &again[0] != &v[0] {
			t.Fatalf("Values(2): %d elements, then another slice; want %d, the same", len(v), shardParams[2].Numel())
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = r.Values(2)
		wantErr(t, err, ErrClosed)
	})
	t.Run("off", func(t *testing.T) {
		cs := newTestGroup(t, 1)
		r, err := New(ctx, cs[0], shardParams, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		wantErr(t, r.Gather(0, zeroValues(shardParams)), ErrOptions, "Options.Shard")
		wantErr(t, r.WaitGather(ctx), ErrOptions, "Options.Shard")
		_, err = r.Values(0)
		wantErr(t, err, ErrOptions, "Options.Shard")
		if r.Owned(0) != nil {
			t.Fatal("Owned without Shard is not nil")
		}
	})
}

// countComm counts the collectives a rank issues, by kind, and keeps the
// receive buffers of its all-gathers.
type countComm struct {
	comm.Communicator
	allReduce, reduceScatter, allGather int
	gathers                             []comm.Buffer
}

func (c *countComm) Capabilities() comm.Caps { return comm.CapsOf(c.Communicator) }
func (c *countComm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	c.allReduce++
	return c.Communicator.AllReduce(send, recv, op)
}
func (c *countComm) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	c.reduceScatter++
	return c.Communicator.ReduceScatter(send, recv, op)
}
func (c *countComm) AllGather(send, recv comm.Buffer) comm.Work {
	c.allGather++
	c.gathers = append(c.gathers, recv)
	return c.Communicator.AllGather(send, recv)
}

// TestShardValuesInPlace checks where the all-gathers of a sharded step
// land: in Values' memory when Gather is given those slices (nothing to
// copy in or out), in the bucket when it is given slices of the caller's.
func TestShardValuesInPlace(t *testing.T) {
	testutil.NoLeak(t)
	for _, own := range []bool{true, false} {
		cs := newTestGroup(t, 2)
		counted := make([]comm.Communicator, len(cs))
		for r, c := range cs {
			counted[r] = &countComm{Communicator: c}
		}
		errs := withReducers(t, counted, shardParams, func() Options {
			return Options{FirstBucketCap: 44, BucketCap: 88, Shard: ShardElements}
		}, func(rank int, r *Reducer) error {
			ctx := context.Background()
			values := zeroValues(shardParams)
			if own {
				for i := range values {
					var err error
					if values[i], err = r.Values(i); err != nil {
						return err
					}
				}
			}
			c := counted[rank].(*countComm)
			c.gathers = c.gathers[:0] // New's check
			if err := gatherStep(ctx, r, values, func(i int) []float32 { return shardGrad(values[i], rank, 0, i) }); err != nil {
				return err
			}
			bs := r.Buckets()
			if len(c.gathers) != len(bs) {
				return fmt.Errorf("rank %d: %d all-gathers for %d buckets", rank, len(c.gathers), len(bs))
			}
			for k, b := range bs {
				recv := c.gathers[k]
				lo, hi := uintptr(recv.Addr), uintptr(recv.Addr)+uintptr(recv.Bytes())
				p := b.Params[0]
				at := uintptr(unsafe.Pointer(unsafe.SliceData(values[p])))
				if in := lo <= at && at < hi; in != own {
					return fmt.Errorf("rank %d bucket %d: all-gather into [%#x, %#x), parameter %d's values at %#x: inside %v, want %v (Values given: %v)",
						rank, k, lo, hi, p, at, in, own, own)
				}
			}
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
	}
}

// gatherStep takes one synced sharded step: grad(i) is parameter i's
// gradient, each bucket is gathered from values as soon as it is
// reduced, and WaitGather ends the step.
func gatherStep(ctx context.Context, r *Reducer, values [][]float32, grad func(i int) []float32) error {
	if err := r.Begin(Sync); err != nil {
		return err
	}
	for i := range values {
		if err := r.SetGrad(i, grad(i)); err != nil {
			return err
		}
	}
	var gathered error
	if err := r.WaitEach(ctx, func(b Reduced) { gathered = cmp.Or(gathered, r.Gather(b.Bucket, values)) }); err != nil {
		return err
	}
	if gathered != nil {
		return gathered
	}
	return r.WaitGather(ctx)
}

// TestShardCollectives checks that a sharded step reduce-scatters and
// all-gathers each bucket once, and all-reduces nothing: the bytes of one
// all-reduce, as the ring's reduce-scatter and all-gather halves.
func TestShardCollectives(t *testing.T) {
	testutil.NoLeak(t)
	for _, h := range []func() hooks.Hook{hooks.Avg, hooks.FP16} {
		cs := newTestGroup(t, 2)
		counted := make([]comm.Communicator, len(cs))
		for r, c := range cs {
			counted[r] = &countComm{Communicator: c}
		}
		const steps = 2
		var buckets int
		errs := withReducers(t, counted, shardParams, func() Options {
			return Options{FirstBucketCap: 44, BucketCap: 88, Shard: ShardElements, Hook: h()}
		}, func(rank int, r *Reducer) error {
			ctx := context.Background()
			values := zeroValues(shardParams)
			if rank == 0 {
				buckets = len(r.Buckets())
			}
			c := counted[rank].(*countComm)
			c.allReduce, c.allGather = 0, 0 // New's check
			for range steps {
				if err := gatherStep(ctx, r, values, func(i int) []float32 { return values[i] }); err != nil {
					return err
				}
			}
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
		for r, c := range counted {
			c := c.(*countComm)
			if c.allReduce != 0 || c.reduceScatter != steps*buckets || c.allGather != steps*buckets {
				t.Errorf("rank %d: %d all-reduces, %d reduce-scatters, %d all-gathers in %d steps of %d buckets",
					r, c.allReduce, c.reduceScatter, c.allGather, steps, buckets)
			}
		}
	}
}

// TestShardMemoryResNet50 measures the optimizer state per rank that
// Options.Shard leaves Adam (two float32s per owned element) on
// ResNet-50's parameters, in the Reducer's initial layout with the
// default bucket caps (and with 1 MiB and 4 MiB buckets), for 2, 4 and 8
// ranks, from the partition the Reducer computes (place, ownedParts)
// without allocating the buckets. It asserts each mode's bound on the
// state: ShardElements within 1/N plus one element per bucket,
// ShardParams within 1/N plus the model's largest parameter; and on the
// bytes each rank sends a bucket (its block): 1/N of the bucket plus one
// element, or plus the bucket's largest parameter. go test -run
// TestShardMemoryResNet50 -v prints them with the bytes on the wire
// against the all-reduce's.
func TestShardMemoryResNet50(t *testing.T) {
	params := loadManifest(t, "resnet50")
	tensors := make([]bucket.Tensor, len(params))
	total, largest := 0, 0
	for i, p := range params {
		tensors[i] = bucket.Tensor{Numel: p.Numel(), DType: comm.Float32}
		total += p.Numel()
		largest = max(largest, p.Numel())
	}
	rev := make([]int, len(params))
	for i := range rev {
		rev[i] = len(params) - 1 - i
	}
	const adam = 2 * 4 // bytes of state per element
	t.Logf("ResNet-50: %d parameters, %d elements (the largest %d); Adam's state unsharded: %d bytes a rank", len(params), total, largest, adam*total)
	for _, caps := range [][]int{{DefaultFirstBucketCap, DefaultBucketCap}, {1 << 20, 1 << 20}, {1 << 20, 4 << 20}} {
		bs, err := bucket.Assign(tensors, caps, rev)
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range []ShardMode{ShardElements, ShardParams} {
			for _, n := range []int{2, 4, 8} {
				owned := make([]int, n) // place's running shares
				mine := make([]int, n)  // ownedParts' count
				lo, hi := make([]int, len(params)), make([]int, len(params))
				wire, slack := 0, largest
				for k, b := range bs {
					offs, per := place(b, tensors, n, mode, owned)
					wire += n * per
					elems, big := 0, 0
					for _, p := range b.Tensors {
						elems += tensors[p].Numel
						big = max(big, tensors[p].Numel)
					}
					if mode == ShardElements {
						big = 1
					}
					if per > (elems+n-1)/n+big {
						t.Errorf("%v, %d ranks, caps %v: bucket %d of %d elements has blocks of %d, above 1/N + %d", mode, n, caps, k, elems, per, big)
					}
					for rank := range n {
						for _, pt := range ownedParts(b, tensors, offs, rank, per, lo, hi) {
							mine[rank] += pt.Hi - pt.Lo
						}
					}
				}
				if mode == ShardElements {
					slack = len(bs)
				} else if !slices.Equal(owned, mine) {
					t.Errorf("%v, %d ranks, caps %v: place counted %v elements a rank, ownedParts %v", mode, n, caps, owned, mine)
				}
				worst := slices.Max(mine)
				limit := total/n + slack
				t.Logf("%v, %d ranks, %d buckets (caps %v): at most %d bytes a rank (%.4f of unsharded; 1/N = %.4f), bound %d; %.4fx the all-reduce's elements on the wire",
					mode, n, len(bs), caps, adam*worst, float64(worst)/float64(total), 1/float64(n), adam*limit, float64(wire)/float64(total))
				if worst > limit {
					t.Errorf("%v, %d ranks, caps %v: a rank owns %d of %d elements, above %d", mode, n, caps, worst, total, limit)
				}
			}
		}
	}
}

// TestShardJoin trains with uneven inputs (rank r takes batches[r]
// steps, then joins) sharded, the joined ranks stepping and gathering
// their parts in JoinEach, and unsharded, the joined ranks idle and the
// model broadcast from the rank Join returns at the end: every rank of
// the sharded run must end with the unsharded run's final bits, since
// each element's owner, joined or not, steps it with the same averages
// that an active rank steps it with unsharded.
func TestShardJoin(t *testing.T) {
	testutil.NoLeak(t)
	for _, mode := range []JoinMode{JoinWorld, JoinActive} {
		for _, batches := range [][]int{{2, 4}, {3, 5, 4}, {1, 3, 3, 2}} {
			for _, h := range []func() hooks.Hook{hooks.Avg, hooks.FP16} {
				n := len(batches)
				name := fmt.Sprintf("%v/%v/%s", mode, batches, h().Name())
				o := func() Options {
					return Options{FirstBucketCap: 44, BucketCap: 88, Hook: h(), KeepLayout: true, Join: mode, Timeout: time.Minute}
				}
				want := shardJoinTrain(t, batches, false, o)
				got := shardJoinTrain(t, batches, true, o)
				for rank := range n {
					for i := range want[rank] {
						if j := firstDiff(got[rank][i], want[rank][i]); j >= 0 {
							t.Fatalf("%s: rank %d parameter %d element %d: sharded %v, unsharded %v", name, rank, i, j, got[rank][i][j], want[rank][i][j])
						}
					}
				}
			}
		}
	}
}

// shardJoinTrain runs TestShardJoin's training with Adam, sharded or not,
// and returns every rank's values.
func shardJoinTrain(t *testing.T, batches []int, shard bool, o func() Options) [][][]float32 {
	t.Helper()
	n := len(batches)
	cs := newTestGroup(t, n)
	out := make([][][]float32, n)
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		ctx := context.Background()
		opts := o()
		if shard {
			opts.Shard = ShardElements
		}
		r, err := New(ctx, c, shardParams, opts)
		if err != nil {
			return err
		}
		defer r.Close()
		values := make([][]float32, len(shardParams))
		for i, p := range shardParams {
			values[i] = make([]float32, p.Numel())
			for j := range values[i] {
				values[i][j] = float32(math.Cos(float64(7*i + j)))
			}
		}
		opt := newAdam()
		var stepErr error
		each := func(b Reduced) {
			for _, pt := range b.Owned {
				g, err := r.Grad(pt.Param)
				if err != nil {
					stepErr = cmp.Or(stepErr, err)
					return
				}
				opt.step(pt, values[pt.Param][pt.Lo:pt.Hi], g[pt.Lo:pt.Hi])
			}
			stepErr = cmp.Or(stepErr, r.Gather(b.Bucket, values))
		}
		for s := range batches[rank] {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := len(shardParams) - 1; i >= 0; i-- {
				if err := r.SetGrad(i, shardGrad(values[i], rank, s, i)); err != nil {
					return err
				}
			}
			if !shard {
				if err := r.Wait(ctx); err != nil {
					return err
				}
				for i := range values {
					g, err := r.Grad(i)
					if err != nil {
						return err
					}
					opt.step(Part{Param: i, Lo: 0, Hi: len(g)}, values[i], g)
				}
				continue
			}
			if err := cmp.Or(r.WaitEach(ctx, each), stepErr); err != nil {
				return err
			}
			if err := r.WaitGather(ctx); err != nil {
				return err
			}
		}
		if !shard {
			last, err := r.Join(ctx)
			if err != nil {
				return err
			}
			if err := r.Broadcast(ctx, last, float32Buffers(values)); err != nil {
				return err
			}
		} else {
			if _, err := r.JoinEach(ctx, each); err != nil {
				return err
			}
			if stepErr != nil {
				return stepErr
			}
		}
		out[rank] = make([][]float32, len(values))
		for i := range values {
			out[rank][i] = slices.Clone(values[i]) // Values' memory goes back to the pool at Close
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	return out
}

func float32Buffers(values [][]float32) []comm.Buffer {
	bufs := make([]comm.Buffer, len(values))
	for i, v := range values {
		bufs[i] = comm.Float32s(v)
	}
	return bufs
}

// TestShardGatherFails: a WaitGather whose gathers cannot complete (the
// peer has not gathered) ends with its context, naming the bucket,
// aborts the group so that the peer fails too instead of waiting, and
// Close returns every block (nothing leaks, nothing hangs).
func TestShardGatherFails(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	failed := make(chan struct{})
	errs := withReducers(t, cs, shardParams, func() Options {
		return Options{FirstBucketCap: 44, BucketCap: 88, Shard: ShardElements, Timeout: time.Minute}
	}, func(rank int, r *Reducer) error {
		values := zeroValues(shardParams)
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := range shardParams {
			if err := r.SetGrad(i, values[i]); err != nil {
				return err
			}
		}
		if err := r.Wait(context.Background()); err != nil {
			return err
		}
		if rank == 1 {
			<-failed // rank 0 has given up on its gathers
		} else {
			defer close(failed)
		}
		for k := range r.Buckets() {
			if err := r.Gather(k, values); err != nil {
				return err
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		if rank == 1 {
			defer cancel()
			return r.WaitGather(ctx)
		}
		cancel()
		err := r.WaitGather(ctx)
		if again := r.Begin(Sync); !errors.Is(again, context.Canceled) {
			return fmt.Errorf("the failure is not sticky: WaitGather: %v; then Begin: %v", err, again)
		}
		return err
	})
	wantErr(t, errs[0], context.Canceled, "gather of bucket 0")
	wantErr(t, errs[1], comm.ErrAborted)
}

// TestShardTimeline: a sharded step's timeline has a gather span per
// bucket on the gather lane.
func TestShardTimeline(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 1)
	r, err := New(context.Background(), cs[0], shardParams, Options{FirstBucketCap: 44, BucketCap: 88, Shard: ShardElements})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	values := zeroValues(shardParams)
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	for i := range shardParams {
		if err := r.SetGrad(i, values[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for k := range r.Buckets() {
		if err := r.Gather(k, values); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.WaitGather(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := r.Stats()
	for _, b := range s.Buckets {
		if b.GatherEnd <= b.GatherStart || b.GatherStart < b.Done || b.GatherBytes <= 0 {
			t.Errorf("bucket %d: gather [%v, %v] after done %v, %d bytes", b.Index, b.GatherStart, b.GatherEnd, b.Done, b.GatherBytes)
		}
	}
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{Start: s.Start.Add(-time.Second)})
	WriteTimeline(w, 0, &s, shardParams)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sum, _ := validTimeline(t, buf.Bytes())
	if names := laneNames(sum, 1); !slices.Contains(names, "gather") {
		t.Errorf("lanes %q lack %q", names, "gather")
	}
	if n := strings.Count(buf.String(), `"gather_bytes"`); n != len(s.Buckets) {
		t.Errorf("%d gather spans in the timeline, want %d", n, len(s.Buckets))
	}
}
