package ddptrain

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ddpgo/ddpgo/models"
)

// Manifest describes the trainer's trainable variables as a ddpgo model
// manifest (package models; docs/guide/models.md): the gradients this trainer
// reduces, named by scope and name, in its order, which `ddpbench run
// --model FILE.json` then benchmarks once json.Marshal has written it. It
// fails before the first step, which creates the variables, and where
// their dtypes differ (a manifest has one).
func (t *Trainer) Manifest(model string) (*models.Manifest, error) {
	if t.trainable == nil {
		return nil, errors.New("ddptrain: Manifest before the first step: the first TrainStep creates the variables")
	}
	m := &models.Manifest{Model: model, Source: "GoMLX context variables (ddptrain.Trainer.Manifest)",
		DType: strings.ToLower(t.trainable[0].DType().String()), Order: "the trainer's parameter order"}
	for _, v := range t.trainable {
		if v.DType() != t.trainable[0].DType() {
			return nil, fmt.Errorf("ddptrain: Manifest: %s is %s and %s is %s: a manifest has one dtype",
				t.trainable[0].ScopeAndName(), t.trainable[0].DType(), v.ScopeAndName(), v.DType())
		}
		m.Params = append(m.Params, models.Param{Name: v.ScopeAndName(), Shape: slices.Clone(v.Shape().Dimensions)})
	}
	return m, nil
}
