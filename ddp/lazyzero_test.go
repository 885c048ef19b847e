package ddp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestBeginIsLazy: Begin after a synced step leaves the memory of a
// gradient never handed out as it is (the last average) and only marks it
// stale; the first Grad zeroes the parameter it hands out and no other,
// and a parameter marked ready untouched is zeroed before its bucket is
// reduced, so it reduces as zero, not as last step's average. A gradient
// that Grad has handed out is zeroed by Begin itself, so that a slice kept
// from the last step takes this step's gradient.
func TestBeginIsLazy(t *testing.T) {
	testutil.NoLeak(t)
	for _, copyGrads := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copyGrads), func(t *testing.T) {
			cs := newTestGroup(t, 2)
			errs := withReducers(t, cs, threeParams, func() Options {
				return Options{CopyGrads: copyGrads, KeepLayout: true}
			}, failFast(func(rank int, r *Reducer) error {
				ctx := context.Background()
				val := func(q, p int) float32 { return float32(10*q + p + 1) }
				avg := func(p int) float32 { return (val(0, p) + val(1, p)) / 2 }
				if err := r.Begin(Sync); err != nil {
					return err
				}
				// Parameter 0 through a slice, kept for step 2; 1 and 2
				// through SetGrad, never handed out.
				held := mustGrad(r, 0)
				for j := range held {
					held[j] = val(rank, 0)
				}
				if err := r.Ready(0); err != nil {
					return err
				}
				for p := 1; p < len(threeParams); p++ {
					g := make([]float32, threeParams[p].Numel())
					for j := range g {
						g[j] = val(rank, p)
					}
					if err := r.SetGrad(p, g); err != nil {
						return err
					}
				}
				if err := r.Wait(ctx); err != nil {
					return err
				}
				if err := r.Begin(Sync); err != nil {
					return err
				}
				// Begin zeroed parameter 0, which was handed out, and left
				// the others' memory holding the average.
				for p := range threeParams {
					want := avg(p)
					if p == 0 {
						want = 0
					}
					for j, x := range r.grad(p) {
						if x != want {
							return fmt.Errorf("after Begin, before Grad: parameter %d elem %d holds %v, want %v", p, j, x, want)
						}
					}
				}
				// Parameter 1: Ready with no Grad on rank 0; on rank 1 its
				// first Grad zeroes it and no other, and 2 is added.
				if rank == 1 {
					g := mustGrad(r, 1)
					for j, x := range g {
						if x != 0 {
							return fmt.Errorf("first Grad(1) elem %d reads %v, want 0", j, x)
						}
					}
					for j, x := range r.grad(2) {
						if x != avg(2) {
							return fmt.Errorf("Grad(1) touched parameter 2: elem %d holds %v, want %v", j, x, avg(2))
						}
					}
					for j := range g {
						g[j] += 2
					}
				}
				// Parameter 0: rank+1 added through the kept slice, with no
				// Grad in this step; parameter 2: rank+1 through AddGrad on
				// a stale gradient.
				for j := range held {
					held[j] += float32(rank + 1)
				}
				for _, p := range []int{1, 0} {
					if err := r.Ready(p); err != nil {
						return err
					}
				}
				two := make([]float32, threeParams[2].Numel())
				for j := range two {
					two[j] = float32(rank + 1)
				}
				if err := r.AddGrad(2, two); err != nil {
					return err
				}
				if err := r.Wait(ctx); err != nil {
					return err
				}
				for p, want := range []float32{1.5, 1, 1.5} {
					// The memory itself, then as the caller sees it.
					for _, g := range [][]float32{r.grad(p), mustGrad(r, p)} {
						for j, x := range g {
							if x != want {
								return fmt.Errorf("step 2 parameter %d elem %d: %v, want %v", p, j, x, want)
							}
						}
					}
				}
				return nil
			}))
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Actions of the model test: how a rank treats one parameter in one step.
const (
	actWrite     = iota // g := Grad(p); g[j] = v; Ready(p)
	actAdd              // g := Grad(p); g[j] += v; Ready(p)
	actReadyOnly        // Ready(p) with no Grad: a zero gradient
	actAddGrad          // AddGrad(p, v)
	actSetGrad          // SetGrad(p, v)
	actSkip             // no call at all (no-sync steps, or unused with FindUnusedParameters)
	nActs
)

// zeroScript is a random sequence of steps shared by the ranks: which
// steps are synced and, per rank and parameter, what each step does.
type zeroScript struct {
	sync []bool
	act  [][][]int // [step][rank][param]
}

func newZeroScript(seed uint64, steps, ranks, params int, findUnused bool) zeroScript {
	rng := rand.New(rand.NewPCG(seed, 11))
	s := zeroScript{sync: make([]bool, steps), act: make([][][]int, steps)}
	for st := range steps {
		s.sync[st] = st == 0 || st == steps-1 || rng.IntN(3) != 0
		s.act[st] = make([][]int, ranks)
		for q := range ranks {
			s.act[st][q] = make([]int, params)
			for p := range params {
				a := rng.IntN(nActs)
				for a == actSkip && s.sync[st] && !findUnused {
					a = rng.IntN(nActs)
				}
				s.act[st][q][p] = a
			}
		}
	}
	return s
}

// zeroVal is rank q's value for element j of parameter p in step st: small
// integers, so that sums and halves are exact in float32.
func zeroVal(q, st, p, j int) float32 { return float32((7*q+3*st+p+j)%17 + 1) }

// want returns, per parameter and element, what every rank's gradient holds
// after step st (the average over ranks of the sums accumulated since the
// last synced step), for a synced step st.
func (s zeroScript) want(st int, params []Param) [][]float32 {
	from := st
	for from > 0 && !s.sync[from-1] {
		from--
	}
	out := make([][]float32, len(params))
	for p := range params {
		out[p] = make([]float32, params[p].Numel())
		for j := range out[p] {
			var sum float32
			for q := range s.act[st] {
				var acc float32
				for k := from; k <= st; k++ {
					switch s.act[k][q][p] {
					case actWrite, actSetGrad:
						acc = zeroVal(q, k, p, j)
					case actAdd, actAddGrad:
						acc += zeroVal(q, k, p, j)
					}
				}
				sum += acc
			}
			out[p][j] = sum / float32(len(s.act[st]))
		}
	}
	return out
}

// TestLazyZeroModel runs random scripts of synced and no-sync steps on two
// ranks, each rank treating its parameters with a random mix of Grad and
// write, Grad and add, Ready alone, AddGrad, SetGrad and (where allowed) no
// call, from several goroutines at once, and checks every reduced gradient
// against a model where Begin after a synced step zeroes every gradient.
// The first Grad of a parameter in a step must also read what the model
// holds (zero, or the sum accumulated in earlier no-sync steps). The
// default options rebuild the buckets after the first synced step, so
// the script crosses the rebuild.
func TestLazyZeroModel(t *testing.T) {
	testutil.NoLeak(t)
	params := make([]Param, 12)
	for i := range params {
		params[i] = Param{Name: fmt.Sprintf("p%d", i), Shape: []int{2 + i%5}}
	}
	const ranks, steps, workers = 2, 14, 3
	for _, v := range []struct {
		name string
		o    Options
	}{
		{"views", Options{}},
		{"copy", Options{CopyGrads: true}},
		{"find-unused", Options{FindUnusedParameters: true}},
		{"find-unused/copy", Options{FindUnusedParameters: true, CopyGrads: true}},
		{"keep-layout", Options{KeepLayout: true}},
	} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%s/seed=%d", v.name, seed), func(t *testing.T) {
				s := newZeroScript(seed, steps, ranks, len(params), v.o.FindUnusedParameters)
				cs := newTestGroup(t, ranks)
				errs := withReducers(t, cs, params, func() Options {
					o := v.o
					o.BucketCap, o.FirstBucketCap = 24, 12
					return o
				}, failFast(func(rank int, r *Reducer) error {
					ctx := context.Background()
					rng := rand.New(rand.NewPCG(uint64(rank), seed))
					// seen[p]: the model's value of p's gradient on this rank
					// (nil: zero), for the first look of each step.
					seen := make([][]float32, len(params))
					for st := range steps {
						if err := r.Begin(modeOf(s.sync[st])); err != nil {
							return err
						}
						if st == 0 || s.sync[st-1] {
							clear(seen)
						}
						order := rng.Perm(len(params))
						errc := make(chan error, workers)
						for w := range workers {
							go func() {
								errc <- zeroWork(r, params, s, st, rank, order[w*len(order)/workers:(w+1)*len(order)/workers], seen)
							}()
						}
						var err error
						for range workers {
							if e := <-errc; e != nil && err == nil {
								err = e
							}
						}
						if err != nil {
							return err
						}
						if !s.sync[st] {
							continue
						}
						if err := r.Wait(ctx); err != nil {
							return err
						}
						want := s.want(st, params)
						for p := range params {
							// The memory itself, then as the caller sees it.
							for _, g := range [][]float32{r.grad(p), mustGrad(r, p)} {
								for j, x := range g {
									if x != want[p][j] {
										return fmt.Errorf("step %d parameter %d elem %d: %v, want %v (actions %v)", st, p, j, x, want[p][j], zeroActs(s, st, p))
									}
								}
							}
						}
					}
					return nil
				}))
				if err := firstErr(errs); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// zeroWork performs this rank's actions of step st on parameters ps, and
// keeps seen (entries of ps only) up to date.
func zeroWork(r *Reducer, params []Param, s zeroScript, st, rank int, ps []int, seen [][]float32) error {
	for _, p := range ps {
		n := params[p].Numel()
		val := make([]float32, n)
		for j := range val {
			val[j] = zeroVal(rank, st, p, j)
		}
		if seen[p] == nil {
			seen[p] = make([]float32, n)
		}
		var err error
		switch s.act[st][rank][p] {
		case actWrite, actAdd:
			g := mustGrad(r, p)
			for j := range g {
				if g[j] != seen[p][j] {
					return fmt.Errorf("step %d: first Grad(%d) elem %d reads %v, want %v (actions %v)", st, p, j, g[j], seen[p][j], zeroActs(s, st, p))
				}
				if s.act[st][rank][p] == actWrite {
					g[j] = val[j]
				} else {
					g[j] += val[j]
				}
			}
			err = r.Ready(p)
		case actReadyOnly:
			err = r.Ready(p)
		case actAddGrad:
			err = r.AddGrad(p, val)
		case actSetGrad:
			err = r.SetGrad(p, val)
		}
		if err != nil {
			return err
		}
		for j := range val {
			switch s.act[st][rank][p] {
			case actWrite, actSetGrad:
				seen[p][j] = val[j]
			case actAdd, actAddGrad:
				seen[p][j] += val[j]
			}
		}
	}
	return nil
}

// zeroActs lists the actions of parameter p up to step st, per rank, for
// an error message.
func zeroActs(s zeroScript, st, p int) string {
	names := [nActs]string{"write", "add", "ready", "AddGrad", "SetGrad", "skip"}
	out := ""
	for k := 0; k <= st; k++ {
		out += fmt.Sprintf(" %d(sync=%v):", k, s.sync[k])
		for q := range s.act[k] {
			out += " " + names[s.act[k][q][p]]
		}
	}
	return out
}

// TestLazyZeroStaticGraph: with StaticGraph, a parameter unused in the
// first synced step is marked at every later synced Begin, still stale;
// it is reduced as zero, not as the last average it held, and reads zero
// after Wait. A parameter accumulated in a no-sync step and marked ready
// untouched in the synced step reduces its accumulated sum.
func TestLazyZeroStaticGraph(t *testing.T) {
	testutil.NoLeak(t)
	for _, copyGrads := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copyGrads), func(t *testing.T) {
			cs := newTestGroup(t, 2)
			errs := withReducers(t, cs, threeParams, func() Options {
				return Options{StaticGraph: true, CopyGrads: copyGrads, KeepLayout: true}
			}, failFast(func(rank int, r *Reducer) error {
				ctx := context.Background()
				set := func(p int, v float32) error {
					g := mustGrad(r, p)
					for j := range g {
						g[j] += v
					}
					return r.Ready(p)
				}
				// Step 0: parameter 1 unused, and so in every synced step.
				if err := r.Begin(Sync); err != nil {
					return err
				}
				for _, p := range []int{2, 0} {
					if err := set(p, float32(rank+1)); err != nil {
						return err
					}
				}
				if err := r.Wait(ctx); err != nil {
					return err
				}
				// Give parameter 1 a nonzero value to go stale, as if its
				// last average were not zero.
				for j := range r.grad(1) {
					r.grad(1)[j] = 42
				}
				for step := 1; step <= 3; step++ {
					if err := r.Begin(modeOf(step != 2)); err != nil {
						return err
					}
					switch step {
					case 2: // no-sync: parameter 2 accumulates
						if err := set(2, float32(rank+1)); err != nil {
							return err
						}
						continue
					case 3: // parameter 2 marked untouched: its sum is reduced
						if err := r.Ready(2); err != nil {
							return err
						}
					default:
						if err := set(2, 1); err != nil {
							return err
						}
					}
					if err := set(0, float32(step)); err != nil {
						return err
					}
					if err := r.Wait(ctx); err != nil {
						return err
					}
					wants := []float32{float32(step), 0, 1}
					if step == 3 {
						wants[2] = 1.5
					}
					for p, want := range wants {
						for _, g := range [][]float32{r.grad(p), mustGrad(r, p)} {
							for j, x := range g {
								if x != want {
									return fmt.Errorf("step %d parameter %d elem %d: %v, want %v", step, p, j, x, want)
								}
							}
						}
					}
					if st := r.Stats(); len(st.Unused) != 1 || st.Unused[0] != 1 {
						return fmt.Errorf("step %d: Unused = %v, want [1]", step, st.Unused)
					}
				}
				return nil
			}))
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// failFast makes a rank that fails abort the group, so that its peers fail
// at once instead of waiting for a collective it will not issue.
func failFast(f func(rank int, r *Reducer) error) func(rank int, r *Reducer) error {
	return func(rank int, r *Reducer) error {
		err := f(rank, r)
		if err != nil {
			r.fail(err)
		}
		return err
	}
}
