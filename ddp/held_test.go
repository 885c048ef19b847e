package ddp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestHeldGradSlice: a gradient written into a slice kept from an earlier
// accumulation window (here: fetched once, before the loop), with no Grad
// (or GradBuffer, SetGrad, AddGrad) of it in this window, is never lost
// silently: the lazy zeroing would zero it, so Ready (or, for a parameter
// the Reducer marks unused, Wait) fails with ErrStaleGrad naming the
// parameter and saying to call Grad, and leaves it unmarked. Parameters
// marked ready without a write still reduce as zero, and NoZeroGrad's
// overwrite through a held slice works.
func TestHeldGradSlice(t *testing.T) {
	testutil.NoLeak(t)
	ctx := context.Background()
	w := []Param{{Name: "w", Shape: []int{1}}}
	for _, c := range []struct {
		name string
		o    Options
		op   func(g []float32) // the write
		ok   bool              // the held slice works (NoZeroGrad's =)
	}{
		{"assign", Options{}, func(g []float32) { g[0] = 1.5 }, false},
		{"add", Options{}, func(g []float32) { g[0] += 1.5 }, false},
		{"assign/copy", Options{CopyGrads: true}, func(g []float32) { g[0] = 1.5 }, false},
		{"assign/nozero", Options{NoZeroGrad: true}, func(g []float32) { g[0] = 1.5 }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(ctx, commtest.Solo{}, w, c.o)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			g := mustGrad(r, 0) // once, before the loop
			for step := 1; step <= 3; step++ {
				if err := r.Begin(Sync); err != nil {
					t.Fatal(err)
				}
				c.op(g)
				err := r.Ready(0)
				switch {
				case c.ok && err != nil:
					t.Fatalf("step %d: Ready: %v", step, err)
				case !c.ok && err == nil:
					r.Wait(ctx)
					t.Fatalf("step %d: Ready after a write into a held slice succeeded; w grad = %v (want 1.5)", step, mustGrad(r, 0)[0])
				case !c.ok:
					wantErr(t, err, ErrStaleGrad, `step `+fmt.Sprint(step), `parameter 0 ("w")`, "call Grad(0) in every")
					// Not marked: fetched again, it takes the gradient.
					g = mustGrad(r, 0)
					c.op(g)
					if err := r.Ready(0); err != nil {
						t.Fatal(err)
					}
				}
				if err := r.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				if got := mustGrad(r, 0)[0]; got != 1.5 {
					t.Fatalf("step %d: w grad = %v, want 1.5", step, got)
				}
			}
		})
	}

	t.Run("zero gradient", func(t *testing.T) {
		// Ready with no write at all: a zero gradient, no error.
		r, err := New(ctx, commtest.Solo{}, w, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for step := 1; step <= 3; step++ {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			if step == 1 {
				mustGrad(r, 0)[0] = 1.5
			}
			if err := r.Ready(0); err != nil {
				t.Fatalf("step %d: Ready: %v", step, err)
			}
			if err := r.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if want, got := map[bool]float32{true: 1.5, false: 0}[step == 1], mustGrad(r, 0)[0]; got != want {
				t.Fatalf("step %d: w grad = %v, want %v", step, got, want)
			}
		}
	})

	t.Run("unused", func(t *testing.T) {
		// FindUnusedParameters: a held slice written, its Ready
		// forgotten: Wait fails instead of reducing it as an unused zero.
		r, err := New(ctx, commtest.Solo{}, threeParams, Options{FindUnusedParameters: true})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		g := mustGrad(r, 1)
		if err := r.Begin(Sync); err != nil {
			t.Fatal(err)
		}
		g[0] = 1.5
		wantErr(t, r.Wait(ctx), ErrStaleGrad, `parameter 1 ("fc.weight")`, "Wait")
	})

	t.Run("rebuild", func(t *testing.T) {
		// Two ranks, a layout that the rebuild changes: slices fetched
		// in step 1 point to the old layout's memory in step 2.
		params := []Param{{Name: "a", Shape: []int{200}}, {Name: "b", Shape: []int{200}}}
		cs := newTestGroup(t, 2)
		errs := withReducers(t, cs, params, func() Options { return Options{BucketCap: 800, FirstBucketCap: 800} }, func(rank int, r *Reducer) error {
			var held [2][]float32
			for step := 1; step <= 2; step++ {
				if err := r.Begin(Sync); err != nil {
					return err
				}
				if step == 1 {
					held = [2][]float32{mustGrad(r, 0), mustGrad(r, 1)}
				} else if r.Generation() == 1 {
					return fmt.Errorf("the layout did not change: the test tests nothing")
				}
				for _, i := range []int{0, 1} {
					held[i][0] = 1.5
					err := r.Ready(i)
					switch {
					case step == 1 && err != nil:
						return err
					case step == 2 && (!errors.Is(err, ErrStaleGrad) || !strings.Contains(err.Error(), "layout")):
						return fmt.Errorf("step 2: Ready(%d) after a write into a slice of the old layout: %v, want ErrStaleGrad naming the layout change", i, err)
					case step == 2:
						g := make([]float32, 200)
						g[0] = 1.5
						if err := r.SetGrad(i, g); err != nil {
							return err
						}
					}
				}
				if err := r.Wait(context.Background()); err != nil {
					return err
				}
				for i := range 2 {
					if got := mustGrad(r, i)[0]; got != 1.5 {
						return fmt.Errorf("step %d: grad %d = %v, want 1.5", step, i, got)
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
