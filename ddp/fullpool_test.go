package ddp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestRebuildFullPool: a pool with room for one layout but not two (three
// 4 KiB slabs, two 4 KiB buckets). The rebuild then cannot keep the old
// layout out of the pool while it adopts the new one, and the new one may
// reuse the old one's addresses: parameter a's old slot is b's new one.
// A gradient slice handed out in the old layout must not then write,
// unseen, into another gradient (a kept slice of a adding 20 to b's
// gradient, with Ready and Wait returning nil): Begin fails instead, with
// the pool's ErrExhausted, and every rank fails, also a rank whose own
// pool had room. With no slice handed out, the rebuild frees the old
// layout first and goes on.
func TestRebuildFullPool(t *testing.T) {
	testutil.NoLeak(t)
	params := []Param{{Name: "a", Shape: []int{1024}}, {Name: "b", Shape: []int{1024}}}
	tight := func(t *testing.T) *allocator.Pool {
		p, err := allocator.New(allocator.Options{Limit: 12288, SlabSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	opts := func(p *allocator.Pool) Options {
		return Options{Pool: p, BucketCap: 4096, FirstBucketCap: 4096}
	}
	// step1 runs the first synced step, in which a is ready before b:
	// the reverse of the initial layout's order, so the rebuild changes
	// the layout. set writes a gradient and marks it ready.
	step1 := func(r *Reducer, set func(i int, v float32) error) error {
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := range 2 {
			if err := set(i, float32(i+1)); err != nil {
				return err
			}
		}
		return r.Wait(context.Background())
	}

	for _, c := range []struct {
		name      string
		roomyRank int // this rank's pool has room for both layouts; -1: none
	}{
		{"every rank short", -1},
		{"rank 1 short", 0},
	} {
		t.Run("kept slices/"+c.name, func(t *testing.T) {
			cs := newTestGroup(t, 2)
			pools := []*allocator.Pool{tight(t), tight(t)}
			if c.roomyRank >= 0 {
				pools[c.roomyRank] = nil // the Reducer's own pool
			}
			errs := runRanks(cs, func(rank int, cm comm.Communicator) error {
				r, err := New(context.Background(), cm, params, opts(pools[rank]))
				if err != nil {
					return err
				}
				defer r.Close()
				var held [2][]float32
				if err := step1(r, func(i int, v float32) error {
					held[i] = mustGrad(r, i)
					held[i][0] = v
					return r.Ready(i)
				}); err != nil {
					return err
				}
				if err := r.Begin(Sync); err != nil {
					return err
				}
				if r.Generation() != 2 {
					return fmt.Errorf("the layout did not change: the test tests nothing")
				}
				// What the reviewer saw: b fetched again and written, a
				// written through its kept slice (the roomy rank writes
				// a afresh).
				g := mustGrad(r, 1)
				g[0] = 21
				if rank == c.roomyRank {
					if err := r.SetGrad(0, make([]float32, 1024)); err != nil {
						return err
					}
				} else {
					held[0][0] += 20
					if err := r.Ready(0); err != nil {
						return fmt.Errorf("Ready(0) after a write through a kept slice of a: %w", err)
					}
				}
				if err := r.Ready(1); err != nil {
					return err
				}
				if err := r.Wait(context.Background()); err != nil {
					return err
				}
				return fmt.Errorf("step 2 succeeded, the write through a kept slice of a lost: grads a = %v, b = %v (b written 21)", mustGrad(r, 0)[0], mustGrad(r, 1)[0])
			})
			for rank, err := range errs {
				switch {
				case err == nil:
					t.Errorf("rank %d: no error", rank)
				case rank != c.roomyRank && (!errors.Is(err, allocator.ErrExhausted) || !strings.Contains(err.Error(), `parameter 0's ("a")`)):
					t.Errorf("rank %d: %v, want Begin's allocator.ErrExhausted naming a", rank, err)
				case rank == c.roomyRank && !strings.Contains(err.Error(), "cannot hold the rebuilt layout"):
					t.Errorf("rank %d: %v, want the group aborted by the short rank's Begin", rank, err)
				}
			}
		})
	}

	t.Run("nothing handed out", func(t *testing.T) {
		cs := newTestGroup(t, 2)
		pools := []*allocator.Pool{tight(t), tight(t)}
		errs := runRanks(cs, func(rank int, cm comm.Communicator) error {
			r, err := New(context.Background(), cm, params, opts(pools[rank]))
			if err != nil {
				return err
			}
			defer r.Close()
			set := func(i int, v float32) error {
				g := make([]float32, 1024)
				g[0] = v
				return r.SetGrad(i, g)
			}
			if err := step1(r, set); err != nil {
				return err
			}
			if err := step1(r, func(i int, v float32) error { return set(i, 10*v) }); err != nil {
				return err
			}
			if r.Generation() != 2 {
				return fmt.Errorf("Generation %d: the layout did not change, the test tests nothing", r.Generation())
			}
			if n := pools[rank].Stats().Exhausted; n == 0 {
				return fmt.Errorf("the pool was never exhausted: the test tests nothing")
			}
			for i, want := range []float32{10, 20} {
				if got := mustGrad(r, i)[0]; got != want {
					return fmt.Errorf("step 2: grad %d = %v, want %v", i, got, want)
				}
			}
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
	})
}
