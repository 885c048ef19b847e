package ddp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestConsolidate: on 1-4 ranks, both modes, buckets of 11 and 22
// elements and one bucket, each rank fills its Owned elements of a state
// shaped like the parameters (and NaN elsewhere); after Consolidate the
// root's state holds every element's owner's value and the other ranks'
// state is as it was, bit for bit. A second call onto another root works
// the same, and without Shard Consolidate leaves every state alone.
func TestConsolidate(t *testing.T) {
	testutil.NoLeak(t)
	value := func(p, e int) float32 { return float32(1000*p+e) + 0.25 }
	caps := []struct{ first, rest int }{{44, 88}, {1 << 20, 1 << 20}}
	for n := 1; n <= 4; n++ {
		for _, mode := range []ShardMode{ShardOff, ShardElements, ShardParams} {
			for _, c := range caps {
				t.Run(fmt.Sprintf("n=%d/%v/cap=%d", n, mode, c.rest), func(t *testing.T) {
					cs := newTestGroup(t, n)
					errs := withReducers(t, cs, shardParams, func() Options {
						return Options{FirstBucketCap: c.first, BucketCap: c.rest, Shard: mode}
					}, func(rank int, r *Reducer) error {
						// A wrong value is kept until every call is made,
						// so that no peer waits for this rank.
						var wrong error
						for _, root := range []int{0, n - 1} {
							state := make([][]float32, len(shardParams))
							for i, p := range shardParams {
								state[i] = make([]float32, p.Numel())
								for e := range state[i] {
									state[i][e] = float32(math.NaN())
									if mode == ShardOff {
										state[i][e] = value(i, e)
									}
								}
							}
							for k := range r.Buckets() {
								for _, pt := range r.Owned(k) {
									for e := pt.Lo; e < pt.Hi; e++ {
										state[pt.Param][e] = value(pt.Param, e)
									}
								}
							}
							before := make([][]uint32, len(state))
							for i := range state {
								before[i] = bitsOf(state[i])
							}
							if err := r.Consolidate(context.Background(), root, state); err != nil {
								return err
							}
							for i := range state {
								for e, x := range state[i] {
									if rank == root && x != value(i, e) && wrong == nil {
										wrong = fmt.Errorf("root %d: parameter %d element %d is %v, want %v", root, i, e, x, value(i, e))
									}
									if rank != root && math.Float32bits(x) != before[i][e] && wrong == nil {
										wrong = fmt.Errorf("root %d: rank %d's parameter %d element %d changed", root, rank, i, e)
									}
								}
							}
						}
						return wrong
					})
					if err := firstErr(errs); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// TestConsolidateErrors: a call during a step, onto a rank out of range,
// or with state of the wrong shape fails naming it.
func TestConsolidateErrors(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 1)
	errs := withReducers(t, cs, shardParams, func() Options { return Options{Shard: ShardElements} }, func(rank int, r *Reducer) error {
		state := make([][]float32, len(shardParams))
		for i, p := range shardParams {
			state[i] = make([]float32, p.Numel())
		}
		ctx := context.Background()
		if err := r.Consolidate(ctx, 1, state); !errors.Is(err, ErrIndex) {
			return fmt.Errorf("root 1 of 1: %v, want ErrIndex", err)
		}
		if err := r.Consolidate(ctx, 0, state[1:]); !errors.Is(err, ErrGradSize) {
			return fmt.Errorf("too few slices: %v, want ErrGradSize", err)
		}
		short := append([][]float32(nil), state...)
		short[2] = short[2][1:]
		if err := r.Consolidate(ctx, 0, short); !errors.Is(err, ErrGradSize) {
			return fmt.Errorf("a short slice: %v, want ErrGradSize", err)
		}
		if err := r.Begin(Sync); err != nil {
			return err
		}
		if err := r.Consolidate(ctx, 0, state); !errors.Is(err, ErrStepInProgress) {
			return fmt.Errorf("during a step: %v, want ErrStepInProgress", err)
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}
