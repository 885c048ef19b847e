// Package testutil holds the helpers every package's tests share: waiting
// for a set of Works under a deadline, and checking that a test leaves no
// goroutine behind. It is imported by tests only.
package testutil

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// WaitDeadline bounds WaitAll: long enough for any test's collective on a
// loaded machine, short enough that a hang fails the test rather than the
// whole binary's timeout.
const WaitDeadline = 2 * time.Minute

// WaitAll waits for every Work in turn and returns their errors, in order.
// A Work that has not completed within WaitDeadline fails the test at
// once, naming it.
func WaitAll(t testing.TB, ws ...comm.Work) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), WaitDeadline)
	defer cancel()
	errs := make([]error, len(ws))
	for i, w := range ws {
		errs[i] = w.Wait(ctx)
		if errors.Is(errs[i], context.DeadlineExceeded) && ctx.Err() != nil {
			t.Fatalf("operation %d (#%d) did not complete in %v: %v", i, w.ID(), WaitDeadline, errs[i])
		}
	}
	return errs
}

// MustWaitAll is WaitAll for Works that must succeed: any error fails the
// test.
func MustWaitAll(t testing.TB, ws ...comm.Work) {
	t.Helper()
	for i, err := range WaitAll(t, ws...) {
		if err != nil {
			t.Fatalf("operation %d (#%d): %v", i, ws[i].ID(), err)
		}
	}
}

// settle is how long Goroutines waits for goroutines that are ending.
const settle = 5 * time.Second

// NoLeak fails the test if goroutines started during it are still running
// when it ends (after its other cleanups, which run first when NoLeak is
// called first).
func NoLeak(t testing.TB) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() { Goroutines(t, before) })
}

// Goroutines fails the test if more than before goroutines are still
// running once those that are ending have had a few seconds to end, and
// prints every goroutine's stack.
func Goroutines(t testing.TB, before int) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines left running, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
