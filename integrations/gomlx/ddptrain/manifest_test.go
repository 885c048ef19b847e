package ddptrain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/models"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// The manifest of a trainer lists its trainable variables, in order, with
// their shapes, and package models reads it back.
func TestManifest(t *testing.T) {
	backend := newBackend(t)
	model := func(ctx *mlctx.Context, _ any, in []*Node) []*Node {
		h := layers.DenseWithBias(ctx.In("hidden"), in[0], 5)
		return []*Node{layers.DenseWithBias(ctx.In("out"), h, 2)}
	}
	onRanks(t, 1, func(ctx context.Context, c comm.Communicator) error {
		tr, err := ddptrain.New(c, backend, mlctx.New(), model, losses.MeanSquaredError, optimizers.StochasticGradientDescent(), ddptrain.Options{})
		if err != nil {
			return err
		}
		defer tr.Close()
		if _, err := tr.Manifest("tiny"); err == nil || !strings.Contains(err.Error(), "first step") {
			return fmt.Errorf("Manifest before the first step: %v; want an error saying the first step creates the variables", err)
		}
		in := []*tensors.Tensor{tensors.FromFlatDataAndDimensions(make([]float32, 4*3), 4, 3)}
		lab := []*tensors.Tensor{tensors.FromFlatDataAndDimensions(make([]float32, 4*2), 4, 2)}
		if _, err := tr.TrainStep(ctx, nil, in, lab); err != nil {
			return err
		}
		m, err := tr.Manifest("tiny")
		if err != nil {
			return err
		}
		data, err := json.Marshal(m)
		if err != nil {
			return err
		}
		got, err := models.Parse("tiny.json", data)
		if err != nil {
			return fmt.Errorf("models.Parse of the manifest: %w\n%s", err, data)
		}
		var shapes []string
		for _, p := range got.Params {
			b, _ := json.Marshal(p.Shape)
			shapes = append(shapes, p.Name+string(b))
		}
		want := "/hidden/dense/weights[3,5] /hidden/dense/biases[5] /out/dense/weights[5,2] /out/dense/biases[2]"
		if s := strings.Join(shapes, " "); s != want || got.Model != "tiny" || got.Numel() != 3*5+5+5*2+2 {
			return fmt.Errorf("manifest %s: %s, %d elements; want %s", got.Model, s, got.Numel(), want)
		}
		return nil
	})
}
