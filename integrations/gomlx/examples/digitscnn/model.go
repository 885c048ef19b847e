package main

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/initializers"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/train"
)

// models are the networks -model chooses.
var models = map[string]func(hidden int) train.ModelFn{
	"cnn": func(int) train.ModelFn { return cnn },
	"mlp": mlp,
}

// cnn is the convolutional network: two 3x3 convolutions of 16 and 32
// channels, each followed by ReLU and 2x2 max pooling, then a dense layer
// of 64 units and the 10 logits. On 8x8 images: 8x8x16, 4x4x16, 4x4x32,
// 2x2x32 = 128 features. 13,706 parameters.
func cnn(ctx *mlctx.Context, _ any, inputs []*Node) []*Node {
	x := inputs[0] // [batch, 8, 8, 1]
	x = maxPool2(activations.Relu(conv3x3(ctx.In("conv1"), x, 16)))
	x = maxPool2(activations.Relu(conv3x3(ctx.In("conv2"), x, 32)))
	x = Reshape(x, x.Shape().Dimensions[0], -1)
	x = activations.Relu(layers.Dense(ctx.In("dense1"), x, true, 64))
	return []*Node{layers.Dense(ctx.In("logits"), x, true, classes)}
}

// mlp returns a perceptron with two hidden layers of hidden units: the
// larger model, whose gradients are tens of megabytes (hidden 2560:
// 6.7 million parameters, 27 MB).
func mlp(hidden int) train.ModelFn {
	return func(ctx *mlctx.Context, _ any, inputs []*Node) []*Node {
		x := inputs[0]
		x = Reshape(x, x.Shape().Dimensions[0], -1)
		for i := range 2 {
			x = activations.Relu(layers.Dense(ctx.In(fmt.Sprintf("hidden%d", i+1)), x, true, hidden))
		}
		return []*Node{layers.Dense(ctx.In("logits"), x, true, classes)}
	}
}

// conv3x3 is a 3x3 convolution with stride 1 and zero padding that keeps
// the image's size, with a bias, on x of shape [batch, height, width,
// channels]. It gathers every pixel's 3x3 neighbourhood (a pixel outside
// the image reads a row of zeros appended to the image) and multiplies
// the patches by the kernel: GoMLX differentiates the gather and the dot
// on every backend, where simplego cannot differentiate
// layers.Convolution (its input gradient needs the Reverse operation).
func conv3x3(ctx *mlctx.Context, x *Node, channels int) *Node {
	g := x.Graph()
	d := x.Shape().Dimensions
	batch, h, w, c := d[0], d[1], d[2], d[3]
	// Pixels first, so the gather indexes the leading axis: [h*w+1, batch, c].
	pixels := Reshape(TransposeAllDims(x, 1, 2, 0, 3), h*w, batch, c)
	pixels = Concatenate([]*Node{pixels, Zeros(g, shapes.Make(x.DType(), 1, batch, c))}, 0)
	idx := make([]int32, 0, h*w*9)
	for i := range h {
		for j := range w {
			for di := -1; di <= 1; di++ {
				for dj := -1; dj <= 1; dj++ {
					if i+di < 0 || i+di >= h || j+dj < 0 || j+dj >= w {
						idx = append(idx, int32(h*w)) // the zero row
					} else {
						idx = append(idx, int32((i+di)*w+j+dj))
					}
				}
			}
		}
	}
	patches := Gather(pixels, Const(g, tensors.FromFlatDataAndDimensions(idx, h*w, 9, 1))) // [h*w, 9, batch, c]
	patches = Reshape(TransposeAllDims(patches, 2, 0, 1, 3), batch*h*w, 9*c)
	kernel := ctx.VariableWithShape("weights", shapes.Make(x.DType(), 9*c, channels)).ValueGraph(g)
	bias := ctx.WithInitializer(initializers.Zero).VariableWithShape("biases", shapes.Make(x.DType(), channels)).ValueGraph(g)
	y := Add(Dot(patches, kernel), ExpandDims(bias, 0))
	return Reshape(y, batch, h, w, channels)
}

// maxPool2 is 2x2 max pooling with stride 2 on [batch, height, width,
// channels] (even height and width), as a reshape and a reduction, which
// simplego differentiates (MaxPool's gradient needs SelectAndScatter).
func maxPool2(x *Node) *Node {
	d := x.Shape().Dimensions
	return ReduceMax(Reshape(x, d[0], d[1]/2, 2, d[2]/2, 2, d[3]), 2, 4)
}

// predict builds the inference graph: the predicted class of each image.
func predict(model train.ModelFn) func(ctx *mlctx.Context, x *Node) *Node {
	return func(ctx *mlctx.Context, x *Node) *Node {
		return ConvertDType(ArgMax(model(ctx, nil, []*Node{x})[0], -1), dtypes.Int32)
	}
}
