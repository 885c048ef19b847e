package ddptrain_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/sampler"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// TestShardMatchesUnsharded trains the least-squares problem over 1-4
// inproc ranks with SGD and Adam, with the optimizer sharded by
// whole variables (Options.Reducer.Shard = ShardParams) and by elements
// (ShardElements), and not, and checks that after every step every rank
// of a sharded run holds the unsharded run's weights and scalars (step
// counters, learning rate) bit for bit, that the optimizer state a
// sharded rank keeps has the unsharded run's bits (with ShardElements,
// its elements of each moment, checked after the last step), and that
// each element of each moment is kept by exactly one rank. inproc's
// reduce-scatter sums each element in its all-reduce's order, the hook
// does the same arithmetic in both, and GoMLX's SGD and Adam update each
// element from its own gradient and state alone: no bound is needed.
//
// It also measures the optimizer state each rank keeps: within each
// bucket a rank's share is at most 1/N of the bucket plus its largest
// variable (ShardParams) or plus one element (ShardElements), so a rank's
// state is at most 1/N of the unsharded state plus, per bucket, the state
// of the bucket's largest variable or of one element, plus the scalars
// (step counters, learning rate) that every rank keeps.
func TestShardMatchesUnsharded(t *testing.T) {
	const steps = 4
	p := newLSQ(steps, 3)
	layouts := []struct {
		name string
		o    ddptrain.Options
	}{{"small buckets", smallBuckets}, {"one bucket", ddptrain.Options{}}}
	for _, kind := range []string{"sgd", "adam"} {
		for _, n := range []int{1, 2, 3, 4} {
			for _, l := range layouts {
				t.Run(fmt.Sprintf("%s/%d ranks/%s", kind, n, l.name), func(t *testing.T) {
					plain := runCollect(t, p, kind, steps, n, l.o)
					for _, mode := range []ddp.ShardMode{ddp.ShardParams, ddp.ShardElements} {
						o := l.o
						o.Reducer.Shard = mode
						sharded := runCollect(t, p, kind, steps, n, o)
						checkSharded(t, mode, n, plain, sharded)
					}
				})
			}
		}
	}
}

// rankRun is what one rank of runCollect saw: its variables after each
// step, by scope and name (their bytes), which of them are optimizer
// state, and the Reducer's buckets.
type rankRun struct {
	steps   []map[string][]byte
	state   map[string]int    // optimizer-state variable: its bytes
	final   map[string][]byte // optimizer-state variable: its bits after the last step
	scalar  map[string]bool   // optimizer-state scalars (step counters, learning rate), which every rank keeps
	weights map[string]int    // trainable variable: its bytes
	owned   map[string]bool
	spans   map[string][2]int // trainable variable: the elements this rank owns (Reducer.Owned)
	buckets [][]string        // per bucket: its trainable variables
}

func runCollect(t *testing.T, p *lsq, kind string, steps, n int, o ddptrain.Options) []rankRun {
	t.Helper()
	comms, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(comms)
	backend := newBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runs := make([]rankRun, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			inputs, labels := p.tensors(0, p.n)
			ds, err := ddptrain.NewDataset("lsq", r, n, lsqBatch/n, inputs, labels, sampler.Options{DropLast: true})
			if err != nil {
				errs[r] = err
				return
			}
			mctx := mlctx.New()
			tr, err := ddptrain.New(c, backend, mctx, p.model(r), lsqLoss, optimizer(kind, 1), o)
			if err != nil {
				errs[r] = err
				return
			}
			defer tr.Close()
			for range steps {
				spec, in, lab, err := ds.Yield()
				if err == nil {
					_, err = tr.TrainStep(ctx, spec, in, lab)
				}
				if err != nil {
					errs[r] = err
					return
				}
				runs[r].steps = append(runs[r].steps, snapshot(mctx))
			}
			runs[r].state, runs[r].weights, runs[r].owned, runs[r].scalar = map[string]int{}, map[string]int{}, map[string]bool{}, map[string]bool{}
			runs[r].final, runs[r].spans = map[string][]byte{}, map[string][2]int{}
			for _, v := range tr.OptimizerState() {
				runs[r].state[v.ScopeAndName()] = int(v.Shape().Memory())
				runs[r].scalar[v.ScopeAndName()] = v.Shape().IsScalar()
				value, err := v.Value()
				if err != nil {
					errs[r] = err
					return
				}
				value.ConstBytes(func(b []byte) { runs[r].final[v.ScopeAndName()] = bytes.Clone(b) })
			}
			for _, v := range tr.Variables() {
				runs[r].weights[v.ScopeAndName()] = int(v.Shape().Memory())
			}
			for _, v := range tr.Owned() {
				runs[r].owned[v.ScopeAndName()] = true
			}
			names := tr.Reducer().Params()
			for k := range tr.Reducer().Buckets() {
				for _, pt := range tr.Reducer().Owned(k) {
					runs[r].spans[names[pt.Param].Name] = [2]int{pt.Lo, pt.Hi}
				}
			}
			for _, b := range tr.Reducer().Buckets() {
				var vars []string
				for _, i := range b.Params {
					if i < len(tr.Variables()) {
						vars = append(vars, names[i].Name)
					}
				}
				runs[r].buckets = append(runs[r].buckets, vars)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return runs
}

// snapshot returns the bytes of every variable of ctx but the
// random-number state, by scope and name.
func snapshot(ctx *mlctx.Context) map[string][]byte {
	out := map[string][]byte{}
	for v := range ctx.IterVariables() {
		if v.Name() == mlctx.RNGStateVariableName {
			continue
		}
		value, err := v.Value()
		if err != nil {
			panic(err)
		}
		value.ConstBytes(func(b []byte) { out[v.ScopeAndName()] = bytes.Clone(b) })
	}
	return out
}

func checkSharded(t *testing.T, mode ddp.ShardMode, n int, plain, sharded []rankRun) {
	t.Helper()
	ref := plain[0]
	last := ref.steps[len(ref.steps)-1]
	total, scalars := 0, 0
	for name, b := range ref.state {
		if _, trained := ref.weights[name]; trained {
			t.Fatalf("%s is both a variable and optimizer state", name)
		}
		if ref.scalar[name] {
			scalars += b
		} else {
			total += b
		}
	}
	kept := map[string]int{}
	for r, run := range sharded {
		for k, vals := range run.steps {
			for name, want := range ref.steps[k] {
				got, ok := vals[name]
				_, isState := ref.state[name]
				switch {
				case !ok && (!isState || ref.scalar[name]):
					t.Fatalf("%s: rank %d step %d: no variable %s", mode, r, k+1, name)
				case ok && !bytes.Equal(got, want):
					t.Fatalf("%s: rank %d step %d: %s differs from the unsharded run's", mode, r, k+1, name)
				}
			}
			for name := range vals {
				if _, ok := ref.steps[k][name]; !ok {
					t.Fatalf("%s: rank %d step %d: variable %s, which the unsharded run has not", mode, r, k+1, name)
				}
			}
		}
		mine := 0
		for name, b := range run.state {
			if run.scalar[name] {
				continue
			}
			mine += b
			if mode != ddp.ShardElements {
				kept[name] += b
				continue
			}
			// This rank's elements of a moment of variable v: the
			// unsharded moment's bits there.
			v := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(name, "/"+optimizers.AdamDefaultScope), "_1st_moment"), "_2nd_moment")
			span, ok := run.spans[v]
			switch {
			case v == "/ddptrain/placeholder" && len(run.spans) == 0:
				continue // a rank that owns no element steps the trainer's placeholder
			case !ok || last[name] == nil:
				t.Fatalf("%s: rank %d keeps %s, not the state of a variable it owns elements of", mode, r, name)
			case !bytes.Equal(run.final[name], last[name][4*span[0]:4*span[1]]):
				t.Fatalf("%s: rank %d: its elements [%d, %d) of %s differ from the unsharded run's", mode, r, span[0], span[1], name)
			}
			kept[name] += b
		}
		// The bound: 1/N of the unsharded state plus, per bucket, the
		// state of its largest variable or of one element (ref.state /
		// ref.weights is the optimizer's state per variable byte). With
		// ShardElements the trainer's status elements count in a
		// bucket's 1/N: one element more.
		perByte := float64(total) / float64(sum(ref.weights))
		bound := float64(total) / float64(n)
		for _, vars := range run.buckets {
			largest := 4
			if mode != ddp.ShardElements {
				for _, v := range vars {
					largest = max(largest, run.weights[v])
				}
			}
			bound += perByte * float64(largest)
		}
		if mode == ddp.ShardElements {
			bound += perByte * 4
		}
		if float64(mine) > bound {
			t.Errorf("%s: rank %d of %d keeps %d bytes of optimizer state (and %d of scalars); the unsharded run %d; bound %.0f", mode, r, n, mine, scalars, total, bound)
		}
		t.Logf("%s: rank %d of %d: %d bytes of optimizer state (%.3f of the unsharded %d; bound %.0f), %d of scalars; owns elements of %d of %d variables",
			mode, r, n, mine, float64(mine)/float64(max(total, 1)), total, bound, scalars, len(run.owned), len(run.weights))
	}
	for name, b := range ref.state {
		if !ref.scalar[name] && kept[name] != b {
			t.Errorf("%s: the ranks keep %d bytes of %s, the unsharded run %d: each element must be on exactly one rank", mode, kept[name], name, b)
		}
	}
}

func sum(m map[string]int) int {
	s := 0
	for _, b := range m {
		s += b
	}
	return s
}

// TestShardOptions: what the trainer cannot do with a sharded optimizer
// is refused, naming the option, and so is Save before the first step
// (there is no state to consolidate yet). With ShardElements, an
// optimizer that is not elementwise is refused at the first step: one
// that keeps a scalar of its own per variable, and GoMLX's clipping of
// non-finite gradients (clip_nan), which zeroes a whole variable's
// gradient.
func TestShardOptions(t *testing.T) {
	comms, err := inproc.NewGroup(1)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(comms)
	backend := newBackend(t)
	p := newLSQ(1, 1)
	clipNaN := mlctx.New()
	clipNaN.SetParam(optimizers.ParamClipNaN, true)
	for _, tc := range []struct {
		o    ddp.Options
		ctx  *mlctx.Context
		want string
	}{
		{ddp.Options{Shard: ddp.ShardElements}, clipNaN, optimizers.ParamClipNaN},
	} {
		_, err := ddptrain.New(comms[0], backend, tc.ctx, p.model(0), lsqLoss, optimizer("adam", 1), ddptrain.Options{Reducer: tc.o})
		if !errors.Is(err, ddptrain.ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrUnsupported naming %s", tc.o, err, tc.want)
		}
	}
	for _, mode := range []ddp.ShardMode{ddp.ShardParams, ddp.ShardElements} {
		tr, err := ddptrain.New(comms[0], backend, mlctx.New(), p.model(0), lsqLoss, optimizer("adam", 1), ddptrain.Options{Reducer: ddp.Options{Shard: mode}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Save(nil); !errors.Is(err, ddptrain.ErrUnsupported) {
			t.Errorf("Save with %s before the first step: %v, want ErrUnsupported", mode, err)
		}
		tr.Close()
	}
	tr, err := ddptrain.New(comms[0], backend, mlctx.New(), p.model(0), lsqLoss, normsOptimizer{optimizer("sgd", 1)}, ddptrain.Options{Reducer: ddp.Options{Shard: ddp.ShardElements}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	inputs, labels := p.tensors(0, lsqBatch)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := tr.TrainStep(ctx, nil, inputs, labels); !errors.Is(err, ddptrain.ErrUnsupported) || !strings.Contains(err.Error(), "norms") {
		t.Errorf("ShardElements with an optimizer that keeps a scalar per variable: %v, want ErrUnsupported naming its state", err)
	}
}

// normsOptimizer is SGD that also keeps the squared norm of each
// variable's gradient, in a scalar of its own per variable: not
// elementwise.
type normsOptimizer struct{ optimizers.Interface }

func (o normsOptimizer) UpdateGraphWithGradients(ctx *mlctx.Context, grads []*Node, lossDType dtypes.DType) {
	g := grads[0].Graph()
	var vars []*mlctx.Variable
	for v := range ctx.IterVariables() {
		if v.Trainable && v.InUseByGraph(g) {
			vars = append(vars, v)
		}
	}
	for i, v := range vars {
		norm := ctx.Checked(false).InAbsPath("/norms"+v.Scope()).VariableWithShape(v.Name(), shapes.Make(lossDType)).SetTrainable(false)
		norm.SetValueGraph(ReduceAllSum(Square(grads[i])))
	}
	o.Interface.(train.OptimizeWithGradients).UpdateGraphWithGradients(ctx, grads, lossDType)
}

// TestShardCheckpoint saves a checkpoint of a 2-rank Adam run with the
// optimizer sharded (Save consolidates the state on rank 0), by whole
// variables and by elements: it holds the bits of the checkpoint of the
// same run unsharded, every moment included, and no other variable.
// Resumed on 2 ranks sharded the same way, the next step gives the
// uninterrupted run's variables. Loaded into 3 ranks sharded the same
// way (on every rank) and into 1 unsharded rank, every rank holds the
// saved weights and scalars, and each element of each saved moment is
// on exactly one rank, with the saved bits (with ShardElements, in the
// trainer's state of that rank's elements: the caller's context holds
// none).
func TestShardCheckpoint(t *testing.T) {
	p := newLSQ(2, 6)
	_, want := saveCheckpoint(t, p)
	for _, mode := range []ddp.ShardMode{ddp.ShardParams, ddp.ShardElements} {
		t.Run(mode.String(), func(t *testing.T) { checkShardCheckpoint(t, p, mode, want) })
	}
}

func checkShardCheckpoint(t *testing.T, p *lsq, mode ddp.ShardMode, want map[string][]byte) {
	sharded := ddptrain.Options{Reducer: ddp.Options{Shard: mode}}
	dir := filepath.Join(t.TempDir(), "sharded")
	var after map[string][]byte // rank 0's variables after the step that follows the save
	onRanks(t, 2, func(ctx context.Context, c comm.Communicator) error {
		r := c.Rank()
		mctx := mlctx.New()
		tr, err := ddptrain.New(c, newBackend(t), mctx, p.model(r), lsqLoss, optimizer("adam", 1), sharded)
		if err != nil {
			return err
		}
		defer tr.Close()
		for k := range 2 {
			lo := k*lsqBatch + r*lsqBatch/2
			inputs, labels := p.tensors(lo, lo+lsqBatch/2)
			if _, err := tr.TrainStep(ctx, nil, inputs, labels); err != nil {
				return err
			}
		}
		var h *checkpoints.Handler
		if r == 0 {
			if h, err = checkpoints.Build(mctx).Dir(dir).Done(); err != nil {
				return err
			}
		}
		if err := tr.Save(h); err != nil {
			return err
		}
		// Training goes on: rank 0 dropped the consolidated state.
		inputs, labels := p.tensors(r*lsqBatch/2, (r+1)*lsqBatch/2)
		_, err = tr.TrainStep(ctx, nil, inputs, labels)
		if r == 0 {
			after = values(t, mctx)
		}
		return err
	})
	// Resumed on 2 ranks sharded the same way, the same step gives the
	// same variables, step counters included: Adam's step count reached
	// the trainer's optimizer.
	onRanks(t, 2, func(ctx context.Context, c comm.Communicator) error {
		r := c.Rank()
		mctx := mlctx.New()
		if _, err := checkpoints.Load(mctx).Dir(dir).Done(); err != nil {
			return err
		}
		tr, err := ddptrain.New(c, newBackend(t), mctx.Reuse(), p.model(r), lsqLoss, optimizer("adam", 1), sharded)
		if err != nil {
			return err
		}
		defer tr.Close()
		inputs, labels := p.tensors(r*lsqBatch/2, (r+1)*lsqBatch/2)
		if _, err := tr.TrainStep(ctx, nil, inputs, labels); err != nil {
			return err
		}
		for name, g := range values(t, mctx) {
			if w, ok := after[name]; ok && !slices.Equal(g, w) {
				return fmt.Errorf("resumed, rank %d: %s differs from the uninterrupted run's after the same step", r, name)
			}
			if _, ok := after[name]; !ok && !strings.Contains(name, "moment") {
				return fmt.Errorf("resumed, rank %d: %s, which the uninterrupted run has not", r, name)
			}
		}
		return nil
	})
	read := mlctx.New()
	if _, err := checkpoints.Load(read).Dir(dir).Immediate().Done(); err != nil {
		t.Fatal(err)
	}
	got := values(t, read)
	for name, w := range want {
		if !slices.Equal(got[name], w) {
			t.Errorf("the sharded run's checkpoint: %s differs from the unsharded run's", name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("the sharded run's checkpoint holds %s, which the unsharded run's does not", name)
		}
	}
	for _, tc := range []struct {
		n int
		o ddptrain.Options
	}{{3, sharded}, {1, ddptrain.Options{}}} {
		ctxs := make([]*mlctx.Context, tc.n)
		states := make([]map[string][]byte, tc.n)
		spans := make([]map[string][2]int, tc.n)
		onRanks(t, tc.n, func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			ctxs[r] = mlctx.New()
			if _, err := checkpoints.Load(ctxs[r]).Dir(dir).Done(); err != nil {
				return err
			}
			tr, err := ddptrain.New(c, newBackend(t), ctxs[r].Reuse(), p.model(r), lsqLoss, optimizer("adam", 1), tc.o)
			if err != nil {
				return err
			}
			defer tr.Close()
			inputs, labels := p.tensors(0, lsqBatch/tc.n)
			if err := tr.Setup(ctx, nil, inputs, labels); err != nil {
				return err
			}
			states[r], spans[r] = map[string][]byte{}, map[string][2]int{}
			if mode == ddp.ShardElements && tc.o.Reducer.Shard == mode {
				for _, v := range tr.OptimizerState() {
					if !v.Shape().IsScalar() {
						value, err := v.Value()
						if err != nil {
							return err
						}
						value.ConstBytes(func(b []byte) { states[r][v.ScopeAndName()] = bytes.Clone(b) })
					}
				}
				names := tr.Reducer().Params()
				for k := range tr.Reducer().Buckets() {
					for _, pt := range tr.Reducer().Owned(k) {
						spans[r][names[pt.Param].Name] = [2]int{pt.Lo, pt.Hi}
					}
				}
			}
			return nil
		})
		kept := map[string]int{}
		for r := range tc.n {
			have := values(t, ctxs[r])
			for name, w := range want {
				if name == "/optimizers/learning_rate" {
					continue
				}
				moment := strings.Contains(name, "moment")
				g, ok := have[name]
				if !ok && !moment {
					t.Errorf("%d ranks, rank %d: no %s", tc.n, r, name)
				}
				if ok && !slices.Equal(g, w) {
					t.Errorf("%d ranks, rank %d: %s differs from the checkpoint's", tc.n, r, name)
				}
				if ok && moment {
					kept[name] += len(g)
				}
				if g, ok := states[r][name]; ok {
					v := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(name, "/"+optimizers.AdamDefaultScope), "_1st_moment"), "_2nd_moment")
					span := spans[r][v]
					if !slices.Equal(g, w[4*span[0]:4*span[1]]) {
						t.Errorf("%d ranks, rank %d: its elements [%d, %d) of %s differ from the checkpoint's", tc.n, r, span[0], span[1], name)
					}
					kept[name] += len(g)
				}
			}
		}
		for name, w := range want {
			if strings.Contains(name, "moment") && kept[name] != len(w) {
				t.Errorf("%d ranks: %d bytes of %s loaded over the ranks, want each of its %d bytes on one rank", tc.n, kept[name], name, len(w))
			}
		}
	}
}

// TestShardNoElements trains a model of one weight over 3 ranks with
// Adam sharded by elements: the Reducer's ranges give some rank none of
// it, and that rank's optimizer steps the trainer's placeholder so that
// its step counters advance with its peers'. (TestShardMatchesUnsharded
// has ranks that own no variable under ShardParams.) After every step every
// rank holds the unsharded run's variables bit for bit (the moments
// aside, which the sharded ranks keep in the trainer's own context), the
// step counters included.
func TestShardNoElements(t *testing.T) {
	const n, steps = 3, 4
	p := newLSQ(steps, 8)
	model := func(rank int) train.ModelFn {
		return func(ctx *mlctx.Context, _ any, inputs []*Node) []*Node {
			init := 0.25
			if rank != 0 {
				init = float64(p.bad0)
			}
			w := ctx.VariableWithValue("w", float32(init)) // a scalar
			return []*Node{Mul(inputs[0], w.ValueGraph(inputs[0].Graph()))}
		}
	}
	loss := func(_, preds []*Node) *Node {
		return ReduceAllMean(Square(AddScalar(preds[0], -0.5)))
	}
	train := func(o ddptrain.Options) (snaps [][]map[string][]byte, owners int) {
		snaps = make([][]map[string][]byte, n)
		owned := make([]int, n)
		onRanks(t, n, func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			mctx := mlctx.New()
			tr, err := ddptrain.New(c, newBackend(t), mctx, model(r), loss, optimizer("adam", 1), o)
			if err != nil {
				return err
			}
			defer tr.Close()
			for k := range steps {
				lo := k*lsqBatch + r*lsqBatch/n
				inputs, _ := p.tensors(lo, lo+lsqBatch/n)
				if _, err := tr.TrainStep(ctx, nil, inputs, nil); err != nil {
					return err
				}
				snaps[r] = append(snaps[r], values(t, mctx))
			}
			owned[r] = len(tr.Owned())
			return nil
		})
		for _, o := range owned {
			owners += o
		}
		return snaps, owners
	}
	plain, _ := train(ddptrain.Options{})
	sharded, owners := train(ddptrain.Options{Reducer: ddp.Options{Shard: ddp.ShardElements}})
	if owners != 1 {
		t.Fatalf("%d ranks own elements of the weight, want 1 (the test needs ranks that own none)", owners)
	}
	for r := range n {
		for k := range steps {
			for name, want := range plain[0][k] {
				got, ok := sharded[r][k][name]
				switch {
				case !ok && !strings.Contains(name, "moment"):
					t.Fatalf("rank %d step %d: no %s", r, k+1, name)
				case ok && !bytes.Equal(got, want):
					t.Fatalf("rank %d step %d: %s differs from the unsharded run's", r, k+1, name)
				}
			}
		}
	}
}

// TestShardJoin gives 3 ranks 2, 4 and 3 batches, as TestJoin, with the
// optimizer sharded by whole variables and by elements (Adam): the ranks
// that run out call Join, which steps and gathers their parts in the
// steps they shadow. After Join, and after one more step every rank
// takes, every rank's variables (the weights, the step counters, and by
// whole variables the moments of its own) must be the unsharded run's
// bits: the owners of each element kept stepping it with the same
// averages.
func TestShardJoin(t *testing.T) {
	p := newLSQ(5, 5)
	n := len(joinBatches)
	run := func(mode ddp.ShardMode) (joined, after []map[string][]byte) {
		joined, after = make([]map[string][]byte, n), make([]map[string][]byte, n)
		o := ddptrain.Options{Reducer: ddp.Options{Join: ddp.JoinWorld, Shard: mode}}
		errs := runJoin(t, p, o, func(r int, mctx *mlctx.Context, step func(int) error) error {
			joined[r] = values(t, mctx)
			if err := step(4); err != nil {
				return err
			}
			after[r] = values(t, mctx)
			return nil
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		return joined, after
	}
	plainJoined, plainAfter := run(ddp.ShardOff)
	for _, mode := range []ddp.ShardMode{ddp.ShardParams, ddp.ShardElements} {
		joined, after := run(mode)
		for r := range n {
			for when, pair := range map[string][2]map[string][]byte{"after Join": {plainJoined[r], joined[r]}, "one step after Join": {plainAfter[r], after[r]}} {
				want, got := pair[0], pair[1]
				for name, b := range got {
					if w, ok := want[name]; !ok || !bytes.Equal(b, w) {
						t.Errorf("%s: rank %d %s: %s differs from the unsharded run's", mode, r, when, name)
					}
				}
				for name := range want {
					if _, ok := got[name]; !ok && !strings.Contains(name, optimizers.AdamDefaultScope) {
						t.Errorf("%s: rank %d %s: no variable %s", mode, r, when, name)
					}
				}
			}
		}
	}
}

// TestShardJoinFault: a joined rank whose shadowed step fails (rank 0,
// joined after 2 steps, fails in step 3, after its optimizer graph) does
// not gather, so its peers fail in that step too, at once (ErrAborted,
// before the test's deadline), instead of training on its stale part;
// the rank's own Join returns the cause.
func TestShardJoinFault(t *testing.T) {
	p := newLSQ(5, 5)
	injected := errors.New("injected fault")
	ddptrain.SetJoinFault(func(rank int, step uint64) error {
		if rank == 0 && step == 3 {
			return injected
		}
		return nil
	})
	defer ddptrain.SetJoinFault(nil)
	for _, mode := range []ddp.ShardMode{ddp.ShardParams, ddp.ShardElements} {
		errs := runJoin(t, p, ddptrain.Options{Reducer: ddp.Options{Join: ddp.JoinWorld, Shard: mode}}, nil)
		if !errors.Is(errs[0], injected) || !errors.Is(errs[0], ddptrain.ErrGraph) {
			t.Errorf("%s: rank 0: %v, want ErrGraph with the injected fault", mode, errs[0])
		}
		for r := 1; r < len(errs); r++ {
			if !errors.Is(errs[r], comm.ErrAborted) || errors.Is(errs[r], context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(errs[r]), "rank 0: step 3 (joined): optimizer graph: injected fault") {
				t.Errorf("%s: rank %d: %v, want ErrAborted with rank 0's cause (it failed in a step it shadowed)", mode, r, errs[r])
			}
		}
		t.Logf("%s: %v", mode, errs)
	}
}
