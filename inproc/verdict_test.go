package inproc

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestOneVerdictAfterAbort: a small collective that every rank has
// published completes on every rank, even if the group fails before a
// rank's wait for the calls has seen the last one. Here rank 1 waits (on
// its worker) for rank 0's call; right after it finds the call missing,
// rank 0 publishes, completes its part and aborts the group. Rank 0's
// collective has succeeded, so rank 1's must too, not fail with the abort
// (the ranks of ddp's TestCloseMidCollective saw the two verdicts when a
// loaded machine descheduled rank 1 between its two looks).
func TestOneVerdictAfterAbort(t *testing.T) {
	testutil.NoLeak(t)
	g, err := NewGroup(2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range g {
			c.Close()
		}
	}()
	in := [2][]int64{{10, 11}, {20, 21}}
	out := [2][]int64{make([]int64, 4), make([]int64, 4)}
	var once sync.Once
	var err0 error
	testMissingCall = func(c *Comm) {
		if c.rank != 1 {
			return
		}
		once.Do(func() {
			w0 := g[0].AllGather(comm.Int64s(in[0]), comm.Int64s(out[0]))
			err0 = w0.Wait(context.Background())
			g[0].Abort(errors.New("rank 0 closed"))
		})
	}
	defer func() { testMissingCall = nil }()
	w1 := g[1].AllGather(comm.Int64s(in[1]), comm.Int64s(out[1]))
	err1 := w1.Wait(context.Background()) // parks: rank 1's worker waits for the calls
	if err0 != nil {
		t.Fatalf("rank 0: %v", err0)
	}
	if err1 != nil {
		t.Fatalf("rank 0's all-gather succeeded, rank 1's failed: %v", err1)
	}
	want := []int64{10, 11, 20, 21}
	for r := range 2 {
		for i, v := range out[r] {
			if v != want[i] {
				t.Fatalf("rank %d gathered %v, want %v", r, out[r], want)
			}
		}
	}
}
