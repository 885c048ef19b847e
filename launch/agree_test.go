package launch_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/launch"
)

// agreeAll runs Agree on every rank of an in-process group with the given
// statuses, and returns what each rank got.
func agreeAll(t *testing.T, ctx context.Context, statuses []int) (failed, codes []int, errs []error) {
	t.Helper()
	cs, err := launch.Open(context.Background(), "inproc", launch.Options{Ranks: len(statuses)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	failed, codes, errs = make([]int, len(cs)), make([]int, len(cs)), make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { failed[r], codes[r], errs[r] = launch.Agree(ctx, c, statuses[r]) })
	}
	wg.Wait()
	return failed, codes, errs
}

func TestAgree(t *testing.T) {
	for _, tc := range []struct {
		statuses           []int
		wantRank, wantCode int
	}{
		{[]int{0}, -1, 0},
		{[]int{0, 0, 0, 0}, -1, 0},
		{[]int{2, 0}, 0, 2},
		{[]int{0, 2, 0, 1}, 1, 2}, // the highest status
		{[]int{0, 1, 0, 1}, 3, 1}, // of those, the highest rank
		{[]int{0, 255, 0}, 1, 255},
	} {
		failed, codes, errs := agreeAll(t, context.Background(), tc.statuses)
		for r := range tc.statuses {
			if errs[r] != nil || failed[r] != tc.wantRank || codes[r] != tc.wantCode {
				t.Errorf("statuses %v, rank %d: Agree = %d, %d, %v; want %d, %d, nil", tc.statuses, r, failed[r], codes[r], errs[r], tc.wantRank, tc.wantCode)
			}
		}
	}
}

func TestAgreeErrors(t *testing.T) {
	cs, err := launch.Open(context.Background(), "inproc", launch.Options{Ranks: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for _, st := range []int{-1, 256} {
		if _, _, err := launch.Agree(context.Background(), cs[1], st); err == nil || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("status %d: %v; want an error naming rank 1 and the status", st, err)
		}
	}
	// A peer that never comes: the context ends the wait, and the error
	// says what this rank was doing.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err = launch.Agree(ctx, cs[0], 0)
	if err == nil || !strings.Contains(err.Error(), "rank 0 of 2: agreeing that every rank is ready") {
		t.Errorf("without the peer: %v; want the wait ended, naming rank 0", err)
	}
	cs[0].Abort(comm.ErrAborted) // the pending all-reduce ends with the group
}
