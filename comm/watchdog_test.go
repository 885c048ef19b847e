package comm_test

import (
	"bytes"
	"context"
	"errors"
	"log"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// TestWatchSchedule drives a Watch with explicit times: what is due at
// each check, and how long the waiter should park until the next event.
func TestWatchSchedule(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at              time.Duration
		report, expired bool
		next            time.Duration
	}
	for _, tc := range []struct {
		name     string
		interval time.Duration
		timeout  time.Duration
		steps    []step
	}{
		{"reports, then a late wake-up reports once, then the timeout with its report", 10 * time.Second, 35 * time.Second, []step{
			{0, false, false, 10 * time.Second},
			{5 * time.Second, false, false, 5 * time.Second},
			{10 * time.Second, true, false, 10 * time.Second},
			{12 * time.Second, false, false, 8 * time.Second},
			{27 * time.Second, true, false, 3 * time.Second}, // 20 s was missed: one report, the next at 30 s
			{30 * time.Second, true, false, 5 * time.Second}, // the deadline comes before the report at 40 s
			{35 * time.Second, false, true, 0},
		}},
		{"a stall interval longer than the timeout never reports", time.Hour, 20 * time.Millisecond, []step{
			{19 * time.Millisecond, false, false, time.Millisecond},
			{20 * time.Millisecond, false, true, 0},
		}},
		{"equal: the timeout comes with a report", 5 * time.Millisecond, 5 * time.Millisecond, []step{
			{time.Millisecond, false, false, 4 * time.Millisecond},
			{9 * time.Millisecond, true, true, 0},
		}},
		{"defaults", 0, 0, []step{
			{59 * time.Second, false, false, time.Second},
			{60 * time.Second, true, false, 60 * time.Second},
			{10 * time.Minute, true, true, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := comm.Watchdog{StallInterval: tc.interval, Timeout: tc.timeout}.Start(t0)
			for _, s := range tc.steps {
				now := t0.Add(s.at)
				report, expired := w.Check(now)
				if report != s.report || expired != s.expired {
					t.Fatalf("at %v: report %v, expired %v; want %v, %v", s.at, report, expired, s.report, s.expired)
				}
				if next := w.Next(now); next != s.next {
					t.Fatalf("at %v: next event in %v, want %v", s.at, next, s.next)
				}
				if w.Waited(now) != s.at {
					t.Fatalf("at %v: waited %v", s.at, w.Waited(now))
				}
			}
		})
	}
}

func TestWatchdogOptions(t *testing.T) {
	d := comm.Watchdog{}.WithDefaults()
	if d.StallInterval != comm.DefaultStallInterval || d.Timeout != comm.DefaultTimeout || comm.DefaultStallInterval != time.Minute || comm.DefaultTimeout != 10*time.Minute {
		t.Errorf("defaults: %v, %v; want 1m and 10m", d.StallInterval, d.Timeout)
	}
	if d := (comm.Watchdog{StallInterval: time.Second, Timeout: time.Hour}).WithDefaults(); d.StallInterval != time.Second || d.Timeout != time.Hour {
		t.Errorf("WithDefaults changed set fields: %+v", d)
	}
	for _, tc := range []struct {
		d    comm.Watchdog
		name string
	}{{comm.Watchdog{StallInterval: -1}, "StallInterval"}, {comm.Watchdog{Timeout: -time.Second}, "Timeout"}} {
		if err := tc.d.Validate(); !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalid naming %s", tc.d, err, tc.name)
		}
	}
	if err := (comm.Watchdog{}).Validate(); err != nil {
		t.Errorf("Validate of the zero Watchdog: %v", err)
	}
}

func TestStallString(t *testing.T) {
	for _, tc := range []struct {
		s    comm.Stall
		want string
	}{
		{comm.Stall{Rank: 0, Seq: 5, Kind: comm.KindAllReduce, Missing: []int{2, 3}, Waited: 61 * time.Second},
			"comm: rank 0 has waited 1m1s in all_reduce #5 for rank(s) [2 3]"},
		{comm.Stall{Rank: 1, Seq: 7, Kind: comm.KindBroadcast, Waited: time.Minute, Detail: "step 3, bucket 2 (fc.weight, fc.bias)"},
			"comm: rank 1 has waited 1m0s in broadcast #7 (the backend cannot tell which ranks have not joined): step 3, bucket 2 (fc.weight, fc.bias)"},
		{comm.Stall{Rank: 1, Seq: 7, Kind: comm.KindBarrier, Missing: []int{}, Waited: time.Minute},
			"comm: rank 1 has waited 1m0s in barrier #7 (every rank has joined; the data is still moving)"},
		{comm.Stall{Rank: 2, Seq: 9, Missing: []int{0}, Waited: time.Second},
			"comm: rank 2 has waited 1s in operation #9 for rank(s) [0]"},
	} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("String() = %q\n want %q", got, tc.want)
		}
	}
	err := comm.Stall{Rank: 0, Seq: 1, Kind: comm.KindBarrier, Missing: []int{1}, Waited: 20 * time.Millisecond}.TimeoutError()
	if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "after 20ms: rank 0 waited in barrier #1 for rank(s) [1]") {
		t.Errorf("TimeoutError() = %v", err)
	}
}

func TestReportLogs(t *testing.T) {
	var buf bytes.Buffer
	out, flags := log.Writer(), log.Flags()
	log.SetOutput(&buf)
	log.SetFlags(0)
	defer func() { log.SetOutput(out); log.SetFlags(flags) }()
	s := comm.Stall{Rank: 3, Seq: 2, Kind: comm.KindReduce, Missing: []int{1}, Waited: time.Second}
	comm.Watchdog{}.Report(s)
	if got := strings.TrimSpace(buf.String()); got != s.String() {
		t.Errorf("logged %q, want %q", got, s.String())
	}
	var got []comm.Stall
	comm.Watchdog{OnStall: func(s comm.Stall) { got = append(got, s) }}.Report(s)
	if len(got) != 1 || got[0].Seq != 2 || buf.Len() != len(s.String())+1 {
		t.Errorf("OnStall got %v, and the log %q", got, buf.String())
	}
}

// fake is one pending operation of a one-rank backend that completes
// when done is closed, with err, and reports rank 2 missing.
type fake struct {
	comm.Communicator // only Rank is called
	done              chan struct{}
	err               error
}

func (f *fake) Rank() int { return 0 }

func (f *fake) WaitOp(ctx context.Context, id uint64) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (f *fake) TestOp(id uint64) (bool, error) {
	select {
	case <-f.done:
		return true, f.err
	default:
		return false, nil
	}
}

func (f *fake) Missing(w comm.Work) []int {
	if !w.IssuedBy(f) {
		return nil
	}
	return []int{2}
}

// TestWatchdogWait checks Wait under synctest's fake clock: the stall
// reports (their times, the missing rank, the detail), completion,
// failure, the timeout and the caller's context.
func TestWatchdogWait(t *testing.T) {
	for _, tc := range []struct {
		name        string
		completeAt  time.Duration // 0: never
		err         error
		cancelAt    time.Duration // 0: never
		wantReports []time.Duration
		wantErr     error
	}{
		{"completes after two reports", 25 * time.Second, nil, 0, []time.Duration{10 * time.Second, 20 * time.Second}, nil},
		{"fails", 15 * time.Second, comm.ErrAborted, 0, []time.Duration{10 * time.Second}, comm.ErrAborted},
		{"times out", 0, nil, 0, []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second}, comm.ErrTimeout},
		{"the context ends", 0, nil, 15 * time.Second, []time.Duration{10 * time.Second}, context.Canceled},
		{"at once", time.Nanosecond, nil, 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fake{done: make(chan struct{}), err: tc.err}
				start := time.Now()
				var reports []comm.Stall
				dog := comm.Watchdog{StallInterval: 10 * time.Second, Timeout: 30 * time.Second, OnStall: func(s comm.Stall) { reports = append(reports, s) }}
				if tc.completeAt > 0 {
					time.AfterFunc(tc.completeAt, func() { close(f.done) })
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.cancelAt > 0 {
					time.AfterFunc(tc.cancelAt, cancel)
				}
				err := dog.Wait(ctx, f, comm.NewWork(f, 4), comm.Stall{Seq: 4, Kind: comm.KindAllReduce, Detail: "bucket 1"})
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
					t.Fatalf("Wait = %v, want %v", err, tc.wantErr)
				}
				if tc.wantErr == comm.ErrTimeout && !strings.Contains(err.Error(), "all_reduce #4 for rank(s) [2]: bucket 1") {
					t.Errorf("timeout error %q does not name the operation, rank 2 and the detail", err)
				}
				if len(reports) != len(tc.wantReports) {
					t.Fatalf("%d reports (%v), want at %v", len(reports), reports, tc.wantReports)
				}
				for i, s := range reports {
					if s.Waited != tc.wantReports[i] || s.Seq != 4 || s.Kind != comm.KindAllReduce || len(s.Missing) != 1 || s.Missing[0] != 2 || s.Detail != "bucket 1" {
						t.Errorf("report %d: %+v; want rank 2 missing from all_reduce #4 after %v", i, s, tc.wantReports[i])
					}
				}
				if tc.completeAt == 0 && tc.cancelAt == 0 && time.Since(start) != 30*time.Second {
					t.Errorf("timed out after %v, want 30s", time.Since(start))
				}
			})
		})
	}
}

// TestWaitCompletedAllocs: waiting for a Work that completes quickly
// costs no timer and no allocation.
func TestWaitCompletedAllocs(t *testing.T) {
	f := &fake{done: make(chan struct{})}
	close(f.done)
	w := comm.NewWork(f, 1)
	ctx := context.Background()
	if a := testing.AllocsPerRun(100, func() {
		if err := (comm.Watchdog{}).Wait(ctx, f, w, comm.Stall{Seq: 1, Kind: comm.KindBarrier}); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("%v allocations per Wait of a completed Work, want 0", a)
	}
}

func TestMissingRanks(t *testing.T) {
	f, g := &fake{done: make(chan struct{})}, &fake{done: make(chan struct{})}
	if m := comm.MissingRanks(f, comm.NewWork(f, 1)); len(m) != 1 || m[0] != 2 {
		t.Errorf("MissingRanks of its own Work = %v, want [2]", m)
	}
	if m := comm.MissingRanks(f, comm.NewWork(g, 1)); m != nil {
		t.Errorf("MissingRanks of another backend's Work = %v, want nil", m)
	}
	if m := comm.MissingRanks(f, comm.FailedWork(errors.New("x"))); m != nil {
		t.Errorf("MissingRanks of a failed Work = %v, want nil", m)
	}
	if m := comm.MissingRanks(struct{ comm.Communicator }{}, comm.NewWork(f, 1)); m != nil {
		t.Errorf("MissingRanks of a backend that is not a Progress = %v, want nil", m)
	}
}
