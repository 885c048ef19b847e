package ddp

import (
	"context"
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestGradIsBucketView checks gradient-as-bucket-view, the default: the
// slices Grad returns are the bucket memory itself. Within a bucket they
// lie back to back in layout order, the first at a 512-byte-aligned
// address. (With CopyGrads they are Go slices of their own; only their
// lengths are checked.)
func TestGradIsBucketView(t *testing.T) {
	params := []Param{{Name: "a", Shape: []int{3}}, {Name: "b", Shape: []int{5, 2}}, {Name: "c", Shape: []int{7}}, {Name: "d", Shape: []int{1}}}
	for _, copyGrads := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copyGrads), func(t *testing.T) {
			r, err := New(context.Background(), commtest.Solo{}, params, Options{BucketCap: 48, FirstBucketCap: 32, CopyGrads: copyGrads})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			bs := r.Buckets()
			if len(bs) < 2 {
				t.Fatalf("want several buckets, got %v", bs)
			}
			views := 0
			for _, b := range bs {
				base := uintptr(unsafe.Pointer(unsafe.SliceData(mustGrad(r, b.Params[0]))))
				off := uintptr(0)
				for _, p := range b.Params {
					g := mustGrad(r, p)
					if len(g) != params[p].Numel() {
						t.Fatalf("Grad(%d) has %d elements, want %d", p, len(g), params[p].Numel())
					}
					if uintptr(unsafe.Pointer(unsafe.SliceData(g))) == base+off {
						views++
					}
					off += uintptr(len(g)) * 4
				}
				if !copyGrads && base%allocator.Alignment != 0 {
					t.Errorf("bucket %d starts at %#x, not %d-byte aligned", b.Index, base, allocator.Alignment)
				}
			}
			if want := len(params); !copyGrads && views != want {
				t.Errorf("%d of %d gradients are views at their place in the bucket", views, want)
			}
		})
	}
}

// TestStepOverflows: values that overflow float16 in the FP16 hook are
// counted in the bucket's and the step's statistics, on every rank, and
// the bytes are the compressed ones.
func TestStepOverflows(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	errs := withReducers(t, cs, threeParams, func() Options { return Options{Hook: hooks.FP16()} }, func(rank int, r *Reducer) error {
		ctx := context.Background()
		for step := range 2 {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := range threeParams {
				g := mustGrad(r, i)
				for j := range g {
					g[j] = 1
				}
				if i == 1 {
					g[0], g[3] = 3e5, -3e5 // 1.5e5 after scaling by 1/2: beyond 65504
				}
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			if err := r.Wait(ctx); err != nil {
				return err
			}
			st := r.Stats()
			var bucketSum int64
			for _, b := range st.Buckets {
				bucketSum += b.Overflows
			}
			if st.Overflows != 2 || bucketSum != 2 {
				return fmt.Errorf("step %d: %d overflows (buckets %d), want 2", step, st.Overflows, bucketSum)
			}
			if g := mustGrad(r, 1); !math.IsInf(float64(g[0]), 1) || !math.IsInf(float64(g[3]), -1) || g[1] != 1 {
				return fmt.Errorf("step %d: reduced fc.weight %v, want ±Inf where it overflowed and 1 elsewhere", step, g)
			}
			if want := int64(20 * comm.Float16.Size()); st.Bytes != want {
				return fmt.Errorf("step %d: Bytes %d, want %d", step, st.Bytes, want)
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestEmptyAndScalarParams: a parameter with no elements (alone in its
// bucket, or sharing one) and a scalar go through every hook.
func TestEmptyAndScalarParams(t *testing.T) {
	testutil.NoLeak(t)
	params := []Param{{Name: "a", Shape: []int{3}}, {Name: "empty", Shape: []int{4, 0}}, {Name: "scalar"}}
	for _, w := range wires {
		for _, caps := range [][2]int{{4, 4}, {0, 0}} { // one parameter per bucket; one bucket
			t.Run(fmt.Sprintf("%s/cap=%d", w.name, caps[0]), func(t *testing.T) {
				cs := newTestGroup(t, 2)
				errs := withReducers(t, cs, params, func() Options {
					return Options{Hook: w.hook(), BucketCap: caps[0], FirstBucketCap: caps[1]}
				}, func(rank int, r *Reducer) error {
					for step := range 3 {
						if err := r.Begin(Sync); err != nil {
							return err
						}
						for i := range params {
							if n := len(mustGrad(r, i)); n != params[i].Numel() {
								return fmt.Errorf("Grad(%d) has %d elements, want %d", i, n, params[i].Numel())
							}
							for j := range mustGrad(r, i) {
								mustGrad(r, i)[j] = float32(2*rank + j)
							}
							if err := r.Ready(i); err != nil {
								return err
							}
						}
						if err := r.Wait(context.Background()); err != nil {
							return fmt.Errorf("step %d: %w", step, err)
						}
						if a, s := mustGrad(r, 0), mustGrad(r, 2); a[0] != 1 || a[2] != 3 || s[0] != 1 {
							return fmt.Errorf("step %d: a %v scalar %v, want [1 2 3] and [1]", step, a, s)
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
}
