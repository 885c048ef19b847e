package ddp

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestGradErrors: Grad and GradBuffer fail as Ready does for a bad index,
// with ErrBusy while the parameter's bucket is on the wire, and with
// ErrClosed after Close; they hand the gradient out again once reduced.
func TestGradErrors(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	ctx := context.Background()
	issued := make(chan struct{})
	errs := withReducers(t, cs, threeParams, func() Options { return Options{} }, func(rank int, r *Reducer) error {
		if rank == 0 {
			_, err := r.Grad(3)
			wantErr(t, err, ErrIndex, "rank 0: Grad(3)", "3 parameters")
			_, err = r.GradBuffer(-1)
			wantErr(t, err, ErrIndex, "rank 0: GradBuffer(-1)", "3 parameters")
		} else {
			// Rank 1 issues its bucket only after rank 0 has looked
			// at its own on the wire.
			<-issued
		}
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := range threeParams {
			if err := r.SetGrad(i, make([]float32, threeParams[i].Numel())); err != nil {
				return err
			}
		}
		if rank == 0 {
			// Rank 1 has issued nothing yet: the bucket stays on the wire.
			_, err := r.Grad(2)
			close(issued) // before a failed check could leave rank 1 waiting
			wantErr(t, err, ErrBusy, `parameter "fc.bias"`, "bucket 0 is being reduced")
		}
		if err := r.Wait(ctx); err != nil {
			return err
		}
		if _, err := r.Grad(2); err != nil {
			t.Errorf("rank %d: Grad after Wait: %v", rank, err)
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	r, err := New(ctx, commtest.Solo{}, threeParams, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	_, err = r.Grad(0)
	wantErr(t, err, ErrClosed)
}

func TestIndex(t *testing.T) {
	params := append(slices.Clone(threeParams), Param{Name: "fc.bias", Shape: []int{1}})
	r, err := New(context.Background(), commtest.Solo{}, params, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if i, err := r.Index("fc.weight"); i != 1 || err != nil {
		t.Errorf("Index(fc.weight) = %d, %v; want 1", i, err)
	}
	_, err = r.Index("fc.Weight")
	wantErr(t, err, ErrIndex, `no parameter is named "fc.Weight"`)
	_, err = r.Index("fc.bias")
	wantErr(t, err, ErrIndex, `parameters 2 and 3 are both named "fc.bias"`)
}

// TestGeneration: the layout generation changes exactly at the Begin that
// adopts the rebuilt layout, and Grad's slices change with it.
func TestGeneration(t *testing.T) {
	for _, keep := range []bool{false, true} {
		r, err := New(context.Background(), commtest.Solo{}, threeParams, Options{BucketCap: 1, FirstBucketCap: 1, KeepLayout: keep})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		gens := []uint64{r.Generation()}
		var first []float32
		for step := range 3 {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			gens = append(gens, r.Generation())
			g := mustGrad(r, 0)
			if step == 0 {
				first = g
			}
			// Out of the initial order, so the rebuilt layout differs.
			for _, i := range []int{0, 1, 2} {
				if err := r.Ready(i); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			if same := &g[0] == &first[0]; same != (gens[len(gens)-1] == 1) {
				t.Errorf("KeepLayout %v step %d: generation %d but Grad's slice same as step 1's: %v", keep, step+1, gens[len(gens)-1], same)
			}
		}
		want := []uint64{1, 1, 2, 2}
		if keep {
			want = []uint64{1, 1, 1, 1}
		}
		if !slices.Equal(gens, want) {
			t.Errorf("KeepLayout %v: generations after New and each Begin %v, want %v", keep, gens, want)
		}
	}
}

// TestStatsCopy: what Stats returns is the caller's: later steps do not
// overwrite its slices.
func TestStatsCopy(t *testing.T) {
	r, err := New(context.Background(), commtest.Solo{}, threeParams, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var kept StepStats
	var ready []time.Duration
	var buckets []BucketStats
	for step := range 3 {
		if err := r.Begin(Sync); err != nil {
			t.Fatal(err)
		}
		for i := range threeParams {
			if err := r.Ready(i); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			kept = r.Stats()
			ready, buckets = slices.Clone(kept.ParamReady), slices.Clone(kept.Buckets)
		}
	}
	last := r.Stats()
	if kept.Step != 1 || last.Step != 3 {
		t.Fatalf("steps %d and %d, want 1 and 3", kept.Step, last.Step)
	}
	if &kept.ParamReady[0] == &last.ParamReady[0] || &kept.Buckets[0] == &last.Buckets[0] {
		t.Fatal("two calls of Stats share slices")
	}
	// Other steps ran since: the first copy must still hold its own values.
	if !slices.Equal(kept.ParamReady, ready) || !slices.Equal(kept.Buckets, buckets) {
		t.Fatal("a later step changed the slices Stats returned")
	}
}

// TestWaitEach: each is called once per bucket, in bucket order, with the
// bucket's parameters, whose gradients then already hold the average
// while later buckets may still be on the wire; a no-sync step reports
// nothing; a warm step with WaitEach allocates nothing.
func TestWaitEach(t *testing.T) {
	testutil.NoLeak(t)
	params := []Param{{Name: "a", Shape: []int{40}}, {Name: "b", Shape: []int{3}}, {Name: "c", Shape: []int{50}}, {Name: "d", Shape: []int{7}}}
	cs := newTestGroup(t, 2)
	errs := withReducers(t, cs, params, func() Options { return Options{BucketCap: 160, FirstBucketCap: 100} }, func(rank int, r *Reducer) error {
		ctx := context.Background()
		var got []Reduced
		step := func(mode SyncMode) error {
			got = got[:0]
			if err := r.Begin(mode); err != nil {
				return err
			}
			for i := len(params) - 1; i >= 0; i-- {
				g := mustGrad(r, i)
				for j := range g {
					g[j] = float32(rank + i)
				}
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			var inner error
			err := r.WaitEach(ctx, func(b Reduced) {
				got = append(got, b)
				for _, p := range b.Params {
					g, err := r.Grad(p)
					if err == nil && g[0] != float32(p)+0.5 {
						err = fmt.Errorf("bucket %d: parameter %d holds %v, want the average %v", b.Bucket, p, g[0], float32(p)+0.5)
					}
					if err != nil && inner == nil {
						inner = err
					}
				}
			})
			if err != nil {
				return err
			}
			return inner
		}
		for s := range 3 { // through the rebuild
			if err := step(Sync); err != nil {
				return err
			}
			bs := r.Buckets()
			if len(bs) < 2 || len(got) != len(bs) {
				return fmt.Errorf("step %d: %d buckets reported of %d (want several)", s+1, len(got), len(bs))
			}
			for k, b := range got {
				if b.Bucket != k || !slices.Equal(b.Params, bs[k].Params) {
					return fmt.Errorf("step %d: report %d is bucket %d with %v, want bucket %d with %v", s+1, k, b.Bucket, b.Params, k, bs[k].Params)
				}
			}
		}
		if err := step(NoSync); err != nil || len(got) != 0 {
			return fmt.Errorf("no-sync step: %d reports, %v", len(got), err)
		}
		if err := step(Sync); err != nil {
			return err
		}
		if rank == 0 {
			// The other rank runs the same steps meanwhile.
			allocs := testing.AllocsPerRun(5, func() {
				if err := step(Sync); err != nil {
					t.Error(err)
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocations per step with WaitEach", allocs)
			}
		} else {
			for range 6 {
				if err := step(Sync); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}
