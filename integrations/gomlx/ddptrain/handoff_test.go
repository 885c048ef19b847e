package ddptrain

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// The gradient sizes (elements, in the context's order) of the example's
// models: the CNN (13,706 parameters, 55 KB of gradients) and the
// perceptron with two hidden layers of 2560 units (6,748,170 parameters,
// 27 MB).
var handOffModels = []struct {
	name  string
	sizes []int
}{
	{"cnn", []int{9 * 16, 16, 9 * 16 * 32, 32, 128 * 64, 64, 64 * 10, 10}},
	{"mlp2560", []int{64 * 2560, 2560, 2560 * 2560, 2560, 2560 * 10, 10}},
}

// sizedModel has one trainable vector per size; its loss depends on all
// of them, so the gradient graph outputs a gradient of each size.
func sizedModel(sizes []int) func(*mlctx.Context, any, []*Node) []*Node {
	return func(ctx *mlctx.Context, _ any, inputs []*Node) []*Node {
		g := inputs[0].Graph()
		var sum *Node
		for i, n := range sizes {
			v := ctx.In(fmt.Sprintf("v%d", i)).VariableWithShape("w", shapes.Make(dtypes.Float32, n)).ValueGraph(g)
			if s := ReduceAllSum(v); sum == nil {
				sum = s
			} else {
				sum = Add(sum, s)
			}
		}
		return []*Node{Mul(inputs[0], sum)}
	}
}

func sizedLoss(labels, preds []*Node) *Node { return ReduceAllMean(Square(Sub(preds[0], labels[0]))) }

// handOffRank is one rank of the benchmark: a Trainer set up over the
// model, and one gradient graph's outputs, kept for every step.
type handOffRank struct {
	t     *Trainer
	grads []*tensors.Tensor
}

func newHandOffRank(ctx context.Context, c comm.Communicator, backend backends.Backend, sizes []int, readyBatch int) (*handOffRank, error) {
	t, err := New(c, backend, mlctx.New(), sizedModel(sizes), sizedLoss,
		optimizers.StochasticGradientDescent(), Options{ReadyBatch: readyBatch})
	if err != nil {
		return nil, err
	}
	x := []*tensors.Tensor{tensors.FromValue([][]float32{{1}, {2}})}
	y := []*tensors.Tensor{tensors.FromValue([][]float32{{0}, {1}})}
	if err := t.Setup(ctx, nil, x, y); err != nil {
		return nil, err
	}
	outs, err := t.runGradients(nil, x, y)
	if err != nil {
		return nil, err
	}
	return &handOffRank{t: t, grads: outs[1:]}, nil
}

// step is the hand-off of one synced step: the gradients into their
// buckets, marked ready, the wait for the averages and their copy into the
// optimizer graph's inputs.
func (h *handOffRank) step(ctx context.Context) error {
	if err := h.t.r.Begin(ddp.Sync); err != nil {
		return err
	}
	clear(h.t.marked)
	if err := h.t.handIn(ddp.Sync, h.grads); err != nil {
		return err
	}
	return h.t.wait(ctx)
}

func (h *handOffRank) close() {
	finalizeAll(h.grads)
	h.t.Close()
}

// BenchmarkHandOff times the hand-off of one step (what Times.HandOff and
// Times.Reduction measure, without the graphs) for the example's two
// models over 1 and 2 inproc ranks, each gradient marked ready as it is
// copied or all of them at the end, and reports the allocations per step
// of every rank together (allocs/step), which should be 0, and the
// gradient bytes handed over per second and rank (GB/s: two copies of
// every byte, in and out).
//
//	go test -run '^$' -bench HandOff ./ddptrain/
func BenchmarkHandOff(b *testing.B) {
	ctx := context.Background()
	for _, m := range handOffModels {
		bytes := 0
		for _, n := range m.sizes {
			bytes += 4 * n
		}
		for _, ranks := range []int{1, 2} {
			for _, rb := range []struct {
				name  string
				batch int
			}{{"each", 1}, {"all", len(m.sizes)}} {
				b.Run(fmt.Sprintf("%s/ranks=%d/ready=%s", m.name, ranks, rb.name), func(b *testing.B) {
					backend, err := simplego.New("ops_sequential")
					if err != nil {
						b.Fatal(err)
					}
					defer backend.Finalize()
					comms, err := inproc.NewGroup(ranks)
					if err != nil {
						b.Fatal(err)
					}
					defer func() {
						for _, c := range comms {
							c.Close()
						}
					}()
					rs := make([]*handOffRank, ranks)
					errs := make(chan error, ranks)
					for i, c := range comms {
						go func() {
							var err error
							rs[i], err = newHandOffRank(ctx, c, backend, m.sizes, rb.batch)
							errs <- err
						}()
					}
					for range ranks {
						if err := <-errs; err != nil {
							b.Fatal(err)
						}
					}
					defer func() {
						for _, r := range rs {
							r.close()
						}
					}()
					// The other ranks step on a signal from rank 0's loop.
					next := make(chan bool)
					for _, r := range rs[1:] {
						go func() {
							for range next {
								errs <- r.step(ctx)
							}
						}()
					}
					defer close(next)
					stepAll := func() error {
						for range rs[1:] {
							next <- true
						}
						err := rs[0].step(ctx)
						for range rs[1:] {
							if e := <-errs; err == nil {
								err = e
							}
						}
						return err
					}
					for range 3 { // warm: the rebuild after the first step, the pools
						if err := stepAll(); err != nil {
							b.Fatal(err)
						}
					}
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					steps := 0
					b.SetBytes(int64(bytes))
					for b.Loop() {
						if err := stepAll(); err != nil {
							b.Fatal(err)
						}
						steps++
					}
					runtime.ReadMemStats(&after)
					b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(steps), "allocs/step")
				})
			}
		}
	}
}

// TestHandOffAllocs holds the hand-off of a warm step to zero heap
// allocations, for the CNN's gradients on one rank.
func TestHandOffAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	ctx := context.Background()
	backend, err := simplego.New("ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	comms, err := inproc.NewGroup(1)
	if err != nil {
		t.Fatal(err)
	}
	defer comms[0].Close()
	r, err := newHandOffRank(ctx, comms[0], backend, handOffModels[0].sizes, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for range 3 {
		if err := r.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(20, func() {
		if err := r.step(ctx); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a warm hand-off allocates %v times a step, want 0", n)
	}
}
