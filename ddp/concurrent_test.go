package ddp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestConcurrentWaits: two goroutines in Wait at once must both return.
// The step's completion reaches one waiter, so the second fails at once
// with ErrConcurrent instead of blocking forever; every step of the loop
// ends with exactly one nil (the step's outcome) and, on the other
// goroutine, ErrConcurrent or ErrNoStep (it came after the step ended).
func TestConcurrentWaits(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			testutil.NoLeak(t)
			synctest.Test(t, func(t *testing.T) {
				_, cs := commtest.NewFakeGroup(n)
				errs := withReducers(t, cs, threeParams, func() Options { return Options{Timeout: 3 * time.Second} }, func(rank int, r *Reducer) error {
					for step := range 200 {
						if err := r.Begin(Sync); err != nil {
							return err
						}
						for i := range threeParams {
							if err := r.Ready(i); err != nil {
								return err
							}
						}
						start := time.Now()
						errs := make(chan error, 2)
						for range 2 {
							go func() { errs <- r.Wait(context.Background()) }()
						}
						a, b := <-errs, <-errs
						if a != nil {
							a, b = b, a
						}
						if a != nil || !(errors.Is(b, ErrConcurrent) || errors.Is(b, ErrNoStep)) {
							return fmt.Errorf("step %d: two concurrent Waits returned %v and %v; want nil and ErrConcurrent (or ErrNoStep)", step, a, b)
						}
						if d := time.Since(start); d >= 3*time.Second {
							return fmt.Errorf("step %d: the Waits returned after %v, at the timeout; want them at once", step, d)
						}
					}
					return nil
				})
				if err := firstErr(errs); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestConcurrentBlockingCalls: while one goroutine is blocked in Wait,
// WaitEach, Join or Broadcast, the same calls from another goroutine
// fail at once with ErrConcurrent, naming both calls, without issuing a
// collective (which would put this rank's sequence out of step with its
// peers'); and Close ends the blocked call promptly (with ErrClosed, or
// the abort it caused) and returns only once it has returned, so no
// collective writes memory Close gave back.
func TestConcurrentBlockingCalls(t *testing.T) {
	// Collectives: 1 New's check, 2 the first one under test.
	blockers := []struct {
		name  string
		step  bool // the call runs in a synced step
		block func(r *Reducer) error
	}{
		{"Wait", true, func(r *Reducer) error { return r.Wait(context.Background()) }},
		{"WaitEach", true, func(r *Reducer) error { return r.WaitEach(context.Background(), func(Reduced) {}) }},
		{"Join", false, func(r *Reducer) error { _, err := r.Join(context.Background()); return err }},
		{"Broadcast", false, func(r *Reducer) error { return r.BroadcastParameters(context.Background(), zeroValues(threeParams)) }},
	}
	others := []struct {
		name string
		call func(r *Reducer) error
	}{
		{"Wait", func(r *Reducer) error { return r.Wait(context.Background()) }},
		{"WaitEach", func(r *Reducer) error { return r.WaitEach(context.Background(), func(Reduced) {}) }},
		{"Join", func(r *Reducer) error { _, err := r.Join(context.Background()); return err }},
		{"Broadcast", func(r *Reducer) error { return r.BroadcastParameters(context.Background(), zeroValues(threeParams)) }},
		{"Begin", func(r *Reducer) error { return r.Begin(Sync) }},
	}
	for _, bl := range blockers {
		t.Run(bl.name, func(t *testing.T) {
			testutil.NoLeak(t)
			synctest.Test(t, func(t *testing.T) {
				g, cs := commtest.NewFakeGroup(1)
				g.HangSeq = 2
				const timeout = time.Minute
				r, err := New(context.Background(), cs[0], threeParams, Options{Timeout: timeout, Join: JoinWorld})
				if err != nil {
					t.Fatal(err)
				}
				if bl.step {
					if err := r.Begin(Sync); err != nil {
						t.Fatal(err)
					}
					for i := range threeParams {
						if err := r.Ready(i); err != nil {
							t.Fatal(err)
						}
					}
				}
				start := time.Now()
				blocked := make(chan error, 1)
				go func() { blocked <- bl.block(r) }()
				synctest.Wait()
				select {
				case err := <-blocked:
					t.Fatalf("%s returned %v before the collective it waits for completed", bl.name, err)
				default:
				}
				for _, o := range others {
					if o.name == "Begin" && !bl.step {
						continue // Begin is no blocking call; between steps it starts one
					}
					err := o.call(r)
					want := fmt.Sprintf("%s called while %s is running", o.name, bl.name)
					if !errors.Is(err, ErrConcurrent) || !contains(err, want) {
						t.Errorf("%s during a blocked %s: %v; want ErrConcurrent saying %q", o.name, bl.name, err, want)
					}
				}
				if err := r.Close(); err != nil && !errors.Is(err, ErrInFlight) {
					t.Errorf("Close: %v", err)
				}
				select {
				case err := <-blocked:
					if !errors.Is(err, ErrClosed) && !errors.Is(err, comm.ErrAborted) {
						t.Errorf("%s ended by Close: %v, want ErrClosed", bl.name, err)
					}
				default:
					t.Fatalf("%s still blocked when Close returned", bl.name)
				}
				if d := time.Since(start); d >= timeout {
					t.Errorf("%s ended %v after it began, at its timeout; want Close to end it", bl.name, d)
				}
			})
		})
	}
}

func zeroValues(params []Param) [][]float32 {
	vals := make([][]float32, len(params))
	for i, p := range params {
		vals[i] = make([]float32, p.Numel())
	}
	return vals
}

func contains(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}
