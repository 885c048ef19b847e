package ddptrain_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
)

// TestEquivalence trains the least-squares problem for lsqSteps steps
// over 1, 2 and 3 inproc ranks, each on lsqBatch/N examples per step,
// against GoMLX's own train.Trainer on the same lsqBatch examples in the
// same order, with SGD and with Adam, and checks after every step that the
// ranks' variables (and Adam's moments) are within a bound derived from
// float32 rounding of plain GoMLX's.
//
// # The bound
//
// u = 2^-24 is float32's unit roundoff and γ(n) = n·u/(1-n·u), so that a
// sum of n terms computed in any order is within γ(n-1)·Σ|terms| of the
// exact value, a dot product of n products within γ(n)·Σ|products|, and γ(j)+γ(k)+γ(j)·γ(k) <= γ(j+k) (Higham, Accuracy and
// Stability of Numerical Algorithms, §3.1, §3.4).
//
// Gradient. For one head with m outputs, a batch of b examples x_j
// (x̂_j = [x_j, 1], d = lsqIn inputs) and c = 1/(b·m), the loss's gradient
// with respect to weight (a, o) (a = d is the bias) is
// G = 2c·Σ_j x̂_ja·r_jo, with r_jo = x̂_j·ŵ_o - y_jo. GoMLX computes
// p = Dot(x, W) + b (d products and d additions: within γ(d+1)·P_jo,
// P_jo = Σ_a |x̂_ja·ŵ_ao|), r = p - y (γ(d+2)·(P+|y|)), the mean's
// adjoint 2·fl(fl(c)·r) (two roundings; Square(x) is Mul(x, x), whose
// two adjoints add exactly), and the weight's gradient as a broadcast
// product and a sum over the b examples (γ(b)). Collecting the terms with
// the rule above, the computed gradient is within
//
//	γ(b+d+4)·M,   M = 2c·Σ_j |x̂_ja|·(P_jo + |y_jo|)
//
// of G at the weights it was computed at. One process (plain GoMLX) has
// b = B. With N ranks each rank's gradient has b = B/N and c = N/(B·m),
// the mean over ranks of their exact gradients is exactly G, of their
// magnitudes exactly M, and the all-reduce's average is within
// (a + γ(N-1)·(1+a))·mean_r|g_r| of the exact average of the g_r, with
// a = 3u (package hooks, "Accuracy", for a float32 wire). So the averaged
// gradient is within
//
//	E_N = [γ(B/N+d+4) + (3u + γ(N-1)·(1+3u))·(1+γ(B/N+d+4))]·M
//
// of G, against E_1 = γ(B+d+4)·M for plain GoMLX.
//
// Propagation. The two runs start from equal weights (rank 0's, which the
// trainer broadcasts: the other ranks initialize theirs to 7). Let D bound
// |w_N - w_1| elementwise before a step. The loss is quadratic, so
// G(w_N) - G(w_1) = H·(w_N - w_1), with H = 2c·Σ_j x̂_j·x̂_jᵀ per output;
// the gradients then differ by at most Dg = |H|·D + E_1 + E_N.
//
// SGD (GoMLX's, with η = lr/√step computed alike in both runs) computes
// fl(w - fl(η·g)), within 2u·(η|g| + |w'|) of w - η·g, so
//
//	D' = |I - ηH|·D + η·(E_1+E_N) + 2u·Σ_runs (η·(|G|+E) + |w'|).
//
// Adam (GoMLX's: m' = β1·m + (1-β1)·g, v' = β2·v + (1-β2)·g², the step
// lr·d1·m'/(√(d2·v') + ε) with d1 = 1/(1-β1^t), d2 = 1/(1-β2^t)) gives,
// with 1-β exact in float32 (Sterbenz) and magnitudes |G|+E for |g|,
//
//	Dm' = β1·Dm + (1-β1)·Dg + Σ_runs γ(2)·(β1|m| + (1-β1)|g|)
//	Dv' = β2·Dv + (1-β2)·Dg·Σ_runs|g| + Σ_runs γ(3)·(β2|v| + (1-β2)·g²)
//	Dw' = Dw + |Δf| + Σ_runs γ(6)·|f| + 2u·Σ_runs |w'|
//
// where |Δf| <= lr·d1·(Dm'/(S+ε) + |m'|·ΔS/(S+ε)²), S = √(d2·v') the
// smaller of the runs', ΔS <= √d2·min(√Dv', Dv'/(√v'_1 + √v'_N)), and γ(6)
// covers the step's six roundings. d1 and d2 are float32 values common to
// both runs; the float64 ones used here are widened by their rounding
// (1-β^t cancels: up to u·(3+β^t/(1-β^t)) relatively).
//
// Magnitudes (|w|, |m|, |v| before a step and |w'|, |m'|, |v'| after it)
// are each run's own, read from its variables; the differences are only
// ever the propagated bounds, from D = 0. Quantities of the bound are
// computed in float64, whose rounding (1e-16 relative) is far below the
// terms kept.
func TestEquivalence(t *testing.T) {
	const steps = 6
	p := newLSQ(steps, 1)
	cases := []struct {
		name string
		n    int
		hook string
		o    ddptrain.Options
	}{
		{"1 rank", 1, "", smallBuckets},
		{"2 ranks", 2, "", smallBuckets},
		{"3 ranks", 3, "", smallBuckets},
		// One bucket for everything, every gradient marked ready at the
		// end: the other end of the hand-off's choices.
		{"3 ranks, one bucket, ready at the end", 3, "", ddptrain.Options{ReadyBatch: 100}},
		// PyTorch's allreduce_hook: divide, then sum.
		{"2 ranks, allreduce hook, ready in pairs", 2, "allreduce", ddptrain.Options{Reducer: smallBuckets.Reducer, ReadyBatch: 2}},
	}
	for _, kind := range []string{"sgd", "adam"} {
		plain := runPlain(t, p, run{kind: kind, steps: steps})
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", kind, tc.name), func(t *testing.T) {
				got := runRanks(t, p, run{kind: kind, steps: steps, hook: tc.hook, o: tc.o}, tc.n)
				checkBound(t, p, kind, tc.n, plain, got, 1)
			})
		}
	}
}

// TestEquivalenceNoSync is TestEquivalence for steps that accumulate two
// micro-batches (AccumulateStep, then TrainStep) against GoMLX's own
// gradient accumulation over the same two batches: GoMLX averages them
// where ddpgo sums them (PyTorch's no_sync), so the plain run's SGD takes
// twice the learning rate, which makes the steps equal (fl(0.2) is
// 2·fl(0.1)). Each rank's sum of its two gradients is one more rounding:
// the bound's γ terms count it.
func TestEquivalenceNoSync(t *testing.T) {
	const steps = 3
	p := newLSQ(2*steps, 2)
	rn := run{kind: "sgd", steps: steps, acc: 2, o: smallBuckets}
	plain := runPlain(t, p, rn)
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			checkBound(t, p, "sgd", n, plain, runRanks(t, p, rn, n), 2)
		})
	}
}

// checkBound propagates the derivation's bounds along the two runs and
// fails if the ranks' state leaves them after any step. accumulate is the
// number of micro-batches of lsqBatch each step's gradient sums (no-sync
// accumulation; the plain run averages them and doubles lr, which is the
// same step).
func checkBound(t *testing.T, p *lsq, kind string, n int, plain, got []state, accumulate int) {
	t.Helper()
	var (
		prev1, prevN = p.initial(), p.initial()
		d            = newBounds(p, kind == "adam")
		worst        float64 // largest |w_N - w_1| / D seen
		rel          float64 // largest D / max |w_1|
	)
	for k := range plain {
		lo := k * lsqBatch * accumulate
		hi := lo + lsqBatch*accumulate
		d.step(p, k+1, n, lo, hi, accumulate, prev1, prevN, plain[k], got[k])
		for _, c := range []struct {
			what  string
			a, b  [][]float64
			bound [][]float64
		}{{"weight", plain[k].w, got[k].w, d.w}, {"first moment", plain[k].m, got[k].m, d.m}, {"second moment", plain[k].v, got[k].v, d.v}} {
			for h := range c.a {
				for i := range c.a[h] {
					diff := math.Abs(c.a[h][i] - c.b[h][i])
					if diff > c.bound[h][i] {
						t.Fatalf("%s, %d ranks, step %d: %s %d of head %d is %.9g against plain GoMLX's %.9g: %.3g apart, bound %.3g",
							kind, n, k+1, c.what, i, h, c.b[h][i], c.a[h][i], diff, c.bound[h][i])
					}
					if c.what == "weight" {
						worst = math.Max(worst, diff/c.bound[h][i])
						rel = math.Max(rel, c.bound[h][i]/maxAbs(c.a[h]))
					}
				}
			}
		}
		prev1, prevN = plain[k], got[k]
	}
	t.Logf("%s, %d ranks, %d steps: largest |w_N-w_1| is %.2f of its bound; the bound is at most %.2g of the largest |w|", kind, n, len(plain), worst, rel)
}

// initial is the state before the first step.
func (p *lsq) initial() state {
	var s state
	for h, m := range lsqHeads {
		w := make([]float64, len(p.w0[h]))
		for i, x := range p.w0[h] {
			w[i] = float64(x)
		}
		s.w = append(s.w, w)
		s.m = append(s.m, make([]float64, (lsqIn+1)*m))
		s.v = append(s.v, make([]float64, (lsqIn+1)*m))
	}
	return s
}

const u32 = 0x1p-24 // float32's unit roundoff

func gamma(n int) float64 { return float64(n) * u32 / (1 - float64(n)*u32) }

// bounds are the propagated bounds D on |w_N - w_1|, |m_N - m_1| and
// |v_N - v_1|, per head, laid out as the state.
type bounds struct {
	adam    bool
	w, m, v [][]float64
}

func newBounds(p *lsq, adam bool) *bounds {
	z := p.initial().w
	return &bounds{adam: adam, w: zeros(z), m: zeros(z), v: zeros(z)}
}

func zeros(like [][]float64) [][]float64 {
	out := make([][]float64, len(like))
	for h := range like {
		out[h] = make([]float64, len(like[h]))
	}
	return out
}

// grad is, for one head at weights w on examples [lo, hi), the exact
// gradient G, its magnitude M and |H| (the Hessian's absolute values, the
// same for every output: (d+1)×(d+1)), and H itself.
func (p *lsq) grad(h int, w []float64, lo, hi int) (g, mag, habs, hess []float64) {
	m := lsqHeads[h]
	c := 1 / float64((hi-lo)*m)
	g = make([]float64, (lsqIn+1)*m)
	mag = make([]float64, (lsqIn+1)*m)
	hess = make([]float64, (lsqIn+1)*(lsqIn+1))
	habs = make([]float64, (lsqIn+1)*(lsqIn+1))
	xh := make([]float64, lsqIn+1)
	for j := lo; j < hi; j++ {
		for a := range lsqIn {
			xh[a] = float64(p.x[j*lsqIn+a])
		}
		xh[lsqIn] = 1
		for o := range m {
			y := float64(p.y[h][j*m+o])
			r, mp := -y, 0.0
			for a := range xh {
				r += xh[a] * w[a*m+o]
				mp += math.Abs(xh[a] * w[a*m+o])
			}
			for a := range xh {
				g[a*m+o] += 2 * c * xh[a] * r
				mag[a*m+o] += 2 * c * math.Abs(xh[a]) * (mp + math.Abs(y))
			}
		}
		for a := range xh {
			for b := range xh {
				hess[a*(lsqIn+1)+b] += 2 * c * xh[a] * xh[b]
				habs[a*(lsqIn+1)+b] += 2 * c * math.Abs(xh[a]*xh[b])
			}
		}
	}
	return g, mag, habs, hess
}

// rounding returns the factor e of a run's gradient bound e·M: n ranks
// (0 for plain GoMLX), a global batch of b examples, acc micro-batches
// summed on each rank (each sum one more rounding).
func rounding(n, b, acc int) float64 {
	extra := acc - 1
	if n == 0 {
		return gamma(b + lsqIn + 4 + extra)
	}
	local := gamma(b/n + lsqIn + 4 + extra)
	a := 3 * u32
	return local + (a+gamma(n-1)*(1+a))*(1+local)
}

// step advances the bounds over step k (from 1), on examples [lo, hi) in
// acc micro-batches, given both runs' states before (b1, bN) and after
// (a1, aN) it.
func (d *bounds) step(p *lsq, k, n, lo, hi, acc int, b1, bN, a1, aN state) {
	for h, m := range lsqHeads {
		// The exact gradient, magnitude and Hessian of each micro-batch,
		// summed.
		var g1, gN, m1, mN, habs, hess []float64
		for mb := range acc {
			l, r := lo+mb*(hi-lo)/acc, lo+(mb+1)*(hi-lo)/acc
			x1, y1, ha, he := p.grad(h, b1.w[h], l, r)
			xN, yN, _, _ := p.grad(h, bN.w[h], l, r)
			g1, m1 = addTo(g1, x1), addTo(m1, y1)
			gN, mN = addTo(gN, xN), addTo(mN, yN)
			habs, hess = addTo(habs, ha), addTo(hess, he)
		}
		b := (hi - lo) / acc
		e1, eN := rounding(0, b, acc), rounding(n, b, acc)
		nw := lsqIn + 1
		// |H|·D (and the signed product for SGD's exact map), per output.
		hd := make([]float64, len(d.w[h]))
		var ihd []float64 // |I - ηH|·D, filled by SGD
		for o := range m {
			for a := range nw {
				for c := range nw {
					hd[a*m+o] += habs[a*nw+c] * d.w[h][c*m+o]
				}
			}
		}
		if !d.adam {
			// SGD with GoMLX's default decay: η = lr/√k. The float32 η
			// both runs use is within 4u of this one: widen |I - ηH| by
			// 4u·η·|H|.
			eta := float64(float32(0.1)) / math.Sqrt(float64(k))
			ihd = make([]float64, len(d.w[h]))
			for o := range m {
				for a := range nw {
					for c := range nw {
						id := 0.0
						if a == c {
							id = 1
						}
						ihd[a*m+o] += (math.Abs(id-eta*hess[a*nw+c]) + 4*u32*eta*habs[a*nw+c]) * d.w[h][c*m+o]
					}
				}
			}
			for i := range d.w[h] {
				E1, EN := e1*m1[i], eN*mN[i]
				d.w[h][i] = ihd[i] + eta*(E1+EN) +
					2*u32*(eta*(math.Abs(g1[i])+E1)+eta*(math.Abs(gN[i])+EN)+math.Abs(a1.w[h][i])+math.Abs(aN.w[h][i]))
			}
			continue
		}
		// Adam, with GoMLX's defaults but lr: the float32 constants.
		lr := float64(float32(0.01))
		beta1, beta2 := float64(float32(0.9)), float64(float32(0.999))
		eps := float64(float32(1e-7))
		p1, p2 := math.Pow(beta1, float64(k)), math.Pow(beta2, float64(k))
		d1, d2 := 1/(1-p1), 1/(1-p2)
		k1, k2 := 2*u32*(3+p1/(1-p1)), 2*u32*(3+p2/(1-p2))
		d1hi, d2lo, d2hi := d1*(1+k1), d2*(1-k2), d2*(1+k2)
		for i := range d.w[h] {
			E1, EN := e1*m1[i], eN*mN[i]
			G1, GN := math.Abs(g1[i])+E1, math.Abs(gN[i])+EN // bounds on |g|
			dg := hd[i] + E1 + EN
			dm := beta1*d.m[h][i] + (1-beta1)*dg +
				gamma(2)*(beta1*math.Abs(b1.m[h][i])+(1-beta1)*G1) + gamma(2)*(beta1*math.Abs(bN.m[h][i])+(1-beta1)*GN)
			dv := beta2*d.v[h][i] + (1-beta2)*dg*(G1+GN) +
				gamma(3)*(beta2*math.Abs(b1.v[h][i])+(1-beta2)*G1*G1) + gamma(3)*(beta2*math.Abs(bN.v[h][i])+(1-beta2)*GN*GN)
			ma1, maN := math.Abs(a1.m[h][i]), math.Abs(aN.m[h][i])
			va1, vaN := math.Max(a1.v[h][i], 0), math.Max(aN.v[h][i], 0)
			s := math.Sqrt(d2lo * math.Min(va1, vaN))
			ds := math.Sqrt(d2hi) * math.Sqrt(dv)
			if q := math.Sqrt(va1) + math.Sqrt(vaN); q > 0 {
				ds = math.Min(ds, math.Sqrt(d2hi)*dv/q)
			}
			df := lr * d1hi * (dm/(s+eps) + math.Max(ma1, maN)*ds/((s+eps)*(s+eps)))
			f1 := lr * d1hi * ma1 / (math.Sqrt(d2lo*va1) + eps)
			fN := lr * d1hi * maN / (math.Sqrt(d2lo*vaN) + eps)
			d.w[h][i] += df + gamma(6)*(f1+fN) + 2*u32*(math.Abs(a1.w[h][i])+math.Abs(aN.w[h][i]))
			d.m[h][i], d.v[h][i] = dm, dv
		}
	}
}

func addTo(dst, src []float64) []float64 {
	if dst == nil {
		return append([]float64(nil), src...)
	}
	for i := range src {
		dst[i] += src[i]
	}
	return dst
}

func maxAbs(x []float64) float64 {
	m := 0.0
	for _, v := range x {
		m = math.Max(m, math.Abs(v))
	}
	return m
}
