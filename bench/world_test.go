package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// perProcess runs f once per rank of an in-process group, each call given
// only its own rank's communicator, as each process of a job launched
// with mpirun is: the calls meet only through the communicator.
func perProcess[T any](t *testing.T, n int, f func(c []comm.Communicator) (T, error)) []T {
	t.Helper()
	g := group(t, n)
	out := make([]T, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { out[r], errs[r] = f(g[r : r+1]) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

// TestRunLaunched: with one rank per caller, every caller gets the
// statistics of the whole group: the slowest rank's step, all ranks'
// overflows and bus bandwidth over all of them, the same on every rank.
func TestRunLaunched(t *testing.T) {
	const n = 3
	res := perProcess(t, n, func(c []comm.Communicator) (*Result, error) {
		// Rank 2's backward is ten times slower: the step time is its.
		rate := 2e7
		if c[0].Rank() == 2 {
			rate = 2e6
		}
		return Run(context.Background(), Config{Params: tinyParams(), Comms: c, BucketCap: 256 << 10, FirstBucketCap: 16 << 10,
			Steps: 4, Warmup: 1, Compute: ComputeSleep, Rate: rate, TraceSteps: 2})
	})
	for r, got := range res {
		if got.Ranks != n || got.Steps != 4 || len(got.Trace) != 2 || len(got.Trace[0]) != 1 {
			t.Fatalf("rank %d: %d ranks, %d steps, trace %d x %d; want %d ranks, 4 steps, trace 2 x 1 (its own rank)",
				r, got.Ranks, got.Steps, len(got.Trace), len(got.Trace[0]), n)
		}
		if got.StepTime != res[0].StepTime || got.CommTime != res[0].CommTime || got.BusBW != res[0].BusBW {
			t.Errorf("rank %d's statistics differ from rank 0's: %+v against %+v", r, got.StepTime, res[0].StepTime)
		}
	}
	slow := float64(tinyNumel()) / 2e6
	if got := res[0].ComputeTime.Median; got < 0.9*slow {
		t.Errorf("compute %.3g s, want the slowest rank's (about %.3g s)", got, slow)
	}
	if got := res[0].StepTime.Median; got < 0.9*slow {
		t.Errorf("step %.3g s, want at least the slowest rank's backward (about %.3g s)", got, slow)
	}
}

// TestCollectiveLaunched: with one rank per caller, the rows cover every
// rank: the slowest time under -a 3, wrong elements summed over ranks.
func TestCollectiveLaunched(t *testing.T) {
	const n = 2
	cfg := CollectiveConfig{Op: AllReduce, MinBytes: 1 << 10, MaxBytes: 1 << 16, Factor: 4, Iters: 3, Warmup: 1, Check: true,
		Average: AverageMax, Timeout: 20 * time.Second}
	corruptHook = func(rank int, inPlace bool, out comm.Buffer) {
		if rank == 1 && inPlace {
			out.AsFloat32()[0] = -1
		}
	}
	defer func() { corruptHook = nil }()
	rows := perProcess(t, n, func(c []comm.Communicator) ([]CollectiveRow, error) {
		return RunCollective(context.Background(), c, cfg, nil)
	})
	for r, rs := range rows {
		if len(rs) != 4 {
			t.Fatalf("rank %d: %d rows, want 4", r, len(rs))
		}
		for i, row := range rs {
			if row.OutOfPlace.Wrong != 0 || row.InPlace.Wrong != 1 {
				t.Errorf("rank %d row %d: wrong %d out of place, %d in place; want 0 and rank 1's 1", r, i, row.OutOfPlace.Wrong, row.InPlace.Wrong)
			}
			if row.InPlace.Time != rows[0][i].InPlace.Time {
				t.Errorf("rank %d row %d: in-place time %v, rank 0 has %v: want the group's", r, i, row.InPlace.Time, rows[0][i].InPlace.Time)
			}
		}
	}
}

// TestHosts: every rank learns every rank's host name and pid.
func TestHosts(t *testing.T) {
	hs := perProcess(t, 3, func(c []comm.Communicator) ([]Host, error) {
		r := c[0].Rank()
		return Hosts(context.Background(), c[0], fmt.Sprintf("host-%d-with-a-name-longer-than-the-part-of-it-that-is-kept-%d", r, r), 100+r)
	})
	for r, got := range hs {
		for q, h := range got {
			want := fmt.Sprintf("host-%d-with-a-name-longer-than-the-part-of-it-that-is-kept-%d", q, q)[:HostNameMax]
			if h.Rank != q || h.PID != 100+q || h.Name != want {
				t.Errorf("rank %d sees rank %d as %+v, want %q pid %d", r, q, h, want, 100+q)
			}
		}
	}
}

func tinyNumel() int64 {
	var n int64
	for _, p := range tinyParams() {
		n += int64(p.Numel())
	}
	return n
}

// TestGatherStalls: a rank that waits between steps for a peer that never
// comes (stopped, its link cut) reports the stall, saying what it waits
// for, and fails at the deadline, as the reducer's own waits do.
func TestGatherStalls(t *testing.T) {
	g := group(t, 2)
	ex, err := newExchange(g[0], 2)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var stalls []comm.Stall
	ex.watch(comm.Watchdog{StallInterval: 20 * time.Millisecond, Timeout: 150 * time.Millisecond, OnStall: func(s comm.Stall) {
		mu.Lock()
		stalls = append(stalls, s)
		mu.Unlock()
	}}, "gathering the step's statistics")
	_, err = ex.gather(context.Background(), 1, 2) // rank 1 never gathers
	if !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("gather without the peer: %v, want ErrTimeout", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stalls) < 2 || stalls[0].Kind != comm.KindAllGather || stalls[0].Detail != "gathering the step's statistics" || stalls[0].Rank != 0 {
		t.Fatalf("stall reports %+v; want at least 2 for rank 0's all-gather, with the detail", stalls)
	}
	// The all-gather may still write the buffers: they are never returned.
	g[0].Abort(err)
	g[1].Abort(err)
	ex.close()
	if !ex.leaked {
		t.Fatal("the buffers of a gather that timed out were returned to the pool")
	}
}
