package ddp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/trace"
	"github.com/ddpgo/ddpgo/trace/tracetest"
)

// timelineEvent is the part of a Chrome trace event the tests look at.
type timelineEvent struct {
	Name string           `json:"name"`
	Ph   string           `json:"ph"`
	Pid  int              `json:"pid"`
	Tid  int              `json:"tid"`
	TS   float64          `json:"ts"`
	Dur  float64          `json:"dur"`
	Args map[string]int64 `json:"args"`
}

// validTimeline checks out strictly with tracetest.Validate and returns its
// summary and events.
func validTimeline(t *testing.T, out []byte) (tracetest.Summary, []timelineEvent) {
	t.Helper()
	sum, err := tracetest.Validate(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	var doc struct {
		TraceEvents []json.RawMessage `json:"traceEvents"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	var evs []timelineEvent
	for _, raw := range doc.TraceEvents {
		var e timelineEvent
		if json.Unmarshal(raw, &e) == nil { // metadata events have string args
			evs = append(evs, e)
		}
	}
	return sum, evs
}

func laneNames(sum tracetest.Summary, pid int) []string {
	var names []string
	for _, l := range sum.Lanes {
		if l.Pid == pid {
			names = append(names, l.Name)
		}
	}
	return names
}

// checkInFlight checks each rank's bytes-in-flight counter: never
// negative, back to zero at the end, and reaching at least the largest
// bucket's wire bytes.
func checkInFlight(t *testing.T, evs []timelineEvent, wantMax map[int]int64) {
	t.Helper()
	last, peak := map[int]int64{}, map[int]int64{}
	for _, e := range evs {
		if e.Ph != "C" {
			continue
		}
		v := e.Args["bytes"]
		if v < 0 {
			t.Fatalf("pid %d: bytes in flight %d at %vµs", e.Pid, v, e.TS)
		}
		last[e.Pid], peak[e.Pid] = v, max(peak[e.Pid], v)
	}
	for pid, want := range wantMax {
		if last[pid] != 0 || peak[pid] < want {
			t.Errorf("pid %d: bytes in flight end at %d and peak at %d; want 0 and >= %d", pid, last[pid], peak[pid], want)
		}
	}
}

// TestTimelineRealRun records three steps of a real two-rank run (one per
// hook) and checks the trace strictly.
func TestTimelineRealRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		hook func() hooks.Hook
	}{
		{"allreduce", hooks.AllReduce},
		{"fp16", hooks.FP16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const ranks, steps = 2, 3
			runs := observedRun(t, ranks, steps, tc.hook)
			params := []Param{{Name: "w1"}, {Name: "b1"}, {Name: "w2"}, {Name: "b2"}}
			var out bytes.Buffer
			w := trace.New(&out, trace.Options{MaxSteps: -1, Start: runs[0][0].Start.Add(-time.Millisecond)})
			flows, wantMax := 0, map[int]int64{}
			for step := range steps {
				for rank := range ranks {
					s := &runs[rank][step]
					WriteTimeline(w, rank, s, params)
					flows += len(s.Buckets)
					for _, b := range s.Buckets {
						wantMax[TimelinePid(rank)] = max(wantMax[TimelinePid(rank)], b.WireBytes)
					}
				}
				if err := w.EndStep(); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			sum, evs := validTimeline(t, out.Bytes())
			if !slices.Equal(sum.Pids, []int{1, 2}) {
				t.Fatalf("pids %v, want [1 2]", sum.Pids)
			}
			if sum.Flows != flows {
				t.Errorf("%d arrows, want one per bucket and step: %d", sum.Flows, flows)
			}
			if got, want := sum.Phases["i"], ranks*steps*len(params); got != want {
				t.Errorf("%d ready marks, want %d", got, want)
			}
			for pid := 1; pid <= ranks; pid++ {
				names := laneNames(sum, pid)
				for _, want := range []string{"compute", "collective"} {
					if !slices.Contains(names, want) {
						t.Errorf("pid %d: lanes %q lack %q", pid, names, want)
					}
				}
				if tc.name == "fp16" && !slices.Contains(names, "compress") {
					t.Errorf("pid %d: fp16 lanes %q lack compress", pid, names)
				}
			}
			checkInFlight(t, evs, wantMax)
			// Each arrow leaves from a ready mark: its bucket's last one.
			marks := map[[2]float64]bool{}
			for _, e := range evs {
				if e.Ph == "i" {
					marks[[2]float64{float64(e.Pid), e.TS}] = true
				}
			}
			for _, e := range evs {
				if e.Ph == "s" && (e.Tid != LaneCompute || !marks[[2]float64{float64(e.Pid), e.TS}]) {
					t.Errorf("arrow %s starts at pid %d tid %d %vµs, not at a ready mark", e.Name, e.Pid, e.Tid, e.TS)
				}
			}
		})
	}
}

// overlappingStep is a synthetic step in which bucket 1 is complete before
// bucket 0, so their waits overlap, and the collectives of buckets 1 and 2
// overlap (as a backend with several streams would do).
func overlappingStep() StepStats {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	return StepStats{
		Step: 7, Sync: true, Start: time.Unix(100, 0), Wall: us(200),
		ParamReady: []time.Duration{us(50), us(10), us(20), -1},
		Unused:     []int{},
		Buckets: []BucketStats{
			{Index: 0, Params: 1, Bytes: 400, Ready: us(50), Launch: us(51),
				CompressStart: us(51), CompressEnd: us(52), CollectiveStart: us(52), CollectiveEnd: us(60), DecompressEnd: us(61), Done: us(61), WireBytes: 200},
			{Index: 1, Params: 2, Bytes: 800, Ready: us(20), Launch: us(61),
				CompressStart: us(61), CompressEnd: us(62), CollectiveStart: us(62), CollectiveEnd: us(90), DecompressEnd: us(91), Done: us(91), WireBytes: 400},
			{Index: 2, Params: 1, Bytes: 40, Ready: us(60), Launch: us(63),
				CompressStart: us(63), CompressEnd: us(64), CollectiveStart: us(64), CollectiveEnd: us(64), DecompressEnd: us(66), Done: us(66), WireBytes: 20},
		},
	}
}

func TestTimelineSplitsOverlappingLanes(t *testing.T) {
	s := overlappingStep()
	var out bytes.Buffer
	w := trace.New(&out, trace.Options{Start: s.Start.Add(-time.Second)})
	WriteTimeline(w, 0, &s, nil)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sum, evs := validTimeline(t, out.Bytes())
	names := laneNames(sum, 1)
	for _, want := range []string{"compute", "bucket wait", "bucket wait 2", "compress", "collective", "collective 2", "decompress"} {
		if !slices.Contains(names, want) {
			t.Errorf("lanes %q lack %q", names, want)
		}
	}
	if sum.Flows != 3 {
		t.Errorf("%d arrows, want 3", sum.Flows)
	}
	// Bucket 2's zero-length collective still gets a span for its arrow,
	// and while it runs buckets 1 and 2 are both in flight.
	checkInFlight(t, evs, map[int]int64{1: 420})
	var marks []string
	for _, e := range evs {
		if e.Ph == "i" {
			marks = append(marks, e.Name)
		}
	}
	if want := []string{"ready param 1", "ready param 2", "ready param 0"}; !slices.Equal(marks, want) {
		t.Errorf("ready marks %q, want %q (time order; param 3 never ready)", marks, want)
	}
}

func TestTimelineNoSyncAndUnused(t *testing.T) {
	s := StepStats{Step: 2, Start: time.Unix(5, 0), Wall: time.Millisecond,
		ParamReady: []time.Duration{time.Microsecond, 2 * time.Microsecond}}
	u := overlappingStep()
	u.Step, u.Start, u.Unused = 3, s.Start.Add(time.Second), []int{0}
	var out bytes.Buffer
	w := trace.New(&out, trace.Options{MaxSteps: 2, Start: s.Start})
	params := []Param{{Name: "w"}, {Name: "b"}}
	WriteTimeline(w, 1, &s, params)
	if err := w.EndStep(); err != nil {
		t.Fatal(err)
	}
	WriteTimeline(w, 1, &u, params)
	if err := w.EndStep(); err != nil {
		t.Fatal(err)
	}
	// Past MaxSteps: nothing is recorded, nothing is counted as dropped.
	WriteTimeline(w, 1, &u, params)
	if d := w.Dropped(); d != 0 {
		t.Errorf("%d events dropped", d)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sum, evs := validTimeline(t, out.Bytes())
	var names []string
	for _, e := range evs {
		if e.Ph == "X" && e.Tid == LaneCompute || e.Ph == "i" {
			names = append(names, e.Name)
		}
	}
	want := []string{"step 2 (no sync)", "ready w", "ready b", "step 3", "ready b", "ready param 2", "unused w"}
	if !slices.Equal(names, want) {
		t.Errorf("compute lane %q, want %q", names, want)
	}
	if sum.Flows != 3 {
		t.Errorf("%d arrows, want 3 (none for the no-sync step)", sum.Flows)
	}
}

func TestLaneSplitter(t *testing.T) {
	var l laneSplitter
	for _, tc := range []struct {
		start, end time.Duration
		want       int
	}{
		{0, 10, LaneWait},
		{5, 8, LaneWait + 1},
		{6, 9, LaneWait + 2},
		{8, 12, LaneWait + 1}, // touching ends share a lane
		{10, 11, LaneWait},
		{11, 20, LaneWait},
		{-5, -1, LaneWait}, // earlier than everything placed: the first lane is free then
		{7, 8, LaneWait + 3},
	} {
		if got := l.place(LaneWait, tc.start, tc.end); got != tc.want {
			t.Errorf("place(%v, %v) = %d, want %d", tc.start, tc.end, got, tc.want)
		}
	}
	if got := l.place(LaneCollective, 0, 1); got != LaneCollective {
		t.Errorf("another kind got lane %d, want %d", got, LaneCollective)
	}
}

// ExampleWriteTimeline renders one rank's step, in which bucket 1 was
// complete before bucket 0 and two collectives overlapped, and checks the
// trace: overlapping phases get lanes of their own.
func ExampleWriteTimeline() {
	s := overlappingStep() // in a program: s := r.Stats() after r.Wait(ctx)
	var out bytes.Buffer
	w := trace.New(&out, trace.Options{Start: s.Start})
	WriteTimeline(w, 0, &s, []Param{{Name: "W1"}, {Name: "b1"}, {Name: "W2"}, {Name: "b2"}})
	if err := w.EndStep(); err != nil { // after every rank's step
		fmt.Println(err)
	}
	if err := w.Close(); err != nil {
		fmt.Println(err)
	}
	sum, err := tracetest.Validate(&out)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, l := range sum.Lanes {
		fmt.Printf("%-13s %d spans, %d events\n", l.Name, l.Spans, l.Events)
	}
	fmt.Println("arrows:", sum.Flows)
	// Output:
	// compute       1 spans, 7 events
	// bucket wait   2 spans, 2 events
	// bucket wait 2 1 spans, 1 events
	// compress      3 spans, 3 events
	// collective    2 spans, 4 events
	// collective 2  1 spans, 2 events
	// decompress    3 spans, 3 events
	// arrows: 3
}

func BenchmarkWriteTimeline(b *testing.B) {
	s := overlappingStep()
	w := trace.New(io.Discard, trace.Options{MaxSteps: -1, Start: s.Start})
	defer w.Close()
	for b.Loop() {
		WriteTimeline(w, 0, &s, nil)
		if err := w.EndStep(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/step")
}

// observedRun trains nothing but runs real synced steps: ranks ranks over
// an inproc group, four parameters in three buckets, gradients marked last
// parameter first with a short pause between them so that buckets
// overlap with the remaining "backward". It returns each rank's statistics
// of every step (copies).
func observedRun(t testing.TB, ranks, steps int, hook func() hooks.Hook) [][]StepStats {
	t.Helper()
	cs, err := inproc.NewGroup(ranks)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	params := []Param{{Name: "w1", Shape: []int{64, 32}}, {Name: "b1", Shape: []int{64}}, {Name: "w2", Shape: []int{10, 64}}, {Name: "b2", Shape: []int{10}}}
	out := make([][]StepStats, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for rank, c := range cs {
		wg.Go(func() {
			errs[rank] = func() error {
				r, err := New(context.Background(), c, params, Options{Hook: hook(), BucketCap: 1 << 10, FirstBucketCap: 1 << 10})
				if err != nil {
					return err
				}
				defer r.Close()
				for step := range steps {
					if err := r.Begin(Sync); err != nil {
						return err
					}
					for i := len(params) - 1; i >= 0; i-- {
						g := mustGrad(r, i)
						for k := range g {
							g[k] = float32(rank+1) * float32(k%7) / float32(step+1)
						}
						if err := r.Ready(i); err != nil {
							return err
						}
						time.Sleep(50 * time.Microsecond)
					}
					if err := r.Wait(context.Background()); err != nil {
						return err
					}
					var s StepStats
					r.StatsInto(&s)
					out[rank] = append(out[rank], s)
				}
				return r.Close()
			}()
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	return out
}
