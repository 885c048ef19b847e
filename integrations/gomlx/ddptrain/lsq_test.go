package ddptrain_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/sampler"
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// The test problem is least squares: two linear heads, p_h = x·W_h + b_h,
// on the same inputs, and the loss Σ_h mean((p_h - y_h)²). It is the
// simplest model whose gradients, Hessian and rounding errors can be
// written down exactly (equivalence_test.go derives the bound), and it has
// variables of several shapes that fill several buckets.
const (
	lsqIn    = 8  // inputs d
	lsqBatch = 12 // global batch B: a multiple of 1, 2, 3 and 4 ranks
)

var lsqHeads = []int{3, 2} // outputs m_h of each head

// lsq is a data set of the test problem and its initial weights.
type lsq struct {
	n    int
	x    []float32   // n × lsqIn
	y    [][]float32 // per head: n × m_h
	w0   [][]float32 // per head: the initial weights, (lsqIn+1) × m_h: W's rows, then b
	bad0 float32     // what ranks other than 0 initialize every weight to
}

func newLSQ(steps int, seed uint64) *lsq {
	rng := rand.New(rand.NewPCG(seed, 1))
	u := func() float32 { return float32(2*rng.Float64() - 1) }
	p := &lsq{n: steps * lsqBatch, bad0: 7}
	p.x = make([]float32, p.n*lsqIn)
	for i := range p.x {
		p.x[i] = u()
	}
	for _, m := range lsqHeads {
		y := make([]float32, p.n*m)
		for i := range y {
			y[i] = u()
		}
		w := make([]float32, (lsqIn+1)*m)
		for i := range w {
			w[i] = u() / 2
		}
		p.y, p.w0 = append(p.y, y), append(p.w0, w)
	}
	return p
}

// tensors returns the inputs and labels of examples [lo, hi).
func (p *lsq) tensors(lo, hi int) (inputs, labels []*tensors.Tensor) {
	inputs = []*tensors.Tensor{tensors.FromFlatDataAndDimensions(p.x[lo*lsqIn:hi*lsqIn], hi-lo, lsqIn)}
	for h, m := range lsqHeads {
		labels = append(labels, tensors.FromFlatDataAndDimensions(p.y[h][lo*m:hi*m], hi-lo, m))
	}
	return inputs, labels
}

// model returns the ModelFn: the heads' weights start at p.w0 on rank 0
// (and in the plain GoMLX run), and at p.bad0 on the other ranks, so that
// only the broadcast of rank 0's variables can make them agree.
func (p *lsq) model(rank int) train.ModelFn {
	return func(ctx *mlctx.Context, _ any, inputs []*Node) []*Node {
		x := inputs[0]
		var preds []*Node
		for h, m := range lsqHeads {
			w0, b0 := p.w0[h][:lsqIn*m], p.w0[h][lsqIn*m:]
			hctx := ctx.In(fmt.Sprintf("head%d", h))
			w := hctx.WithInitializer(p.init(rank, w0, lsqIn, m)).VariableWithShape("weights", shapes.Make(dtypes.Float32, lsqIn, m))
			b := hctx.WithInitializer(p.init(rank, b0, m)).VariableWithShape("biases", shapes.Make(dtypes.Float32, m))
			g := x.Graph()
			preds = append(preds, Add(Dot(x, w.ValueGraph(g)), ExpandDims(b.ValueGraph(g), 0)))
		}
		return preds
	}
}

func (p *lsq) init(rank int, values []float32, dims ...int) mlctx.VariableInitializer {
	return func(g *Graph, shape shapes.Shape) *Node {
		if rank != 0 {
			return BroadcastToShape(Scalar(g, dtypes.Float32, p.bad0), shape)
		}
		return Const(g, tensors.FromFlatDataAndDimensions(values, dims...))
	}
}

// lsqLoss is Σ_h mean((p_h - y_h)²).
func lsqLoss(labels, preds []*Node) *Node {
	var loss *Node
	for h := range preds {
		l := ReduceAllMean(Square(Sub(preds[h], labels[h])))
		if loss == nil {
			loss = l
		} else {
			loss = Add(loss, l)
		}
	}
	return loss
}

// state is a run's variables after a step, as float64: per head, the
// weights, W's rows then b, and, for Adam, the first and second moments
// laid out the same way.
type state struct {
	w, m, v [][]float64
}

// readState reads ctx's variables of the test problem.
func readState(t testing.TB, ctx *mlctx.Context, adam bool) state {
	t.Helper()
	var s state
	for h := range lsqHeads {
		scope := fmt.Sprintf("/head%d", h)
		s.w = append(s.w, readPair(t, ctx, scope, "weights", "biases"))
		if adam {
			as := "/" + optimizers.AdamDefaultScope + scope
			s.m = append(s.m, readPair(t, ctx, as, "weights_1st_moment", "biases_1st_moment"))
			s.v = append(s.v, readPair(t, ctx, as, "weights_2nd_moment", "biases_2nd_moment"))
		}
	}
	return s
}

func readPair(t testing.TB, ctx *mlctx.Context, scope, a, b string) []float64 {
	t.Helper()
	var out []float64
	for _, name := range []string{a, b} {
		v := ctx.GetVariableByScopeAndName(scope, name)
		if v == nil {
			t.Fatalf("no variable %s/%s", scope, name)
		}
		value, err := v.Value()
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range tensors.MustCopyFlatData[float32](value) {
			out = append(out, float64(x))
		}
	}
	return out
}

// optimizer returns a fresh optimizer of the given kind; lrScale
// multiplies SGD's learning rate.
func optimizer(kind string, lrScale float64) optimizers.Interface {
	if kind == "adam" {
		return optimizers.Adam().LearningRate(0.01).Done()
	}
	return optimizers.StochasticGradientDescent().WithLearningRate(0.1 * lrScale)
}

// run says how a test trains: the optimizer ("sgd" or "adam"), the steps,
// the micro-batches of lsqBatch examples each step accumulates, and, for
// the ranks, the hook (by name) and the trainer's options.
type run struct {
	kind  string
	steps int
	acc   int
	hook  string
	o     ddptrain.Options
}

// newBackend returns a simplego backend that runs a graph's operations
// one at a time: its parallel mode reads buffers that other operations
// reuse (GoMLX v0.26.0), which the race detector reports.
func newBackend(t testing.TB) backends.Backend {
	t.Helper()
	b, err := simplego.New("ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Finalize)
	return b
}

// runPlain trains the problem with GoMLX's own train.Trainer, one process
// and one graph per step, on global batches of lsqBatch in order, and
// returns the state after each step. With micro-batches (GoMLX's
// AccumulateGradients, which averages them) SGD's learning rate is
// multiplied by their number, which makes the step the one ddptrain takes
// on their sum.
func runPlain(t testing.TB, p *lsq, rn run) []state {
	t.Helper()
	backend := newBackend(t)
	ctx := mlctx.New()
	tr := train.NewTrainer(backend, ctx, p.model(0), lsqLoss, optimizer(rn.kind, float64(max(rn.acc, 1))), nil, nil)
	if rn.acc > 1 {
		if err := tr.AccumulateGradients(rn.acc); err != nil {
			t.Fatal(err)
		}
	}
	var out []state
	for k := range rn.steps * max(rn.acc, 1) {
		inputs, labels := p.tensors(k*lsqBatch, (k+1)*lsqBatch)
		if _, err := tr.TrainStep(nil, inputs, labels); err != nil {
			t.Fatalf("plain GoMLX, step %d: %v", k+1, err)
		}
		if (k+1)%max(rn.acc, 1) == 0 {
			out = append(out, readState(t, ctx, rn.kind == "adam"))
		}
	}
	return out
}

// runRanks trains the problem over n inproc ranks with ddptrain, each
// rank on its shard of every global batch (lsqBatch/n examples, from a
// ddptrain.Dataset), and returns rank 0's state after each step; every
// rank's state must equal rank 0's bit for bit.
func runRanks(t testing.TB, p *lsq, rn run, n int) []state {
	t.Helper()
	comms, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(comms)
	backend := newBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := make([][]state, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			all[r], errs[r] = trainRank(ctx, t, c, backend, p, rn)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%d ranks, rank %d: %v", n, r, err)
		}
	}
	for r := 1; r < n; r++ {
		for k := range rn.steps {
			if !sameState(all[0][k], all[r][k]) {
				t.Fatalf("%d ranks: after step %d rank %d's variables differ from rank 0's", n, k+1, r)
			}
		}
	}
	return all[0]
}

func trainRank(ctx context.Context, t testing.TB, c comm.Communicator, backend backends.Backend, p *lsq, rn run) ([]state, error) {
	n, rank := c.Size(), c.Rank()
	inputs, labels := p.tensors(0, p.n)
	ds, err := ddptrain.NewDataset("lsq", rank, n, lsqBatch/n, inputs, labels, sampler.Options{DropLast: true})
	if err != nil {
		return nil, err
	}
	mctx := mlctx.New()
	o := rn.o
	if rn.hook != "" {
		if o.Reducer.Hook, err = hooks.ByName(rn.hook); err != nil { // a hook belongs to one rank
			return nil, err
		}
	}
	tr, err := ddptrain.New(c, backend, mctx, p.model(rank), lsqLoss, optimizer(rn.kind, 1), o)
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	var out []state
	for range rn.steps {
		for mb := range max(rn.acc, 1) {
			spec, in, lab, err := ds.Yield()
			if err != nil {
				return nil, err
			}
			step := tr.TrainStep
			if mb < rn.acc-1 {
				step = tr.AccumulateStep
			}
			if _, err := step(ctx, spec, in, lab); err != nil {
				return nil, err
			}
		}
		// A sharded optimizer keeps the moments of this rank's variables
		// only: compare the weights.
		out = append(out, readState(t, mctx, rn.kind == "adam" && o.Reducer.Shard == ddp.ShardOff))
	}
	return out, nil
}

func sameState(a, b state) bool {
	eq := func(x, y [][]float64) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if len(x[i]) != len(y[i]) {
				return false
			}
			for j := range x[i] {
				if x[i][j] != y[i][j] {
					return false
				}
			}
		}
		return true
	}
	return eq(a.w, b.w) && eq(a.m, b.m) && eq(a.v, b.v)
}

func closeAll(cs []*inproc.Comm) {
	for _, c := range cs {
		c.Close()
	}
}

// smallBuckets splits the test problem's gradients over several buckets
// (the largest, head 0's weights, is 96 bytes).
var smallBuckets = ddptrain.Options{Reducer: ddp.Options{BucketCap: 64, FirstBucketCap: 64}}
