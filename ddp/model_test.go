package ddp

import (
	"math"
	"math/rand/v2"
)

// mlp is a two-layer perceptron small enough to check by hand: tanh hidden
// layer, linear output, squared error. Its gradients are accumulated in
// float64 and rounded to float32 once, so that sharding the batch changes
// them only by that rounding.
type mlp struct {
	in, hid, out int
	w            [][]float32 // W1 [hid,in], b1 [hid], W2 [out,hid], b2 [out]
}

func newMLP(rng *rand.Rand, in, hid, out int) *mlp {
	m := &mlp{in: in, hid: hid, out: out}
	sizes := []int{hid * in, hid, out * hid, out}
	for _, n := range sizes {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * 0.5)
		}
		m.w = append(m.w, w)
	}
	return m
}

func (m *mlp) params() []Param {
	return []Param{
		{Name: "fc1.weight", Shape: []int{m.hid, m.in}},
		{Name: "fc1.bias", Shape: []int{m.hid}},
		{Name: "fc2.weight", Shape: []int{m.out, m.hid}},
		{Name: "fc2.bias", Shape: []int{m.out}},
	}
}

func (m *mlp) clone() *mlp {
	c := *m
	c.w = nil
	for _, w := range m.w {
		c.w = append(c.w, append([]float32(nil), w...))
	}
	return &c
}

// grads returns the mean gradient over the samples xs (rows of in values)
// with targets ys (rows of out values).
func (m *mlp) grads(xs, ys [][]float32) [][]float32 {
	acc := make([][]float64, len(m.w))
	for p, w := range m.w {
		acc[p] = make([]float64, len(w))
	}
	W1, b1, W2, b2 := m.w[0], m.w[1], m.w[2], m.w[3]
	h := make([]float64, m.hid)
	dh := make([]float64, m.hid)
	for s, x := range xs {
		for j := range h {
			v := float64(b1[j])
			for k := 0; k < m.in; k++ {
				v += float64(W1[j*m.in+k]) * float64(x[k])
			}
			h[j] = math.Tanh(v)
		}
		clear(dh)
		for o := 0; o < m.out; o++ {
			v := float64(b2[o])
			for j := range h {
				v += float64(W2[o*m.hid+j]) * h[j]
			}
			d := v - float64(ys[s][o])
			acc[3][o] += d
			for j := range h {
				acc[2][o*m.hid+j] += d * h[j]
				dh[j] += d * float64(W2[o*m.hid+j])
			}
		}
		for j := range h {
			d := dh[j] * (1 - h[j]*h[j])
			acc[1][j] += d
			for k := 0; k < m.in; k++ {
				acc[0][j*m.in+k] += d * float64(x[k])
			}
		}
	}
	out := make([][]float32, len(acc))
	for p, a := range acc {
		out[p] = make([]float32, len(a))
		for i, v := range a {
			out[p][i] = float32(v / float64(len(xs)))
		}
	}
	return out
}

// sgd applies w -= lr*g.
func (m *mlp) sgd(g [][]float32, lr float32) {
	for p, w := range m.w {
		for i := range w {
			w[i] -= lr * g[p][i]
		}
	}
}

func randomData(rng *rand.Rand, n, in, out int) (xs, ys [][]float32) {
	for range n {
		x := make([]float32, in)
		y := make([]float32, out)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for i := range y {
			y[i] = float32(rng.NormFloat64())
		}
		xs, ys = append(xs, x), append(ys, y)
	}
	return xs, ys
}

// relErr returns ||a-b|| / ||b|| (or ||a-b|| when b is zero).
func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
