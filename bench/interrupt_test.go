package bench

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/ddp"
)

// TestRunOnInterrupt: with OnInterrupt, an interrupted run hands the
// statistics of the measured steps completed to OnInterrupt once, while
// the ranks still run (so that a job whose stopping ends the process can
// print them first), and still returns them; the error carries the
// context's cause.
func TestRunOnInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	var calls atomic.Int32
	var early *Result
	var measured atomic.Int64
	stepped := make(chan struct{}, 1)
	ranAfter := false
	res, err := Run(ctx, Config{Params: tinyParams(), Comms: group(t, 2), Steps: 1 << 40, Warmup: 1,
		OnStep: func(rank int, m bool, _ *ddp.StepStats) {
			if rank != 0 || !m {
				return
			}
			if measured.Add(1) == 5 {
				cancel(errors.New("received interrupt"))
			}
			select {
			case stepped <- struct{}{}:
			default:
			}
		},
		OnInterrupt: func(r *Result) {
			calls.Add(1)
			early = r
			// The ranks are still stepping: another step completes.
			for range 2 {
				select {
				case <-stepped:
					ranAfter = true
				case <-time.After(30 * time.Second):
					ranAfter = false
				}
			}
		},
	})
	switch {
	case calls.Load() != 1:
		t.Fatalf("OnInterrupt called %d times, want once", calls.Load())
	case early == nil || !early.Interrupted || early.Steps < 4 || early.Trace != nil || len(early.Buckets) == 0:
		t.Fatalf("OnInterrupt's result %+v: want the 4 or more measured steps completed, interrupted, no trace", early)
	case !ranAfter:
		t.Fatal("the ranks had stopped before OnInterrupt returned")
	case res == nil || !res.Interrupted || res.Steps < early.Steps:
		t.Fatalf("Run's result %+v: want interrupted, with at least OnInterrupt's %d steps", res, early.Steps)
	case !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "received interrupt"):
		t.Fatalf("Run's error %v: want the context's cause", err)
	}
}
