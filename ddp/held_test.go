package ddp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestHeldGradSlice: a gradient slice kept from an earlier accumulation
// window (here: fetched once, before the loop) and written with no Grad
// (or GradBuffer, SetGrad, AddGrad) of it in this window takes the
// gradient, whichever elements the write touches: Begin zeroes the memory
// it handed out, as PyTorch's gradient_as_bucket_view keeps param.grad on
// the bucket. Each step writes another value, so that a write lost (the
// last average kept, or zeroed) shows.
func TestHeldGradSlice(t *testing.T) {
	testutil.NoLeak(t)
	ctx := context.Background()
	const n = 5
	for _, c := range []struct {
		name string
		o    Options
		f64  bool  // a float64 parameter, written through GradBuffer's view
		elem []int // the elements written
		add  bool  // += instead of =
	}{
		{"assign/elem0", Options{}, false, []int{0}, false},
		{"assign/elem1", Options{}, false, []int{1}, false},
		{"add/elem1", Options{}, false, []int{1}, true},
		{"add/last", Options{}, false, []int{n - 1}, true},
		{"assign/elem1/copy", Options{CopyGrads: true}, false, []int{1}, false},
		{"add/elem1/float64", Options{}, true, []int{1}, true},
		{"assign/all/nozero", Options{NoZeroGrad: true}, false, []int{0, 1, 2, 3, 4}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := []Param{{Name: "w", Shape: []int{n}}}
			if c.f64 {
				w[0].DType = comm.Float64
			}
			r, err := New(ctx, commtest.Solo{}, w, c.o)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			// Once, before the loop.
			var g32 []float32
			var g64 []float64
			if c.f64 {
				b, err := r.GradBuffer(0)
				if err != nil {
					t.Fatal(err)
				}
				g64 = b.AsFloat64()
			} else {
				g32 = mustGrad(r, 0)
			}
			read := func() []float64 {
				if c.f64 {
					b, err := r.GradBuffer(0)
					if err != nil {
						t.Fatal(err)
					}
					return slices.Clone(b.AsFloat64())
				}
				out := make([]float64, n)
				for j, x := range mustGrad(r, 0) {
					out[j] = float64(x)
				}
				return out
			}
			for step := 1; step <= 4; step++ {
				if err := r.Begin(Sync); err != nil {
					t.Fatal(err)
				}
				v := float64(step) + 0.5
				for _, j := range c.elem {
					switch {
					case c.f64 && c.add:
						g64[j] += v
					case c.f64:
						g64[j] = v
					case c.add:
						g32[j] += float32(v)
					default:
						g32[j] = float32(v)
					}
				}
				if err := r.Ready(0); err != nil {
					t.Fatalf("step %d: Ready after a write into the kept slice: %v", step, err)
				}
				if err := r.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				want := make([]float64, n)
				for _, j := range c.elem {
					want[j] = v
				}
				if got := read(); !slices.Equal(got, want) {
					t.Fatalf("step %d: w grad = %v, want %v", step, got, want)
				}
			}
		})
	}

	t.Run("zero gradient", func(t *testing.T) {
		// Ready with no write at all: a zero gradient, no error.
		r, err := New(ctx, commtest.Solo{}, []Param{{Name: "w", Shape: []int{n}}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for step := 1; step <= 3; step++ {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			if step == 1 {
				mustGrad(r, 0)[1] = 1.5
			}
			if err := r.Ready(0); err != nil {
				t.Fatalf("step %d: Ready: %v", step, err)
			}
			if err := r.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if want, got := map[bool]float32{true: 1.5, false: 0}[step == 1], mustGrad(r, 0)[1]; got != want {
				t.Fatalf("step %d: w grad = %v, want %v", step, got, want)
			}
		}
	})

	t.Run("unused", func(t *testing.T) {
		// FindUnusedParameters: a kept slice written, its Ready
		// forgotten: Wait marks it unused, and its gradient as written
		// is reduced.
		r, err := New(ctx, commtest.Solo{}, threeParams, Options{FindUnusedParameters: true, KeepLayout: true})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		g := mustGrad(r, 1)
		for step := 1; step <= 2; step++ {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			g[1] = float32(step)
			for _, i := range []int{0, 2} {
				if err := r.Ready(i); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if st := r.Stats(); !slices.Equal(st.Unused, []int{1}) {
				t.Fatalf("step %d: Unused %v, want [1]", step, st.Unused)
			}
			if got := mustGrad(r, 1); got[0] != 0 || got[1] != float32(step) {
				t.Fatalf("step %d: fc.weight grad starts %v, want [0 %d ...]", step, got[:2], step)
			}
		}
	})

	t.Run("rebuild", func(t *testing.T) {
		// Two ranks, a layout that the rebuild changes: slices fetched
		// in step 1 point to the old layout's memory in step 2, and a
		// write through one, at any element, is an error.
		params := []Param{{Name: "a", Shape: []int{200}}, {Name: "b", Shape: []int{200}}}
		for _, elem := range []int{0, 1, 199} {
			for _, nozero := range []bool{false, true} {
				t.Run(fmt.Sprintf("elem=%d/nozero=%v", elem, nozero), func(t *testing.T) {
					cs := newTestGroup(t, 2)
					errs := withReducers(t, cs, params, func() Options {
						return Options{BucketCap: 800, FirstBucketCap: 800, NoZeroGrad: nozero}
					}, failFast(func(rank int, r *Reducer) error {
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
								held[i][elem] = 1.5
								err := r.Ready(i)
								switch {
								case step == 1 && err != nil:
									return err
								case step == 2 && (!errors.Is(err, ErrStaleGrad) || !strings.Contains(err.Error(), "layout")):
									return fmt.Errorf("step 2: Ready(%d) after a write at elem %d into a slice of the old layout: %v, want ErrStaleGrad naming the layout change", i, elem, err)
								case step == 2:
									g := mustGrad(r, i)
									clear(g)
									g[elem] = 1.5
									if err := r.Ready(i); err != nil {
										return fmt.Errorf("step 2: Ready(%d) after fetching the gradient again: %v", i, err)
									}
								}
							}
							if err := r.Wait(context.Background()); err != nil {
								return err
							}
							for i := range 2 {
								if got := mustGrad(r, i)[elem]; got != 1.5 {
									return fmt.Errorf("step %d: grad %d = %v, want 1.5", step, i, got)
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
	})
}
