package main

import (
	"math"
	"math/rand/v2"
)

// Parameter indices, in registration (= forward) order.
const (
	pW1 = iota // [hidden][Pixels]
	pB1        // [hidden]
	pW2        // [Classes][hidden]
	pB2        // [Classes]
	numParams
)

// mlp is a two-layer perceptron: logits = W2 relu(W1 x + b1) + b2, trained
// with softmax cross-entropy averaged over the batch. The forward pass keeps
// the activations the backward pass needs; buffers grow to the largest batch
// seen and are then reused, so a training step allocates nothing.
type mlp struct {
	in, hidden, out int
	w               [numParams][]float32

	// Activations of the last forward pass.
	n    int       // rows
	x    []float32 // [n][in], not owned
	y    []int32   // [n], not owned
	z1   []float32 // [n][hidden] pre-activation
	h    []float32 // [n][hidden] relu(z1)
	p    []float32 // [n][out] softmax probabilities
	dz   []float32 // [n][out] dLoss/dlogits
	dh   []float32 // [n][hidden] dLoss/dz1
	acc  []float64 // scratch of width max(in, hidden) for float64 row sums
	loss float64   // mean loss of the last forward
	hits int       // correct predictions of the last forward
}

// newMLP returns a model with He-initialised weights and zero biases drawn
// from a generator seeded with seed: the same seed gives the same model.
func newMLP(seed uint64, in, hidden, out int) *mlp {
	m := &mlp{in: in, hidden: hidden, out: out}
	rng := rand.New(rand.NewPCG(seed, 0x6d6c70))
	m.w[pW1] = make([]float32, hidden*in)
	m.w[pB1] = make([]float32, hidden)
	m.w[pW2] = make([]float32, out*hidden)
	m.w[pB2] = make([]float32, out)
	for i := range m.w[pW1] {
		m.w[pW1][i] = float32(rng.NormFloat64() * math.Sqrt(2/float64(in)))
	}
	for i := range m.w[pW2] {
		m.w[pW2][i] = float32(rng.NormFloat64() * math.Sqrt(2/float64(hidden)))
	}
	return m
}

// shapes returns each parameter's name and shape in registration order.
func (m *mlp) shapes() (names []string, shapes [][]int) {
	return []string{"W1", "b1", "W2", "b2"},
		[][]int{{m.hidden, m.in}, {m.hidden}, {m.out, m.hidden}, {m.out}}
}

// values returns the parameter slices (the model's own storage).
func (m *mlp) values() [][]float32 { return m.w[:] }

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// forward runs the model on n = len(y) rows of x, keeps the activations for
// backward and returns the mean cross-entropy loss and the number of
// correct predictions.
func (m *mlp) forward(x []float32, y []int32) (loss float64, correct int) {
	n := len(y)
	m.n, m.x, m.y = n, x, y
	m.z1 = grow(m.z1, n*m.hidden)
	m.h = grow(m.h, n*m.hidden)
	m.p = grow(m.p, n*m.out)
	w1, b1, w2, b2 := m.w[pW1], m.w[pB1], m.w[pW2], m.w[pB2]
	var total float64
	for r := range n {
		xr := x[r*m.in : (r+1)*m.in]
		z1 := m.z1[r*m.hidden : (r+1)*m.hidden]
		h := m.h[r*m.hidden : (r+1)*m.hidden]
		for j := range m.hidden {
			s := b1[j]
			wj := w1[j*m.in : (j+1)*m.in]
			for k, v := range xr {
				s += wj[k] * v
			}
			z1[j] = s
			h[j] = max(s, 0)
		}
		p := m.p[r*m.out : (r+1)*m.out]
		best := 0
		for o := range m.out {
			s := b2[o]
			wo := w2[o*m.hidden : (o+1)*m.hidden]
			for j, v := range h {
				s += wo[j] * v
			}
			p[o] = s
			if s > p[best] {
				best = o
			}
		}
		if best == int(y[r]) {
			correct++
		}
		// Softmax with the maximum subtracted; the loss is computed from the
		// log-sum-exp in float64 so that it stays finite for confident rows.
		top := float64(p[best])
		var sum float64
		for o := range m.out {
			sum += math.Exp(float64(p[o]) - top)
		}
		logZ := top + math.Log(sum)
		total += logZ - float64(p[y[r]])
		for o := range m.out {
			p[o] = float32(math.Exp(float64(p[o]) - logZ))
		}
	}
	m.loss, m.hits = total/float64(n), correct
	return m.loss, correct
}

// backward computes the gradient of the mean loss of the last forward pass
// and writes it (overwriting) into grad(i) for each parameter i, last layer
// first. As soon as a parameter's gradient is complete it calls ready(i),
// after which backward never touches grad(i) again: whoever receives the
// mark may start communicating it while the first layer is still being
// differentiated. The order is b2, W2, b1, W1. backward stops at the first
// error grad or ready returns.
func (m *mlp) backward(grad func(i int) ([]float32, error), ready func(i int) error) error {
	n := m.n
	inv := float32(1) / float32(n)
	m.dz = grow(m.dz, n*m.out)
	m.dh = grow(m.dh, n*m.hidden)
	if cap(m.acc) < max(m.in, m.hidden) {
		m.acc = make([]float64, max(m.in, m.hidden))
	}
	for r := range n {
		dz := m.dz[r*m.out : (r+1)*m.out]
		copy(dz, m.p[r*m.out:(r+1)*m.out])
		dz[m.y[r]] -= 1
		for o := range dz {
			dz[o] *= inv
		}
	}

	// Layer 2: db2 = sum_r dz, dW2[o] = sum_r dz[r][o] h[r].
	gb2, err := grad(pB2)
	if err != nil {
		return err
	}
	for o := range m.out {
		var s float64
		for r := range n {
			s += float64(m.dz[r*m.out+o])
		}
		gb2[o] = float32(s)
	}
	if err := ready(pB2); err != nil {
		return err
	}
	gw2, err := grad(pW2)
	if err != nil {
		return err
	}
	acc := m.acc[:m.hidden]
	for o := range m.out {
		clear(acc)
		for r := range n {
			d := float64(m.dz[r*m.out+o])
			for j, v := range m.h[r*m.hidden : (r+1)*m.hidden] {
				acc[j] += d * float64(v)
			}
		}
		for j, s := range acc {
			gw2[o*m.hidden+j] = float32(s)
		}
	}
	if err := ready(pW2); err != nil {
		return err
	}

	// Back through W2 and the ReLU: dh = (W2^T dz) * [z1 > 0].
	w2 := m.w[pW2]
	for r := range n {
		dh := m.dh[r*m.hidden : (r+1)*m.hidden]
		clear(dh)
		for o, d := range m.dz[r*m.out : (r+1)*m.out] {
			for j, w := range w2[o*m.hidden : (o+1)*m.hidden] {
				dh[j] += d * w
			}
		}
		for j, z := range m.z1[r*m.hidden : (r+1)*m.hidden] {
			if z <= 0 {
				dh[j] = 0
			}
		}
	}

	// Layer 1: db1 = sum_r dh, dW1[j] = sum_r dh[r][j] x[r].
	gb1, err := grad(pB1)
	if err != nil {
		return err
	}
	for j := range m.hidden {
		var s float64
		for r := range n {
			s += float64(m.dh[r*m.hidden+j])
		}
		gb1[j] = float32(s)
	}
	if err := ready(pB1); err != nil {
		return err
	}
	gw1, err := grad(pW1)
	if err != nil {
		return err
	}
	acc = m.acc[:m.in]
	for j := range m.hidden {
		clear(acc)
		for r := range n {
			d := float64(m.dh[r*m.hidden+j])
			if d == 0 {
				continue
			}
			for k, v := range m.x[r*m.in : (r+1)*m.in] {
				acc[k] += d * float64(v)
			}
		}
		for k, s := range acc {
			gw1[j*m.in+k] = float32(s)
		}
	}
	return ready(pW1)
}

// evaluate returns the mean loss and the accuracy (fraction correct) of m
// on d, in chunks of at most batch rows.
func (m *mlp) evaluate(d *dataset, batch int) (loss, accuracy float64) {
	var total float64
	hits := 0
	for lo := 0; lo < d.len(); lo += batch {
		hi := min(lo+batch, d.len())
		l, c := m.forward(d.x[lo*m.in:hi*m.in], d.y[lo:hi])
		total += l * float64(hi-lo)
		hits += c
	}
	return total / float64(d.len()), float64(hits) / float64(d.len())
}
