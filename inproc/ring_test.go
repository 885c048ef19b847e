package inproc

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// ringSize is the number of operations a rank may have pending.
const ringSize = backend.RingSize

// TestWaitAfterSlotReuse waits again on operations whose ring slots have
// been reused: each must still report its own result, a failure as a
// failure and a success as a success.
func TestWaitAfterSlotReuse(t *testing.T) {
	cs := testGroup(t, 2, Options{})
	barriers := func() []comm.Work { return []comm.Work{cs[0].Barrier(), cs[1].Barrier()} }
	good := barriers()
	testutil.WaitAll(t, good...)
	// A mismatch fails the collective but leaves the group usable.
	bad := []comm.Work{allReduceInPlace(cs[0], comm.Float32s(make([]float32, 3)), comm.Sum), allReduceInPlace(cs[1], comm.Float32s(make([]float32, 3)), comm.Max)}
	testutil.WaitAll(t, bad...)
	for range ringSize + 3 {
		for r, err := range testutil.WaitAll(t, barriers()...) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	for r, err := range testutil.WaitAll(t, bad...) {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: waiting again on the mismatched all_reduce after %d more operations: %v, want ErrMismatch", r, ringSize+3, err)
		}
	}
	cs[1].Abort(errors.New("test"))
	var late []comm.Work
	for range ringSize + 3 {
		ws := barriers()
		testutil.WaitAll(t, ws...)
		late = append(late, ws...)
	}
	for r, err := range testutil.WaitAll(t, good...) {
		if err != nil {
			t.Errorf("rank %d: waiting again on a barrier that succeeded before the group was aborted: %v, want nil", r, err)
		}
	}
	for r, err := range testutil.WaitAll(t, bad...) {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: waiting again on the mismatched all_reduce after the abort: %v, want ErrMismatch", r, err)
		}
	}
	for i, err := range testutil.WaitAll(t, late[:4]...) {
		if !errors.Is(err, comm.ErrAborted) {
			t.Errorf("barrier %d after the abort, waited again: %v, want ErrAborted", i, err)
		}
	}
}

// TestTestOpWhileSlotReused polls a failed operation while the ring slot
// it lives in is rewritten by later, successful operations: no poll may
// ever see the failed operation succeed.
func TestTestOpWhileSlotReused(t *testing.T) {
	cs := testGroup(t, 2, Options{})
	bad := allReduceInPlace(cs[0], comm.Float32s(make([]float32, 3)), comm.Sum)
	allReduceInPlace(cs[1], comm.Float32s(make([]float32, 4)), comm.Sum)
	if err := bad.Wait(context.Background()); !errors.Is(err, comm.ErrMismatch) {
		t.Fatalf("%v, want ErrMismatch", err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var polls, wrong atomic.Int64
	wg.Go(func() {
		for !stop.Load() {
			polls.Add(1)
			if done, err := bad.Test(); !done || err == nil {
				wrong.Add(1)
			}
			runtime.Gosched() // with one P, let the workers run
		}
	})
	for range 4 * ringSize {
		testutil.WaitAll(t, []comm.Work{cs[0].Barrier(), cs[1].Barrier()}...)
	}
	stop.Store(true)
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Errorf("%d of %d polls of a failed operation said it had not failed", n, polls.Load())
	}
}
