//go:build invariants

package ddp

import (
	"context"
	"math"
	"testing"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestStaleViewPoisoned: under the invariants tag, memory returned to the
// pool when a rebuilt layout is adopted is poisoned, so a gradient slice
// kept past Begin shows NaN instead of silently aliasing live memory.
func TestStaleViewPoisoned(t *testing.T) {
	testutil.NoLeak(t)
	ctx := context.Background()
	params := []Param{{Name: "a", Shape: []int{200}}, {Name: "b", Shape: []int{200}}}
	cs := newTestGroup(t, 1)
	r, err := New(ctx, cs[0], params, Options{BucketCap: 800, FirstBucketCap: 800})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	stale := mustGrad(r, 1)
	for _, i := range []int{0, 1} { // the reverse of the initial order: the rebuild changes the layout
		if err := r.Ready(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	before := r.Buckets()
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	if bucketInfoEqual(before[0], r.Buckets()[0]) {
		t.Fatalf("layout not rebuilt: %v", r.Buckets())
	}
	if !math.IsNaN(float64(stale[0])) {
		t.Fatalf("a slice kept across the rebuild reads %v, want the pool's NaN poison", stale[0])
	}
}
