package ddptrain_test

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/sampler"
	"github.com/gomlx/gomlx/backends/simplego"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// Two ranks in one process fit y = 2x - 1 with a dense layer, each on its
// half of every batch of 8 examples; they end with the same weights.
func Example() {
	x := make([]float32, 64)
	y := make([]float32, 64)
	for i := range x {
		x[i] = float32(i)/32 - 1
		y[i] = 2*x[i] - 1
	}
	inputs := []*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, 64, 1)}
	labels := []*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, 64, 1)}
	model := func(ctx *mlctx.Context, _ any, in []*Node) []*Node {
		return []*Node{layers.DenseWithBias(ctx, in[0], 1)}
	}

	backend, err := simplego.New("ops_sequential") // see the package documentation, "Backends"
	if err != nil {
		panic(err)
	}
	defer backend.Finalize()
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	weights := make([][]float32, 2)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			defer c.Close()
			ctx := mlctx.New()
			tr, err := ddptrain.New(c, backend, ctx, model, losses.MeanSquaredError,
				optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.2), ddptrain.Options{})
			if err != nil {
				panic(err)
			}
			defer tr.Close()
			ds, err := ddptrain.NewDataset("line", r, 2, 4, inputs, labels, sampler.Options{Shuffle: true, Seed: 1, DropLast: true})
			if err != nil {
				panic(err)
			}
			for epoch := range 20 {
				ds.SetEpoch(epoch)
				for spec, in, lab, err := ds.Yield(); err == nil; spec, in, lab, err = ds.Yield() {
					if _, err := tr.TrainStep(context.Background(), spec, in, lab); err != nil {
						panic(err)
					}
				}
			}
			for _, v := range tr.Variables() {
				weights[r] = append(weights[r], tensors.MustCopyFlatData[float32](v.MustValue())...)
			}
		})
	}
	wg.Wait()
	fmt.Printf("w = %.2f, b = %.2f\n", weights[0][0], weights[0][1])
	fmt.Println("the ranks hold the same weights:", slices.Equal(weights[0], weights[1]))
	// Output:
	// w = 2.00, b = -1.00
	// the ranks hold the same weights: true
}
