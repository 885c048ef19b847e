package ddp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestNonfinitePerHook: NaN and ±Inf gradients come out of every hook as
// IEEE arithmetic says (never silently zeroed or made finite), a sum of
// huge values whose average is finite stays finite in the float32 hooks,
// and the fp16 hook, whose range it leaves, reports it as an overflow.
func TestNonfinitePerHook(t *testing.T) {
	testutil.NoLeak(t)
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	// Per rank, elements 0-4 of fc.weight: NaN on one rank; +Inf on one;
	// +Inf and -Inf; 3e38 on both; 1 on both.
	in := [2][]float32{{nan, inf, inf, 3e38, 1}, {1, 1, -inf, 3e38, 1}}
	for _, w := range wires {
		t.Run(w.name, func(t *testing.T) {
			cs := newTestGroup(t, 2)
			errs := withReducers(t, cs, threeParams, func() Options { return Options{Hook: w.hook()} }, func(rank int, r *Reducer) error {
				if err := r.Begin(Sync); err != nil {
					return err
				}
				for i := range threeParams {
					g := mustGrad(r, i)
					for j := range g {
						g[j] = 1
					}
					if i == 1 {
						copy(g, in[rank])
					}
					if err := r.Ready(i); err != nil {
						return err
					}
				}
				if err := r.Wait(context.Background()); err != nil {
					return err
				}
				g := mustGrad(r, 1)
				switch {
				case !isNaN(g[0]) || !math.IsInf(float64(g[1]), 1) || !isNaN(g[2]):
					return fmt.Errorf("reduced %v: want NaN, +Inf, NaN (Inf-Inf) first", g[:3])
				case g[4] != 1 || g[5] != 1:
					return fmt.Errorf("reduced %v: want the finite elements' average 1", g)
				}
				switch w.name {
				case "fp16":
					if !math.IsInf(float64(g[3]), 1) || r.Stats().Overflows == 0 {
						return fmt.Errorf("fp16: 3e38 reduced to %v with %d overflows; want +Inf, counted", g[3], r.Stats().Overflows)
					}
				default:
					if math.IsInf(float64(g[3]), 0) || math.Abs(float64(g[3])-3e38) > 3e38*2*w.u {
						return fmt.Errorf("%s: the average of 3e38 and 3e38 is %v; want 3e38 within %g", w.name, g[3], 2*w.u)
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

func isNaN(f float32) bool { return f != f }

// TestRankLeavesStep: a rank that stops taking part in a step, by leaving
// a parameter unmarked or by panicking, fails its peers' steps: promptly
// with an abort when its Reducer is closed (a deferred Close runs as the
// panic unwinds), otherwise at the deadline with a timeout that names it.
func TestRankLeavesStep(t *testing.T) {
	testutil.NoLeak(t)
	tests := []struct {
		name  string
		close bool // the leaving rank's Reducer is closed as it leaves
		panic bool // it panics instead of calling Wait
	}{
		{"never marks a parameter", false, false},
		{"panics, Close deferred", true, true},
		{"panics, no Close", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := newTestGroup(t, 3)
			// Timeout bounds New's check too: 2 s, so that a rank that a
			// loaded machine starts late does not fail the check.
			o := Options{Timeout: 2 * time.Second, StallInterval: time.Hour, KeepLayout: true}
			if tt.close {
				o.Timeout = time.Minute // the abort, not the deadline, must end the step
			}
			var left *Reducer
			var leftErr any
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for rank := range 3 {
				wg.Go(func() {
					r, err := New(context.Background(), cs[rank], threeParams, o)
					if err != nil {
						errs[rank] = err
						return
					}
					if rank != 1 {
						defer r.Close()
					} else if tt.close {
						defer r.Close()
					} else {
						left = r
					}
					defer func() {
						if rank == 1 {
							leftErr = recover()
						}
					}()
					if err := r.Begin(Sync); err != nil {
						errs[rank] = err
						return
					}
					for i := range threeParams {
						if rank == 1 && i == 0 {
							continue // embed.weight: its bucket never completes on rank 1
						}
						if err := r.Ready(i); err != nil {
							errs[rank] = err
							return
						}
					}
					if rank == 1 && tt.panic {
						panic("the training loop failed")
					}
					errs[rank] = r.Wait(context.Background())
				})
			}
			wg.Wait()
			if left != nil {
				left.Close()
			}
			if tt.panic && leftErr == nil {
				t.Fatal("rank 1 did not panic")
			}
			if !tt.panic && !errors.Is(errs[1], ErrUnready) {
				t.Errorf("rank 1: Wait = %v; want ErrUnready naming the parameter", errs[1])
			}
			for _, rank := range []int{0, 2} {
				err := errs[rank]
				switch {
				case tt.close && (err == nil || errors.Is(err, comm.ErrTimeout)):
					t.Errorf("rank %d: Wait = %v; want the step failed by rank 1's Close, before the deadline", rank, err)
				case !tt.close && (!errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "rank(s) [1]")):
					t.Errorf("rank %d: Wait = %v; want a timeout naming rank 1", rank, err)
				}
			}
		})
	}
}
