package ddp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

var threeParams = []Param{
	{Name: "embed.weight", Shape: []int{4, 3}},
	{Name: "fc.weight", Shape: []int{2, 3}},
	{Name: "fc.bias", Shape: []int{2}},
}

// withReducers builds a Reducer per rank with o and runs f on every rank.
func withReducers(t *testing.T, cs []comm.Communicator, params []Param, o func() Options, f func(rank int, r *Reducer) error) []error {
	t.Helper()
	return runRanks(cs, func(rank int, c comm.Communicator) error {
		r, err := New(context.Background(), c, params, o())
		if err != nil {
			return err
		}
		defer r.Close()
		return f(rank, r)
	})
}

func wantErr(t *testing.T, err, target error, substrs ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestMisuseErrors(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 1)
	ctx := context.Background()
	r, err := New(ctx, cs[0], threeParams, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	wantErr(t, r.Ready(1), ErrNoStep, `rank 0: Ready of parameter 1 ("fc.weight") outside a step`, "Begin")
	wantErr(t, r.SetGrad(1, make([]float32, 6)), ErrNoStep, `rank 0: SetGrad of parameter 1 ("fc.weight") outside a step`)
	wantErr(t, r.Wait(ctx), ErrNoStep, "rank 0")
	wantErr(t, r.Ready(3), ErrIndex, "rank 0: Ready(3)", "3 parameters")
	wantErr(t, r.AddGrad(-2, nil), ErrIndex, "rank 0: AddGrad(-2)", "3 parameters")
	wantErr(t, r.Ready(-1), ErrIndex)
	if err := r.Begin(Sync); err != nil {
		t.Fatal(err)
	}
	wantErr(t, r.Begin(Sync), ErrStepInProgress, "rank 0", "step 1", "Wait")
	wantErr(t, r.SetGrad(2, make([]float32, 5)), ErrGradSize, `rank 0: SetGrad: parameter 2 ("fc.bias", shape [2]) has 2 elements, got 5`)
	if err := r.Ready(2); err != nil {
		t.Fatal(err)
	}
	wantErr(t, r.Ready(2), ErrMarkedTwice, `Ready: rank 0 step 1: parameter 2 ("fc.bias") is already marked ready`)
	wantErr(t, r.SetGrad(2, make([]float32, 2)), ErrMarkedTwice, `"fc.bias"`)
	wantErr(t, r.BroadcastParameters(ctx, nil), ErrStepInProgress)

	// Wait with parameters never marked: an error naming them and the fix;
	// the step stays open.
	err = r.Wait(ctx)
	wantErr(t, err, ErrUnready, `"embed.weight"`, `"fc.weight"`, "2 of 3", "FindUnusedParameters")
	if strings.Contains(err.Error(), `"fc.bias"`) {
		t.Errorf("error names fc.bias, which was marked: %v", err)
	}
	for _, i := range []int{0, 1} {
		if err := r.Ready(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Wait(ctx); err != nil {
		t.Fatalf("Wait after marking the missing parameters: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	wantErr(t, r.Begin(Sync), ErrClosed)
	wantErr(t, r.Ready(0), ErrClosed)
}

func TestNewErrors(t *testing.T) {
	cs := newTestGroup(t, 1)
	ctx := context.Background()
	_, err := New(ctx, cs[0], nil, Options{})
	wantErr(t, err, ErrUnsupported, "no parameters")
	_, err = New(ctx, cs[0], []Param{{Name: "h", Shape: []int{2}, DType: comm.Int32}}, Options{})
	wantErr(t, err, ErrUnsupported, `"h"`, "int32")
	_, err = New(ctx, cs[0], []Param{{Name: "d", Shape: []int{2}, DType: comm.Float64}}, Options{Hook: hooks.FP16()})
	wantErr(t, err, ErrUnsupported, `"d"`, "double", "hook fp16")
	// Shapes whose element count overflows an int (once 0, once 4, when
	// multiplied unchecked) and one whose bytes do.
	for _, shape := range [][]int{{1 << 32, 1 << 32}, {1<<62 + 1, 4}, {1 << 61, 2}} {
		p := Param{Name: "huge", Shape: shape}
		_, err = New(ctx, cs[0], []Param{threeParams[0], p}, Options{})
		wantErr(t, err, ErrUnsupported, "parameter 1", `"huge"`, fmt.Sprint(shape))
	}
}

// TestNumel: a dimension that is negative, or a product that overflows,
// gives -1, never a wrapped count.
func TestNumel(t *testing.T) {
	for _, tt := range []struct {
		shape []int
		want  int
	}{
		{nil, 1}, {[]int{0, 1 << 62}, 0}, {[]int{4, 3}, 12}, {[]int{-1}, -1}, {[]int{2, -3}, -1},
		{[]int{1 << 32, 1 << 32}, -1}, {[]int{1<<62 + 1, 4}, -1}, {[]int{math.MaxInt}, math.MaxInt},
		{[]int{math.MaxInt, 2}, -1},
	} {
		if got := (Param{Shape: tt.shape}).Numel(); got != tt.want {
			t.Errorf("Numel of %v = %d, want %d", tt.shape, got, tt.want)
		}
	}
}

// TestNewLocalFailure: a rank that rejects its own parameters or options
// still joins New's cross-rank check, so its peers fail at once with an
// error naming it instead of waiting in the check's collective.
func TestNewLocalFailure(t *testing.T) {
	testutil.NoLeak(t)
	devPool, err := allocator.New(allocator.Options{Source: commtest.NewDeviceSource()})
	if err != nil {
		t.Fatal(err)
	}
	defer devPool.Close()
	tests := []struct {
		name   string
		params []Param
		o      Options
		target error
		substr []string
	}{
		{"dtype", []Param{threeParams[0], {Name: "fc.weight", Shape: []int{2, 3}, DType: comm.Int64}, threeParams[2]}, Options{}, ErrUnsupported,
			[]string{"rank 1", "parameter 1", `"fc.weight"`, "int64"}},
		{"shape", []Param{threeParams[0], threeParams[1], {Name: "fc.bias", Shape: []int{-2}}}, Options{}, ErrUnsupported,
			[]string{"rank 1", "parameter 2", `"fc.bias"`, "[-2]"}},
		{"no parameters", nil, Options{}, ErrUnsupported, []string{"rank 1", "no parameters"}},
		{"caps", threeParams, Options{BucketCap: -1}, ErrOptions, []string{"rank 1", "bucket caps 1048576 (first) and -1"}},
		{"device pool", threeParams, Options{Pool: devPool}, ErrOptions, []string{"rank 1", "device memory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := newTestGroup(t, 3)
			// Generous: without the fix the peers would wait here for the
			// context (the backend's deadline is 10 minutes).
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs := runRanks(cs, func(rank int, c comm.Communicator) error {
				ps, o := threeParams, Options{}
				if rank == 1 {
					ps, o = tt.params, tt.o
				}
				r, err := New(ctx, c, ps, o)
				if err == nil {
					r.Close()
				}
				return err
			})
			for rank, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: New succeeded", rank)
				}
				if errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("rank %d waited for the failed rank: %v", rank, err)
				}
				if rank == 1 {
					wantErr(t, err, tt.target, tt.substr...)
					continue
				}
				wantErr(t, err, ErrParamMismatch, "rank 1 could not build")
			}
		})
	}
}

// TestFindUnused leaves a parameter unmarked on one rank: with
// FindUnusedParameters it is reduced as zero there and reported.
func TestFindUnused(t *testing.T) {
	testutil.NoLeak(t)
	for _, copyGrads := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", copyGrads), func(t *testing.T) {
			cs := newTestGroup(t, 2)
			errs := withReducers(t, cs, threeParams, func() Options { return Options{FindUnusedParameters: true, CopyGrads: copyGrads} },
				func(rank int, r *Reducer) error {
					ctx := context.Background()
					for step := range 3 {
						if err := r.Begin(Sync); err != nil {
							return err
						}
						for i := range threeParams {
							if rank == 1 && i == 1 {
								continue // unused on rank 1
							}
							g := mustGrad(r, i)
							for j := range g {
								g[j] = float32(2 + step)
							}
							if err := r.Ready(i); err != nil {
								return err
							}
						}
						if err := r.Wait(ctx); err != nil {
							return err
						}
						for i := range threeParams {
							want := float32(2 + step)
							if i == 1 {
								want /= 2
							}
							for _, v := range mustGrad(r, i) {
								if v != want {
									return fmt.Errorf("step %d param %d: %v, want %v", step, i, v, want)
								}
							}
						}
						st := r.Stats()
						wantUnused := []int{}
						if rank == 1 {
							wantUnused = []int{1}
						}
						if fmt.Sprint(st.Unused) != fmt.Sprint(wantUnused) {
							return fmt.Errorf("step %d: Unused = %v, want %v", step, st.Unused, wantUnused)
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

// TestStaticGraph: the first synced step finds the unused parameter, later
// steps mark it at Begin, and marking it then is an error.
func TestStaticGraph(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	errs := withReducers(t, cs, threeParams, func() Options { return Options{StaticGraph: true} },
		func(rank int, r *Reducer) error {
			ctx := context.Background()
			for step := range 3 {
				if err := r.Begin(Sync); err != nil {
					return err
				}
				for _, i := range []int{2, 0} {
					if err := r.SetGrad(i, make([]float32, threeParams[i].Numel())); err != nil {
						return err
					}
				}
				if step == 2 {
					err := r.Ready(1)
					if !errors.Is(err, ErrStaticGraph) || !strings.Contains(err.Error(), `parameter 1 ("fc.weight")`) {
						return fmt.Errorf("Ready of a static unused parameter: %v, want ErrStaticGraph", err)
					}
					err = r.SetGrad(1, make([]float32, 6))
					if !errors.Is(err, ErrStaticGraph) || !strings.Contains(err.Error(), `SetGrad: rank `+fmt.Sprint(rank)+` step 3: parameter 1 ("fc.weight")`) {
						return fmt.Errorf("SetGrad of a static unused parameter: %v, want ErrStaticGraph", err)
					}
				}
				if err := r.Wait(ctx); err != nil {
					return err
				}
				if st := r.Stats(); len(st.Unused) != 1 || st.Unused[0] != 1 {
					return fmt.Errorf("step %d: Unused = %v, want [1]", step, st.Unused)
				}
			}
			return nil
		})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestCollectiveFailure injects a failed collective: Wait returns an error
// naming the bucket and its parameters, and the Reducer stays failed.
func TestCollectiveFailure(t *testing.T) {
	testutil.NoLeak(t)
	g, cs := commtest.NewFakeGroup(2)
	g.FailSeq = 2 // 1 is New's parameter check
	errs := withReducers(t, cs, threeParams, func() Options { return Options{} },
		func(rank int, r *Reducer) error {
			ctx := context.Background()
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := range threeParams {
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			err := r.Wait(ctx)
			if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "bucket 0") || !strings.Contains(err.Error(), `"fc.bias"`) {
				return fmt.Errorf("Wait: %v, want an abort naming bucket 0 and its parameters", err)
			}
			if err2 := r.Begin(Sync); !errors.Is(err2, comm.ErrAborted) {
				return fmt.Errorf("Begin after a failure: %v, want the sticky error", err2)
			}
			if r.Err() == nil {
				return fmt.Errorf("Err() is nil after a failure")
			}
			return nil
		})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestTimeoutAndStall: a collective that never completes is reported as a
// stall every StallInterval and then fails the step with a timeout; nothing
// hangs. It runs in fake time, so the counts are exact.
func TestTimeoutAndStall(t *testing.T) {
	testutil.NoLeak(t)
	synctest.Test(t, func(t *testing.T) {
		g, cs := commtest.NewFakeGroup(2)
		g.HangSeq = 2
		var stalls atomic.Int32
		errs := withReducers(t, cs, threeParams, func() Options {
			return Options{Timeout: 300 * time.Millisecond, StallInterval: 20 * time.Millisecond, OnStall: func(s comm.Stall) {
				if strings.Contains(s.Detail, "bucket 0 of") && strings.Contains(s.Detail, "on the wire") && s.Waited%(20*time.Millisecond) == 0 {
					stalls.Add(1)
				}
			}}
		}, func(rank int, r *Reducer) error {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := range threeParams {
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			err := r.Wait(context.Background())
			if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrAborted) {
				return fmt.Errorf("Wait: %v, want a timeout (or the peer's abort)", err)
			}
			if errors.Is(err, comm.ErrTimeout) && !strings.Contains(err.Error(), "bucket 0") {
				return fmt.Errorf("timeout error does not name the bucket: %v", err)
			}
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
		if n := stalls.Load(); n != 2*15 {
			t.Errorf("%d stall reports, want 15 per rank (every 20ms up to the 300ms timeout, the last just before it)", n)
		}
	})
}

// TestMissingRankNamed: a rank that never begins a step leaves its peers
// waiting in the first bucket's collective; their stall reports and the
// timeout error name it (inproc can tell which ranks have not joined).
func TestMissingRankNamed(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 3)
	var mu sync.Mutex
	var reports []comm.Stall
	errs := make([]error, 2)
	built := make(chan *Reducer, 1)
	var wg sync.WaitGroup
	for rank := range 3 {
		wg.Go(func() {
			// Timeout bounds New's check too: 2 s, so that a rank that a
			// loaded machine starts late does not fail the check.
			o := Options{Timeout: 2 * time.Second, StallInterval: 500 * time.Millisecond, KeepLayout: true}
			if rank < 2 {
				o.OnStall = func(s comm.Stall) {
					mu.Lock()
					reports = append(reports, s)
					mu.Unlock()
				}
			}
			r, err := New(context.Background(), cs[rank], threeParams, o)
			if err != nil {
				if rank < 2 {
					errs[rank] = err
				}
				return
			}
			if rank == 2 { // builds its Reducer, then never begins a step
				built <- r
				return
			}
			defer r.Close()
			if err := r.Begin(Sync); err != nil {
				errs[rank] = err
				return
			}
			for i := range threeParams {
				if err := r.Ready(i); err != nil {
					errs[rank] = err
					return
				}
			}
			errs[rank] = r.Wait(context.Background())
		})
	}
	wg.Wait()
	(<-built).Close()
	for rank, err := range errs {
		if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "rank(s) [2]") || !strings.Contains(err.Error(), "bucket 0") {
			t.Errorf("rank %d: Wait = %v; want a timeout naming rank 2 and bucket 0", rank, err)
		}
	}
	// A report taken as a peer's timeout aborts the group may find the
	// collective gone, and then cannot tell (Missing nil); any report that
	// names ranks must name rank 2 alone, and each waiting rank must have
	// named it at least once.
	named := map[int]bool{}
	for _, s := range reports {
		if s.Missing == nil {
			continue
		}
		if len(s.Missing) != 1 || s.Missing[0] != 2 || !strings.Contains(s.String(), "rank(s) [2]") {
			t.Errorf("stall report %q: missing %v; want rank 2", s, s.Missing)
		}
		named[s.Rank] = true
	}
	if !named[0] || !named[1] {
		t.Errorf("stall reports %v: want ranks 0 and 1 each to name rank 2", reports)
	}
}

// TestWaitContext: a context that expires ends Wait with its error.
func TestWaitContext(t *testing.T) {
	testutil.NoLeak(t)
	synctest.Test(t, func(t *testing.T) {
		g, cs := commtest.NewFakeGroup(2)
		g.HangSeq = 2
		errs := withReducers(t, cs, threeParams, func() Options { return Options{} }, func(rank int, r *Reducer) error {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := range threeParams {
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			err := r.Wait(ctx)
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, comm.ErrAborted) {
				return fmt.Errorf("Wait: %v, want the context's deadline (or the peer's abort)", err)
			}
			if want := fmt.Sprintf(`rank %d step 1: waiting for bucket 0 of 1 (3 parameters: "fc.bias", "fc.weight", "embed.weight")`, rank); !errors.Is(err, comm.ErrAborted) && !strings.Contains(err.Error(), want) {
				return fmt.Errorf("Wait: %v, want it to say %q", err, want)
			}
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBroadcastParameters(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 3)
	errs := withReducers(t, cs, threeParams, func() Options { return Options{BucketCap: 16, FirstBucketCap: 16} }, func(rank int, r *Reducer) error {
		vals := make([][]float32, len(threeParams))
		for i, p := range threeParams {
			vals[i] = make([]float32, p.Numel())
			for j := range vals[i] {
				vals[i][j] = float32(100*rank + 10*i + j)
			}
		}
		if err := r.BroadcastParameters(context.Background(), vals); err != nil {
			return err
		}
		for i := range vals {
			for j, v := range vals[i] {
				if v != float32(10*i+j) {
					return fmt.Errorf("param %d elem %d = %v, want rank 0's %v", i, j, v, 10*i+j)
				}
			}
		}
		bad := [][]float32{vals[0], vals[1], vals[2][:1]}
		if err := r.BroadcastParameters(context.Background(), bad); !errors.Is(err, ErrGradSize) || !strings.Contains(err.Error(), `"fc.bias"`) {
			return fmt.Errorf("short value slice: %v, want ErrGradSize naming fc.bias", err)
		}
		if err := r.Begin(Sync); !errors.Is(err, ErrGradSize) {
			return fmt.Errorf("Begin after a failed BroadcastParameters: %v, want the sticky error", err)
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestBroadcastParametersOneBadRank: a rank whose values have the wrong
// size fails at once and aborts the group, so its peers, waiting in the
// broadcast it never joins, fail too instead of hanging.
func TestBroadcastParametersOneBadRank(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 3)
	errs := withReducers(t, cs, threeParams, func() Options { return Options{} }, func(rank int, r *Reducer) error {
		vals := make([][]float32, len(threeParams))
		for i, p := range threeParams {
			vals[i] = make([]float32, p.Numel())
		}
		if rank == 1 {
			vals[2] = vals[2][:1]
		}
		// Generous: without the abort the peers would wait for this.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := r.BroadcastParameters(ctx, vals)
		switch {
		case rank == 1 && (!errors.Is(err, ErrGradSize) || !strings.Contains(err.Error(), `rank 1: Broadcast: parameter 2 ("fc.bias") has 2 elements, got 1`)):
			return fmt.Errorf("BroadcastParameters with a short slice: %v", err)
		case rank != 1 && !errors.Is(err, comm.ErrAborted):
			return fmt.Errorf("BroadcastParameters while rank 1 failed: %v, want the group aborted", err)
		case r.Err() == nil:
			return fmt.Errorf("the failure is not sticky")
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestRebuildTimeout: the broadcasts of the rebuild (inside the first synced
// step's Wait) are bounded by Options.Timeout like the step's own
// collectives; in fake time.
func TestRebuildTimeout(t *testing.T) {
	testutil.NoLeak(t)
	synctest.Test(t, func(t *testing.T) {
		g, cs := commtest.NewFakeGroup(2)
		g.HangSeq = 3 // 1: New's check, 2: the only bucket, 3: the rebuild's first broadcast
		errs := withReducers(t, cs, threeParams, func() Options { return Options{Timeout: time.Second} }, func(rank int, r *Reducer) error {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := range threeParams {
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			err := r.Wait(context.Background())
			if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrAborted) {
				return fmt.Errorf("Wait: %v, want a timeout (or the peer's abort)", err)
			}
			if errors.Is(err, comm.ErrTimeout) && !strings.Contains(err.Error(), "rebuilt layout") {
				return fmt.Errorf("timeout error does not say what timed out: %v", err)
			}
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
	})
}

// TestStats checks the step statistics for consistency.
func TestStats(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	errs := withReducers(t, cs, threeParams, func() Options { return Options{BucketCap: 24, FirstBucketCap: 8} }, func(rank int, r *Reducer) error {
		ctx := context.Background()
		for step := 1; step <= 3; step++ {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := len(threeParams) - 1; i >= 0; i-- {
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			if err := r.Wait(ctx); err != nil {
				return err
			}
			st := r.Stats()
			if st.Step != uint64(step) || !st.Sync {
				return fmt.Errorf("Step %d Sync %v, want %d true", st.Step, st.Sync, step)
			}
			if st.Bytes != 20*4 || len(st.Buckets) != len(r.Buckets()) {
				return fmt.Errorf("Bytes %d buckets %d, want 80 and %d", st.Bytes, len(st.Buckets), len(r.Buckets()))
			}
			if st.Compute != st.LastReady-st.FirstReady || st.Overlap > st.Comm || st.Comm > st.Wall || st.OverlapRatio < 0 || st.OverlapRatio > 1 {
				return fmt.Errorf("inconsistent totals: %+v", st)
			}
			// Buckets launch and finish in index order; bucket k+1 may
			// launch before k is done (both on the wire).
			var prevLaunch, prevDone time.Duration
			for k, b := range st.Buckets {
				if b.Index != k || b.Ready > b.Launch || b.Launch > b.CompressStart || b.CompressStart > b.CompressEnd ||
					b.CompressEnd > b.CollectiveStart || b.CollectiveStart > b.CollectiveEnd || b.CollectiveEnd > b.DecompressEnd ||
					b.DecompressEnd > b.Done || b.Launch < prevLaunch || b.Done < prevDone || b.Latency() < 0 {
					return fmt.Errorf("bucket %d timeline out of order: %+v", k, b)
				}
				prevLaunch, prevDone = b.Launch, b.Done
			}
			for i, tr := range st.ParamReady {
				if tr < 0 {
					return fmt.Errorf("param %d has no ready time", i)
				}
			}
		}
		var copy StepStats
		r.StatsInto(&copy)
		if copy.Step != 3 || len(copy.Buckets) != len(r.Stats().Buckets) {
			return fmt.Errorf("StatsInto: %+v", copy)
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestCloseMidStep closes rank 1's Reducer while its step is in flight: its
// bucket is on the wire, waiting for rank 0, which has not begun. Close
// returns (the communication goroutine is stopped, not left waiting), and
// rank 0's step then fails with the abort instead of waiting for rank 1.
// A Wait blocked on another goroutine of rank 1 returns when Close runs.
func TestCloseMidStep(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	closed := make(chan struct{})
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		ctx := context.Background()
		r, err := New(ctx, c, threeParams, Options{})
		if err != nil {
			return err
		}
		defer r.Close()
		if rank == 1 {
			if err := r.Begin(Sync); err != nil {
				return err
			}
			for i := range threeParams {
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			waited := make(chan error, 1)
			go func() { waited <- r.Wait(ctx) }()
			if err := r.Close(); err != nil {
				return fmt.Errorf("Close during a step: %v", err)
			}
			close(closed)
			if err := <-waited; !errors.Is(err, ErrClosed) {
				return fmt.Errorf("Wait ended by Close: %v, want ErrClosed", err)
			}
			return nil
		}
		<-closed
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := range threeParams {
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		err = r.Wait(ctx)
		if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "rank 1 closed during step 1") {
			return fmt.Errorf("Wait after the peer closed mid-step: %v, want the abort naming rank 1", err)
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestWaitCancelledAfterDone: a step whose buckets are all reduced stands
// even if Wait's context is already cancelled: Wait returns nil instead of
// failing (and aborting the group) over a race it has no reason to lose.
func TestWaitCancelledAfterDone(t *testing.T) {
	testutil.NoLeak(t)
	synctest.Test(t, func(t *testing.T) {
		r, err := New(context.Background(), commtest.Solo{}, threeParams, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		for step := range 20 {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			for i := range threeParams {
				if err := r.Ready(i); err != nil {
					t.Fatal(err)
				}
			}
			synctest.Wait() // the communication goroutine has reduced every bucket
			if err := r.Wait(cancelled); err != nil {
				t.Fatalf("step %d: Wait with a cancelled context after the step finished: %v", step, err)
			}
		}
	})
}

// TestReadyRacesAbort: while rank 1 marks its gradients from several
// goroutines (so buckets launch as they complete), rank 0 abandons the
// step. Every call of rank 1 returns, either nil (a Ready that came first)
// or the abort, and its Wait reports the abort: nothing hangs, and nothing
// reports success for a step that was not reduced.
func TestReadyRacesAbort(t *testing.T) {
	testutil.NoLeak(t)
	const np, workers = 48, 4
	params := make([]Param, np)
	for i := range params {
		params[i] = Param{Name: fmt.Sprintf("layer%d.weight", i), Shape: []int{1 + i%5, 4}}
	}
	for round := range 10 {
		cs := newTestGroup(t, 2)
		errs := runRanks(cs, func(rank int, c comm.Communicator) error {
			ctx := context.Background()
			r, err := New(ctx, c, params, Options{BucketCap: 64, FirstBucketCap: 32, KeepLayout: true})
			if err != nil {
				return err
			}
			defer r.Close()
			if err := r.Begin(Sync); err != nil {
				return err
			}
			if rank == 0 {
				for i := range round * np / 10 {
					if err := r.Ready(np - 1 - i); err != nil {
						return err
					}
				}
				return r.Close() // abandons the step: aborts the group
			}
			errc := make(chan error, workers)
			for w := range workers {
				go func() {
					for p := w; p < np; p += workers {
						if err := r.Ready(np - 1 - p); err != nil && !errors.Is(err, comm.ErrAborted) {
							errc <- fmt.Errorf("Ready(%d): %v, want nil or the abort", np-1-p, err)
							return
						}
					}
					errc <- nil
				}()
			}
			for range workers {
				if err := <-errc; err != nil {
					return err
				}
			}
			if err := r.Wait(ctx); !errors.Is(err, comm.ErrAborted) {
				return fmt.Errorf("Wait after the peer abandoned the step: %v, want the abort", err)
			}
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// TestNewCancelled: a rank whose New fails in the check's collective (its
// context is cancelled) aborts the group, so a peer whose New completed
// fails its first step at once instead of waiting for this rank.
func TestNewCancelled(t *testing.T) {
	testutil.NoLeak(t)
	cs := newTestGroup(t, 2)
	failed := make(chan struct{})
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		if rank == 1 {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := New(ctx, c, threeParams, Options{})
			close(failed)
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "rank 1") {
				return fmt.Errorf("New with a cancelled context: %v", err)
			}
			return nil
		}
		<-failed
		// Generous: without the abort this rank would wait here for rank 1.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := New(ctx, c, threeParams, Options{})
		if err != nil {
			if !errors.Is(err, comm.ErrAborted) {
				return fmt.Errorf("New after the peer's failed New: %v, want the abort", err)
			}
			return nil
		}
		defer r.Close()
		if err := r.Begin(Sync); err != nil {
			return err
		}
		for i := range threeParams {
			if err := r.Ready(i); err != nil {
				return err
			}
		}
		if err := r.Wait(ctx); !errors.Is(err, comm.ErrAborted) {
			return fmt.Errorf("first step after the peer's failed New: %v, want the abort", err)
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestSharedHook: one Hook value given to two ranks is refused (each rank
// needs its own): every rank fails with hooks.ErrShared, the rank whose
// Setup found the hook taken and the rank that had taken it, which learns
// of it in New's check; none reports a parameter mismatch, and nothing
// races.
func TestSharedHook(t *testing.T) {
	testutil.NoLeak(t)
	for _, mk := range []func() hooks.Hook{hooks.Avg, hooks.FP16} {
		h := mk()
		cs := newTestGroup(t, 2)
		errs := runRanks(cs, func(rank int, c comm.Communicator) error {
			r, err := New(context.Background(), c, threeParams, Options{Hook: h})
			if err == nil {
				r.Close()
			}
			return err
		})
		for rank, err := range errs {
			switch {
			case !errors.Is(err, hooks.ErrShared):
				t.Errorf("%s: rank %d: %v, want hooks.ErrShared", h.Name(), rank, err)
			case errors.Is(err, ErrParamMismatch) || strings.Contains(err.Error(), "differ"):
				t.Errorf("%s: rank %d: %v reports a mismatch", h.Name(), rank, err)
			case !strings.Contains(err.Error(), fmt.Sprintf("rank %d", 1-rank)):
				t.Errorf("%s: rank %d: %v does not name rank %d", h.Name(), rank, err, 1-rank)
			}
		}
	}
}

// TestNewAfterSharedHook: New failing because one Hook value was given to
// both ranks is a verdict every rank reaches from the check's data, not a
// failed collective: it leaves the communicators usable, as a parameter
// mismatch does, and New on them with the mistake fixed succeeds.
func TestNewAfterSharedHook(t *testing.T) {
	testutil.NoLeak(t)
	for _, c := range []struct {
		name  string
		first func(rank int, shared hooks.Hook) ([]Param, Options)
		want  error
	}{
		{"shared hook", func(int, hooks.Hook) ([]Param, Options) { return threeParams, Options{} }, hooks.ErrShared},
		{"mismatch", func(rank int, _ hooks.Hook) ([]Param, Options) { return threeParams[:2+rank], Options{} }, ErrParamMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := newTestGroup(t, 2)
			shared := hooks.Avg()
			errs := runRanks(cs, func(rank int, cm comm.Communicator) error {
				params, o := c.first(rank, shared)
				if c.want == hooks.ErrShared {
					o.Hook = shared
				}
				r, err := New(context.Background(), cm, params, o)
				if err == nil {
					r.Close()
					return fmt.Errorf("the first New succeeded")
				}
				if !errors.Is(err, c.want) {
					return fmt.Errorf("the first New: %v, want %v", err, c.want)
				}
				r, err = New(context.Background(), cm, threeParams, Options{})
				if err != nil {
					return fmt.Errorf("New again, mistake fixed: %w", err)
				}
				defer r.Close()
				if err := r.Begin(Sync); err != nil {
					return err
				}
				for i := range threeParams {
					if err := r.Ready(i); err != nil {
						return err
					}
				}
				return r.Wait(context.Background())
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}
