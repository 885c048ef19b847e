package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomBatch returns n rows of uniform pixels in [0,1) and random labels.
func randomBatch(seed uint64, n, in int) ([]float32, []int32) {
	rng := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n*in)
	for i := range x {
		x[i] = rng.Float32()
	}
	y := make([]int32, n)
	for i := range y {
		y[i] = int32(rng.IntN(Classes))
	}
	return x, y
}

// gradients runs forward and backward and returns the gradients and the
// order in which backward marked them ready.
func gradients(t *testing.T, m *mlp, x []float32, y []int32) ([][]float32, []int) {
	t.Helper()
	g := make([][]float32, numParams)
	for i, w := range m.values() {
		g[i] = make([]float32, len(w))
	}
	var order []int
	m.forward(x, y)
	err := m.backward(func(i int) ([]float32, error) { return g[i], nil }, func(i int) error {
		order = append(order, i)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return g, order
}

// TestBackwardFiniteDifferences checks every analytic gradient component of
// a small model against a central finite difference of the forward loss.
func TestBackwardFiniteDifferences(t *testing.T) {
	for _, tc := range []struct {
		name            string
		in, hidden, out int
		rows            int
	}{
		{"one row", 5, 4, 3, 1},
		{"batch", 7, 6, Classes, 9},
		{"digits shape, few rows", Pixels, 16, Classes, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMLP(3, tc.in, tc.hidden, tc.out)
			// Non-zero biases, so that the bias gradients are exercised with
			// a ReLU pattern that is not the one of a zero bias.
			rng := rand.New(rand.NewPCG(4, 4))
			for _, b := range [][]float32{m.w[pB1], m.w[pB2]} {
				for i := range b {
					b[i] = float32(rng.NormFloat64() * 0.3)
				}
			}
			x, y := randomBatch(5, tc.rows, tc.in)
			for i := range y {
				y[i] %= int32(tc.out)
			}
			g, _ := gradients(t, m, x, y)
			names, _ := m.shapes()
			const h = 1e-3
			checked := 0
			for p, w := range m.values() {
				for k := range w {
					orig := w[k]
					w[k] = orig + h
					up, _ := m.forward(x, y)
					hiUp := float64(w[k])
					w[k] = orig - h
					down, _ := m.forward(x, y)
					hiDown := float64(w[k])
					w[k] = orig
					fd := (up - down) / (hiUp - hiDown)
					got := float64(g[p][k])
					if math.Abs(fd-got) > 2e-3*max(1, math.Abs(fd)) {
						t.Errorf("%s[%d]: backward %.6g, finite difference %.6g", names[p], k, got, fd)
					}
					checked++
				}
			}
			if want := tc.hidden*tc.in + tc.hidden + tc.out*tc.hidden + tc.out; checked != want {
				t.Fatalf("checked %d components, want %d", checked, want)
			}
		})
	}
}

// TestBackwardReadyOrder checks that the last layer is marked ready first,
// each parameter exactly once.
func TestBackwardReadyOrder(t *testing.T) {
	m := newMLP(1, Pixels, 8, Classes)
	x, y := randomBatch(2, 3, Pixels)
	_, order := gradients(t, m, x, y)
	if want := []int{pB2, pW2, pB1, pW1}; !slices.Equal(order, want) {
		t.Fatalf("ready order %v, want %v", order, want)
	}
}

// TestBackwardStopsOnReadyError checks that an error from ready is returned
// and that backward touches no gradient after it.
func TestBackwardStopsOnReadyError(t *testing.T) {
	m := newMLP(1, 4, 3, 2)
	x, y := randomBatch(2, 2, 4)
	for i := range y {
		y[i] %= 2
	}
	m.forward(x, y)
	errStop := errorString("stop")
	var asked []int
	err := m.backward(func(i int) ([]float32, error) {
		asked = append(asked, i)
		return make([]float32, len(m.w[i])), nil
	}, func(i int) error {
		if i == pW2 {
			return errStop
		}
		return nil
	})
	if err != errStop {
		t.Fatalf("backward returned %v, want %v", err, errStop)
	}
	if want := []int{pB2, pW2}; !slices.Equal(asked, want) {
		t.Fatalf("gradients requested %v, want %v", asked, want)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestForwardLoss checks the loss against a direct float64 computation.
func TestForwardLoss(t *testing.T) {
	m := newMLP(9, 3, 2, 3)
	x := []float32{0.5, -1, 2, 1, 0, 0}
	y := []int32{2, 0}
	var want float64
	hits := 0
	for r := range 2 {
		h := make([]float64, 2)
		for j := range 2 {
			s := float64(m.w[pB1][j])
			for k := range 3 {
				s += float64(m.w[pW1][j*3+k]) * float64(x[r*3+k])
			}
			h[j] = math.Max(s, 0)
		}
		z := make([]float64, 3)
		best := 0
		for o := range 3 {
			z[o] = float64(m.w[pB2][o]) + float64(m.w[pW2][o*2])*h[0] + float64(m.w[pW2][o*2+1])*h[1]
			if z[o] > z[best] {
				best = o
			}
		}
		if best == int(y[r]) {
			hits++
		}
		want += math.Log(math.Exp(z[0])+math.Exp(z[1])+math.Exp(z[2])) - z[y[r]]
	}
	want /= 2
	got, c := m.forward(x, y)
	if math.Abs(got-want) > 1e-5 || c != hits {
		t.Fatalf("forward = (%v, %d), want (%v, %d)", got, c, want, hits)
	}
}

// TestTrainingStepAllocatesNothing checks that forward, backward and the
// optimizer allocate nothing once the buffers have grown.
func TestTrainingStepAllocatesNothing(t *testing.T) {
	m := newMLP(1, Pixels, 32, Classes)
	x, y := randomBatch(2, 16, Pixels)
	g := make([][]float32, numParams)
	for i, w := range m.values() {
		g[i] = make([]float32, len(w))
	}
	grad := func(i int) ([]float32, error) { return g[i], nil }
	ready := func(int) error { return nil }
	opt := newSGD(m.values(), 0.1, 0.9)
	step := func() {
		m.forward(x, y)
		if err := m.backward(grad, ready); err != nil {
			t.Fatal(err)
		}
		if err := opt.step(m.values(), grad); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if n := testing.AllocsPerRun(10, step); n != 0 {
		t.Fatalf("a training step allocates %v times, want 0", n)
	}
}
