package ddp

import (
	"context"
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestNoZeroGrad checks NoZeroGrad's contract on two ranks, with views and
// with CopyGrads: Begin after a synced step leaves the last average in
// place (no zeroing), a gradient overwritten in the first step of a window
// and added to in later no-sync steps reduces to the average of the local
// sums, and a parameter the caller leaves unmarked through a whole window
// (marked unused by the Reducer, FindUnusedParameters or StaticGraph) is
// reduced as zero, not as the stale average it still held.
func TestNoZeroGrad(t *testing.T) {
	testutil.NoLeak(t)
	for _, v := range []struct {
		name string
		o    Options
	}{
		{"find-unused", Options{FindUnusedParameters: true}},
		{"find-unused/copy", Options{FindUnusedParameters: true, CopyGrads: true}},
		{"static", Options{StaticGraph: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			cs := newTestGroup(t, 2)
			errs := withReducers(t, cs, threeParams, func() Options {
				o := v.o
				o.NoZeroGrad, o.KeepLayout = true, true
				return o
			}, func(rank int, r *Reducer) error {
				ctx := context.Background()
				local := func(q, step, p int) float32 { return float32(10*step + 2*q + p + 1) }
				val := func(step, p int) float32 { return local(rank, step, p) }
				// mean returns the average over both ranks of the sum of
				// their local values over steps.
				mean := func(p int, steps ...int) float32 {
					var s [2]float32
					for q := range s {
						for _, st := range steps {
							s[q] += local(q, st, p)
						}
					}
					return (s[0] + s[1]) / 2
				}
				set := func(step, p int, add bool) error {
					g := mustGrad(r, p)
					for j := range g {
						if add {
							g[j] += val(step, p)
						} else {
							g[j] = val(step, p)
						}
					}
					return r.Ready(p)
				}
				// Step 0: every parameter used, except parameter 1 with
				// StaticGraph (the static set is fixed from the first step).
				if err := r.Begin(Sync); err != nil {
					return err
				}
				for p := range threeParams {
					if p == 1 && v.o.StaticGraph {
						continue
					}
					if err := set(0, p, false); err != nil {
						return err
					}
				}
				if err := r.Wait(ctx); err != nil {
					return err
				}
				// Step 1 (no-sync) and 2 (synced): one window. Parameter 1
				// is never marked by the caller; the others are overwritten,
				// then added to.
				if err := r.Begin(NoSync); err != nil {
					return err
				}
				for p := range threeParams {
					if p == 1 {
						if !v.o.StaticGraph {
							for j, x := range mustGrad(r, p) {
								if x != mean(p, 0) {
									return fmt.Errorf("NoZeroGrad: after Begin parameter %d elem %d holds %v, want the last average %v", p, j, x, mean(p, 0))
								}
							}
						}
						continue
					}
					if err := set(1, p, false); err != nil {
						return err
					}
				}
				if err := r.Begin(Sync); err != nil {
					return err
				}
				for _, p := range []int{2, 0} {
					if err := set(2, p, true); err != nil {
						return err
					}
				}
				if err := r.Wait(ctx); err != nil {
					return err
				}
				for p := range threeParams {
					var want float32
					if p != 1 {
						want = mean(p, 1, 2)
					}
					for j, x := range mustGrad(r, p) {
						if x != want {
							return fmt.Errorf("step 2 parameter %d (%q) elem %d: %v, want %v", p, threeParams[p].Name, j, x, want)
						}
					}
				}
				if st := r.Stats(); len(st.Unused) != 1 || st.Unused[0] != 1 {
					return fmt.Errorf("Unused = %v, want [1]", st.Unused)
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNoZeroGradAddGrad: with NoZeroGrad, AddGrad accumulates from zero in
// the first step of a window (the stale average is overwritten, not added
// to) and adds in later steps, so a window of AddGrad calls reduces the
// average of the local sums.
func TestNoZeroGradAddGrad(t *testing.T) {
	testutil.NoLeak(t)
	for _, copyGrads := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copyGrads), func(t *testing.T) {
			cs := newTestGroup(t, 2)
			errs := withReducers(t, cs, threeParams, func() Options {
				return Options{NoZeroGrad: true, CopyGrads: copyGrads, KeepLayout: true}
			}, func(rank int, r *Reducer) error {
				ctx := context.Background()
				local := func(q, step, p, j int) float32 { return float32(100*step + 10*q + p + j) }
				for window := range 3 {
					steps := []int{2 * window, 2*window + 1} // a no-sync step, then a synced one
					for k, step := range steps {
						if err := r.Begin(modeOf(k == 1)); err != nil {
							return err
						}
						for p := range threeParams {
							g := make([]float32, threeParams[p].Numel())
							for j := range g {
								g[j] = local(rank, step, p, j)
							}
							if err := r.AddGrad(p, g); err != nil {
								return err
							}
						}
					}
					if err := r.Wait(ctx); err != nil {
						return err
					}
					for p := range threeParams {
						for j, x := range mustGrad(r, p) {
							var want float32
							for q := range 2 {
								want += (local(q, steps[0], p, j) + local(q, steps[1], p, j)) / 2
							}
							if x != want {
								return fmt.Errorf("window %d parameter %d elem %d: %v, want %v", window, p, j, x, want)
							}
						}
					}
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}
