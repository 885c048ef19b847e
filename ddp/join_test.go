package ddp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

var joinParams = []Param{{Name: "w", Shape: []int{2, 5}}, {Name: "b", Shape: []int{2}}, {Name: "v", Shape: []int{6}, DType: comm.Float64}}

// joinGrad is rank's gradient of element j of parameter p at step s.
func joinGrad(rank, s, p, j int) float64 { return float64((rank+1)*(s+1) + 10*p + j) }

// joinRun runs one epoch: each rank takes batches[rank] synced steps, then
// Joins, and reports what it saw. It checks, at every step on every
// active rank, that each gradient is the sum over the ranks active at that
// step divided by the group size (JoinWorld) or by their number
// (JoinActive), and that the buffer holds the value of the lowest active
// rank.
func joinRun(t *testing.T, mode JoinMode, batches []int, o func(*Options)) (lasts []int, errs []error) {
	t.Helper()
	n := len(batches)
	lasts = make([]int, n)
	cs := newTestGroup(t, n)
	errs = withReducers(t, cs, joinParams, func() Options {
		opts := Options{Join: mode, BucketCap: 40, FirstBucketCap: 40, Timeout: time.Minute,
			Buffers: []Param{{Name: "bn.mean", Shape: []int{3}}}}
		if o != nil {
			o(&opts)
		}
		return opts
	}, func(rank int, r *Reducer) error {
		ctx := context.Background()
		lasts[rank] = -1
		var buf comm.Buffer // none if the options have no buffers
		if len(r.bufs.params) > 0 {
			var err error
			if buf, err = r.Buffer(0); err != nil {
				return err
			}
		}
		for s := range batches[rank] {
			for j := range buf.Count { // forward: diverging running statistics
				buf.AsFloat32()[j] = float32(100*rank + 10*s + j)
			}
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for p := len(joinParams) - 1; p >= 0; p-- {
				g := mustGradBuffer(r, p)
				for j := range g.Count {
					setElem(g, j, joinGrad(rank, s, p, j))
				}
				if err := r.Ready(p); err != nil {
					return err
				}
			}
			if err := r.Wait(ctx); err != nil {
				return fmt.Errorf("step %d: %w", s+1, err)
			}
			var active []int
			for q, b := range batches {
				if b > s {
					active = append(active, q)
				}
			}
			div := float64(n)
			if mode == JoinActive {
				div = float64(len(active))
			}
			for p := range joinParams {
				g := mustGradBuffer(r, p)
				for j := range g.Count {
					want := 0.0
					for _, q := range active {
						want += joinGrad(q, s, p, j)
					}
					want /= div
					if got := elem(g, j); math.Abs(got-want) > 1e-6*math.Abs(want) {
						return fmt.Errorf("step %d, %d ranks active: %s[%d] = %v, want %v", s+1, len(active), joinParams[p].Name, j, got, want)
					}
				}
			}
			for j := range buf.Count {
				if v, want := buf.AsFloat32()[j], float32(100*active[0]+10*s+j); v != want {
					return fmt.Errorf("step %d: buffer[%d] = %v, want rank %d's %v", s+1, j, v, active[0], want)
				}
			}
			if st := r.Stats(); st.Active != len(active) || st.Joined {
				return fmt.Errorf("step %d: Stats says %d ranks active (joined %v), want %d", s+1, st.Active, st.Joined, len(active))
			}
		}
		last, err := r.Join(ctx)
		lasts[rank] = last
		if err != nil {
			return err
		}
		if batches[rank] < batches[last] {
			if st := r.Stats(); !st.Joined || st.Step != uint64(batches[last]) {
				return fmt.Errorf("after Join: last step %d joined %v, want the shadow of step %d", st.Step, st.Joined, batches[last])
			}
		}
		return nil
	})
	return lasts, errs
}

// TestJoinUneven: ranks with different numbers of batches all finish; at
// every step the gradients are the sums of the active ranks' divided as
// the mode says, the buffers are the lowest active rank's, and Join
// returns the last rank to join on every rank. No deadline is hit.
func TestJoinUneven(t *testing.T) {
	testutil.NoLeak(t)
	for _, mode := range []JoinMode{JoinWorld, JoinActive} {
		for _, tc := range []struct {
			batches []int
			last    int
		}{
			{[]int{10, 7, 3}, 0},
			{[]int{3, 10, 7}, 1}, // rank 0 joins first: buffers come from rank 1
			{[]int{0, 2, 1}, 1},  // rank 0 shadows the first step and its rebuild
			{[]int{4, 4, 4}, 0},  // even: every rank joins at once
			{[]int{2, 5, 5}, 1},  // two ranks join last together: the lower one
		} {
			t.Run(fmt.Sprintf("%v/%v", mode, tc.batches), func(t *testing.T) {
				start := time.Now()
				lasts, errs := joinRun(t, mode, tc.batches, nil)
				if err := firstErr(errs); err != nil {
					t.Fatal(err)
				}
				for rank, l := range lasts {
					if l != tc.last {
						t.Errorf("rank %d: Join returned %d, want %d", rank, l, tc.last)
					}
				}
				if d := time.Since(start); d > 20*time.Second {
					t.Errorf("took %v: something waited for a deadline", d)
				}
			})
		}
	}
}

// TestJoinOptions: uneven inputs with the other options that change what
// a step issues or how gradients travel.
func TestJoinOptions(t *testing.T) {
	testutil.NoLeak(t)
	for name, o := range map[string]func(*Options){
		"window1-copy": func(o *Options) { o.MaxInFlight = 1; o.CopyGrads = true },
		"nozero-keep":  func(o *Options) { o.NoZeroGrad = true; o.KeepLayout = true },
		"static":       func(o *Options) { o.StaticGraph = true },
		"allreduce":    func(o *Options) { o.Hook = hooks.AllReduce() },
		"no-buffers":   func(o *Options) { o.Buffers = nil }, // the finisher reads the flag
	} {
		t.Run(name, func(t *testing.T) {
			lasts, errs := joinRun(t, JoinActive, []int{2, 6, 4}, o)
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			if lasts[0] != 1 {
				t.Errorf("Join returned %v, want 1 everywhere", lasts)
			}
		})
	}
}

// TestJoinThrow: the rank that runs out ends every rank promptly with
// ErrJoined naming it, well before any deadline.
func TestJoinThrow(t *testing.T) {
	testutil.NoLeak(t)
	start := time.Now()
	_, errs := joinRun(t, JoinThrow, []int{5, 5, 2}, nil)
	for rank, err := range errs {
		if !errors.Is(err, ErrJoined) || errors.Is(err, comm.ErrTimeout) {
			t.Fatalf("rank %d: %v, want ErrJoined", rank, err)
		}
		want := "rank 2 ran out of inputs and joined at step 3"
		if rank == 2 {
			want = "rank 2 ran out of inputs and joined after step 2"
		}
		wantErr(t, err, ErrJoined, want)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %v: a rank waited for a deadline", d)
	}
	_, errs = joinRun(t, JoinThrow, []int{4, 1}, func(o *Options) { o.Buffers = nil })
	for _, err := range errs {
		wantErr(t, err, ErrJoined, "rank 1 ran out of inputs and joined")
	}
	// Even inputs end normally.
	if _, errs := joinRun(t, JoinThrow, []int{3, 3}, nil); firstErr(errs) != nil {
		t.Fatal(firstErr(errs))
	}
}

// TestJoinMisuse: Join without Options.Join, during a step, and ranks that
// disagree on the mode.
func TestJoinMisuse(t *testing.T) {
	testutil.NoLeak(t)
	r, err := New(context.Background(), commtest.Solo{}, threeParams, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Join(context.Background())
	wantErr(t, err, ErrOptions, "Options.Join")
	r.Close()
	r, err = New(context.Background(), commtest.Solo{}, threeParams, Options{Join: JoinWorld})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	_, err = r.Join(context.Background())
	wantErr(t, err, ErrStepInProgress, "Wait first")
	r.Close()
	cs := newTestGroup(t, 2)
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		r, err := New(context.Background(), c, threeParams, Options{Join: JoinMode(rank)})
		if err == nil {
			r.Close()
		}
		return err
	})
	for rank, err := range errs {
		wantErr(t, err, ErrParamMismatch, "Join JoinOff", "Join JoinWorld")
		_ = rank
	}
}

// TestJoinStepAllocs: with Join on, a warm synced step still allocates
// nothing, whichever goroutine reads the flag.
func TestJoinStepAllocs(t *testing.T) {
	testutil.NoLeak(t)
	for _, bufs := range [][]Param{nil, {{Name: "m", Shape: []int{4}}}} {
		p := newPair(t, newTestGroup(t, 2), threeParams, func() Options {
			return Options{Join: JoinActive, Buffers: bufs}
		})
		for range 3 {
			if err := p.step(); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		allocs := testing.AllocsPerRun(10, func() {
			if e := p.step(); e != nil {
				err = e
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if allocs != 0 {
			t.Errorf("%d buffers: %v allocations per warm step with Join, want 0", len(bufs), allocs)
		}
	}
}
