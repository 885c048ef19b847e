package main

import (
	"math"

	"github.com/ddpgo/ddpgo/ddp"
)

// optimizer is SGD with (heavy-ball) momentum, v = mu v + g; w -= lr v,
// or Adam (Kingma and Ba, with bias correction), over ranges of the
// parameters: it keeps state for the elements it was made for and no
// others. Without -shard those are every parameter whole; with -shard,
// the parts of the buckets that this rank owns (ddp.Reducer.Owned), so
// that each rank keeps 1/N of the state. Both are elementwise: an
// element's update depends only on its own gradient and state, which is
// why a sharded run computes the same bits as an unsharded one.
type optimizer struct {
	adam                bool
	lr, mu, b1, b2, eps float32
	t                   int // Adam's steps so far
	c1, c2              float32
	state               map[ddp.Part]*moments
}

// moments is one range's state: the momentum buffer (m), and Adam's
// second moment (v).
type moments struct{ m, v []float32 }

// newOptimizer returns cfg's optimizer (-opt) with state for parts.
func newOptimizer(cfg config, parts []ddp.Part) *optimizer {
	o := &optimizer{adam: cfg.Optimizer == "adam", lr: float32(cfg.LR), mu: float32(cfg.Momentum), b1: 0.9, b2: 0.999, eps: 1e-8,
		state: make(map[ddp.Part]*moments, len(parts))}
	for _, pt := range parts {
		s := &moments{m: make([]float32, pt.Hi-pt.Lo)}
		if o.adam {
			s.v = make([]float32, pt.Hi-pt.Lo)
		}
		o.state[pt] = s
	}
	return o
}

// wholeParts is every parameter of params, whole.
func wholeParts(params [][]float32) []ddp.Part {
	parts := make([]ddp.Part, len(params))
	for i, p := range params {
		parts[i] = ddp.Part{Param: i, Lo: 0, Hi: len(p)}
	}
	return parts
}

// newSGD returns SGD with momentum for every parameter of params, whole.
func newSGD(params [][]float32, lr, momentum float32) *optimizer {
	return newOptimizer(config{LR: float64(lr), Momentum: float64(momentum), Optimizer: "momentum"}, wholeParts(params))
}

// begin starts a step (Adam's bias correction counts steps).
func (o *optimizer) begin() {
	o.t++
	if o.adam {
		o.c1 = float32(1 - math.Pow(float64(o.b1), float64(o.t)))
		o.c2 = float32(1 - math.Pow(float64(o.b2), float64(o.t)))
	}
}

// update steps the elements pt of a parameter: w and g are those
// elements of its value and averaged gradient.
func (o *optimizer) update(pt ddp.Part, w, g []float32) {
	s := o.state[pt]
	if !o.adam {
		for k := range w {
			s.m[k] = o.mu*s.m[k] + g[k]
			w[k] -= o.lr * s.m[k]
		}
		return
	}
	for k := range w {
		s.m[k] = o.b1*s.m[k] + (1-o.b1)*g[k]
		s.v[k] = o.b2*s.v[k] + (1-o.b2)*g[k]*g[k]
		w[k] -= o.lr * (s.m[k] / o.c1) / (float32(math.Sqrt(float64(s.v[k]/o.c2))) + o.eps)
	}
}

// step updates every parameter i, whole, with gradient grad(i).
func (o *optimizer) step(params [][]float32, grad func(i int) ([]float32, error)) error {
	o.begin()
	for i, w := range params {
		g, err := grad(i)
		if err != nil {
			return err
		}
		o.update(ddp.Part{Param: i, Lo: 0, Hi: len(w)}, w, g)
	}
	return nil
}

// stateBytes is the memory the optimizer's state holds (without -shard:
// 4 bytes an element, 8 with Adam).
func (o *optimizer) stateBytes() int {
	n := 0
	for _, s := range o.state {
		n += 4 * (len(s.m) + len(s.v))
	}
	return n
}

// kinds is the number of kinds of state: momentum, or Adam's two moments.
func (o *optimizer) kinds() int { return 1 + boolInt(o.adam) }

// export copies the state of the given kind (0: the momentum or first
// moment, 1: Adam's second) of the parts it keeps into dst, shaped like
// the parameters.
func (o *optimizer) export(kind int, dst [][]float32) {
	for pt, s := range o.state {
		copy(dst[pt.Param][pt.Lo:pt.Hi], s.kind(kind))
	}
}

// load copies the parts it keeps of the state of the given kind from src,
// shaped like the parameters.
func (o *optimizer) load(kind int, src [][]float32) {
	for pt, s := range o.state {
		copy(s.kind(kind), src[pt.Param][pt.Lo:pt.Hi])
	}
}

func (s *moments) kind(k int) []float32 {
	if k == 0 {
		return s.m
	}
	return s.v
}

// boolInt is 1 for true.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
