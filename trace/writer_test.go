package trace_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/trace"
	"github.com/ddpgo/ddpgo/trace/tracetest"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// TestGolden writes three steps of the example timeline under a two-step
// bound and compares the bytes with testdata/steps.json.
func TestGolden(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{
		MaxSteps: 2,
		Metadata: map[string]string{"world_size": "2", "note": "golden \"quoted\"\n"},
	})
	if err := writeExampleTrace(w, 3); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "steps.json")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestGolden -update to create it)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("output differs from %s (run with -update and review the diff):\n%s", golden, firstDiff(buf.String(), string(want)))
	}
	if !json.Valid(buf.Bytes()) {
		t.Fatal("golden output is not valid JSON")
	}
}

func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n got %s\nwant %s", i+1, gl, wl)
		}
	}
	return ""
}

// TestRoundTrip validates what the Writer wrote and checks the summary
// against what was recorded.
func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{MaxSteps: 2})
	if err := writeExampleTrace(w, 3); err != nil {
		t.Fatal(err)
	}
	sum, err := tracetest.Validate(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	// Per rank and step: 11 spans, 4 ready marks, 2 flows, 4 counter samples.
	want := map[string]int{"X": 2 * 2 * 11, "i": 2 * 2 * 4, "s": 2 * 2 * 2, "f": 2 * 2 * 2, "C": 2 * 2 * 4, "M": 2 * (2 + 2*5)}
	for ph, n := range want {
		if sum.Phases[ph] != n {
			t.Errorf("phase %s: %d events, want %d", ph, sum.Phases[ph], n)
		}
	}
	total := 0
	for _, n := range want {
		total += n
	}
	if sum.Events != total || len(sum.Phases) != len(want) {
		t.Errorf("events %d in phases %v, want %d in %v", sum.Events, sum.Phases, total, want)
	}
	if sum.Flows != 8 {
		t.Errorf("flows %d, want 8", sum.Flows)
	}
	if fmt.Sprint(sum.Pids) != "[1 2]" {
		t.Errorf("pids %v, want [1 2]", sum.Pids)
	}
	if len(sum.Lanes) != 10 {
		t.Fatalf("lanes %+v, want 10", sum.Lanes)
	}
	for i, l := range sum.Lanes {
		pid, tid := i/5+1, i%5+1
		if l.Pid != pid || l.Tid != tid || l.Name != laneNames[tid] {
			t.Errorf("lane %d = %+v, want pid %d tid %d %q", i, l, pid, tid, laneNames[tid])
		}
	}
	if l := sum.Lanes[0]; l.Spans != 6 || l.Events != 6+8+4 {
		t.Errorf("compute lane of rank 0 (pid 1): %+v, want 6 spans and 18 events", l)
	}
	if sum.Start != 0 || sum.End != 331500*time.Nanosecond {
		t.Errorf("time span %v..%v, want 0s..331.5µs", sum.Start, sum.End)
	}
	if w.Steps() != 2 || w.Recording() {
		t.Errorf("steps %d recording %v, want 2 and false", w.Steps(), w.Recording())
	}
	var obj struct {
		DisplayTimeUnit string            `json:"displayTimeUnit"`
		OtherData       map[string]string `json:"otherData"`
	}
	if err := json.Unmarshal(buf.Bytes(), &obj); err != nil {
		t.Fatal(err)
	}
	if obj.DisplayTimeUnit != "ns" || obj.OtherData["trace_steps"] != "2" {
		t.Errorf("displayTimeUnit %q otherData %v", obj.DisplayTimeUnit, obj.OtherData)
	}
}

func TestTimestamps(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0"},
		{1, "0.001"},
		{10, "0.01"},
		{999, "0.999"},
		{1000, "1"},
		{1500, "1.5"},
		{1234567, "1234.567"},
		{-1500, "-1.5"},
		{-1, "-0.001"},
		{time.Hour, "3600000000"},
		{math.MaxInt64, "9223372036854775.807"},
		{math.MinInt64, "-9223372036854775.808"},
	} {
		var buf bytes.Buffer
		w := trace.New(&buf, trace.Options{})
		w.Instant(1, 1, "x", "", tc.d)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		var obj struct {
			TraceEvents []struct {
				TS json.Number `json:"ts"`
			} `json:"traceEvents"`
		}
		if err := json.Unmarshal(buf.Bytes(), &obj); err != nil {
			t.Fatalf("%v: %v\n%s", tc.d, err, buf.Bytes())
		}
		if got := obj.TraceEvents[0].TS.String(); got != tc.want {
			t.Errorf("ts of %d ns = %s, want %s", int64(tc.d), got, tc.want)
		}
	}
}

func TestStrings(t *testing.T) {
	for _, s := range []string{
		"", "plain", `q"uote`, `back\slash`, "nl\n tab\t cr\r", "\x00\x01\x1f\x7f",
		"héllo wörld", "日本語", "\u2028\u2029", "bad \xff utf8 \xc3", "emoji 🚀",
	} {
		var buf bytes.Buffer
		w := trace.New(&buf, trace.Options{Metadata: map[string]string{s: s}})
		w.Process(1, s)
		w.Thread(1, 1, s)
		w.Span(1, 1, s, s, 0, 1, trace.String(s, s))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		var obj struct {
			TraceEvents []struct {
				Name string            `json:"name"`
				Args map[string]any    `json:"args"`
				Ph   string            `json:"ph"`
				Cat  string            `json:"cat"`
				X    map[string]string `json:"-"`
			} `json:"traceEvents"`
		}
		if err := json.Unmarshal(buf.Bytes(), &obj); err != nil {
			t.Fatalf("%q: %v\n%s", s, err, buf.Bytes())
		}
		want := strings.ToValidUTF8(s, "\uFFFD")
		last := obj.TraceEvents[len(obj.TraceEvents)-1]
		if last.Name != want || last.Cat != want || last.Args[want] != want {
			t.Errorf("%q came back as name %q cat %q args %v", s, last.Name, last.Cat, last.Args)
		}
		if _, err := tracetest.Validate(&buf); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
}

func TestArgs(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{})
	w.Span(1, 1, "s", "", 0, 1,
		trace.Int("i", -42), trace.Float("f", 0.25), trace.Float("big", 1e300),
		trace.Float("nan", math.NaN()), trace.Float("inf", math.Inf(-1)), trace.String("s", "v"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := `"args":{"i":-42,"f":0.25,"big":1e+300,"nan":"NaN","inf":"-Inf","s":"v"}`
	if !strings.Contains(buf.String(), want) {
		t.Errorf("output %s lacks %s", buf.String(), want)
	}
}

// TestInvalidInput checks that a bad event is dropped, counted and
// reported, and that the rest of the trace is still written and valid.
func TestInvalidInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  func(w *trace.Writer)
		want string
	}{
		{"negative duration", func(w *trace.Writer) { w.Span(1, 1, "neg", "", 10, -1) }, `span "neg" on pid 1 tid 1 at 10ns has negative duration -1ns`},
		{"backward flow", func(w *trace.Writer) {
			w.Flow(7, "back", "c", trace.Point{Pid: 1, Tid: 1, TS: 5}, trace.Point{Pid: 1, Tid: 1, TS: 4})
		}, `flow "back" id 7 ends at 4ns before it starts at 5ns`},
		{"NaN counter", func(w *trace.Writer) { w.Counter(1, "c", 1, trace.Float("v", math.NaN())) }, `counter "c" on pid 1 at 1ns: value "v" is not a finite number`},
		{"string counter", func(w *trace.Writer) { w.Counter(1, "c", 1, trace.String("v", "x")) }, `value "v" is not a finite number`},
		{"empty counter", func(w *trace.Writer) { w.Counter(1, "c", 1) }, `counter "c" on pid 1 at 1ns has no values`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := trace.New(&buf, trace.Options{})
			w.Process(1, "p")
			w.Thread(1, 1, "t")
			w.Span(1, 1, "good", "", 0, 5)
			tc.bad(w)
			err := w.EndStep()
			if !errors.Is(err, trace.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("EndStep = %v, want ErrInvalid containing %q", err, tc.want)
			}
			if w.Dropped() != 1 {
				t.Errorf("dropped %d, want 1", w.Dropped())
			}
			if err := w.Close(); !errors.Is(err, trace.ErrInvalid) {
				t.Errorf("Close = %v, want the same ErrInvalid", err)
			}
			sum, err := tracetest.Validate(&buf)
			if err != nil || sum.Phases["X"] != 1 {
				t.Errorf("Validate = %+v, %v; want the good span only", sum, err)
			}
		})
	}
}

func TestStepBound(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{MaxSteps: 1})
	w.Process(1, "p")
	w.Thread(1, 1, "t")
	w.Span(1, 1, "kept", "", 0, 1)
	if err := w.EndStep(); err != nil {
		t.Fatal(err)
	}
	if w.Recording() {
		t.Fatal("still recording after MaxSteps steps")
	}
	w.Span(1, 1, "dropped", "", 2, 1)
	w.Instant(1, 1, "dropped", "", 2)
	w.Counter(1, "dropped", 2, trace.Int("v", 1))
	w.Flow(1, "dropped", "", trace.Point{}, trace.Point{})
	w.Thread(1, 2, "late lane")
	if err := w.EndStep(); err != nil {
		t.Fatal(err)
	}
	if w.Steps() != 1 || w.Dropped() != 4 {
		t.Errorf("steps %d dropped %d, want 1 and 4", w.Steps(), w.Dropped())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := w.EndStep(); !errors.Is(err, trace.ErrClosed) {
		t.Errorf("EndStep after Close = %v, want ErrClosed", err)
	}
	if strings.Contains(buf.String(), "dropped\"") || strings.Contains(buf.String(), "late lane") {
		t.Errorf("events past the bound were written:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), `"trace_dropped_events":"4"`) {
		t.Errorf("otherData does not report the drops:\n%s", buf.String())
	}
	if _, err := tracetest.Validate(&buf); err != nil {
		t.Fatal(err)
	}
}

func TestUnboundedSteps(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{MaxSteps: -1})
	if err := writeExampleTrace(w, 10); err != nil {
		t.Fatal(err)
	}
	if w.Steps() != 10 || w.Dropped() != 0 {
		t.Errorf("steps %d dropped %d, want 10 and 0", w.Steps(), w.Dropped())
	}
}

func TestMaxEvents(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{MaxEvents: 3})
	w.Process(1, "p")
	w.Thread(1, 1, "t")
	w.Thread(1, 2, "u")
	w.Span(1, 1, "a", "", 0, 1)
	w.Span(1, 2, "b", "", 0, 2)
	w.Flow(1, "f", "", trace.Point{Pid: 1, Tid: 1, TS: 0}, trace.Point{Pid: 1, Tid: 2, TS: 0}) // needs two slots: dropped whole
	w.Span(1, 1, "c", "", 1, 1)
	w.Span(1, 1, "d", "", 2, 1)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Dropped() != 2 {
		t.Errorf("dropped %d, want 2", w.Dropped())
	}
	sum, err := tracetest.Validate(&buf)
	if err != nil || sum.Phases["X"] != 3 || sum.Flows != 0 {
		t.Errorf("Validate = %+v, %v; want 3 spans and no flow", sum, err)
	}
}

// TestEmpty checks that a Writer closed at once still makes a valid trace.
func TestEmpty(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sum, err := tracetest.Validate(&buf)
	if err != nil || sum.Events != 0 {
		t.Errorf("Validate = %+v, %v", sum, err)
	}
	if w.Steps() != 0 {
		t.Errorf("steps %d, want 0", w.Steps())
	}
}

func TestAt(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := trace.New(io.Discard, trace.Options{Start: start})
	if got := w.At(start.Add(1500 * time.Nanosecond)); got != 1500*time.Nanosecond {
		t.Errorf("At = %v, want 1.5µs", got)
	}
}

type failWriter struct{ n int }

var errDisk = errors.New("disk full")

func (f *failWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errDisk
}

func TestWriteError(t *testing.T) {
	fw := &failWriter{}
	w := trace.New(fw, trace.Options{})
	w.Span(1, 1, "a", "", 0, 1)
	if err := w.EndStep(); !errors.Is(err, errDisk) {
		t.Errorf("EndStep = %v, want %v", err, errDisk)
	}
	w.Span(1, 1, "b", "", 1, 1)
	if err := w.Close(); !errors.Is(err, errDisk) {
		t.Errorf("Close = %v, want %v", err, errDisk)
	}
	if fw.n != 1 {
		t.Errorf("%d writes after a failure, want 1 (no writes after the first failure)", fw.n)
	}
}

// TestConcurrent records from several goroutines, one lane each.
func TestConcurrent(t *testing.T) {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{MaxSteps: -1})
	const lanes, spans = 4, 200
	var wg sync.WaitGroup
	for g := range lanes {
		w.Thread(1, g+1, fmt.Sprintf("worker %d", g))
		wg.Go(func() {
			for i := range spans {
				w.Span(1, g+1, "work", "", time.Duration(i)*10, 5, trace.Int("i", int64(i)))
				if i%50 == 49 && g == 0 {
					if err := w.EndStep(); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	w.Process(1, "proc")
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sum, err := tracetest.Validate(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Phases["X"] != lanes*spans {
		t.Errorf("%d spans, want %d", sum.Phases["X"], lanes*spans)
	}
}

// TestNoAllocs checks that recording and writing a warm step allocates
// nothing.
func TestNoAllocs(t *testing.T) {
	w := trace.New(io.Discard, trace.Options{MaxSteps: -1})
	w.Process(1, "p")
	w.Thread(1, 1, "t")
	step := func() {
		for i := range 16 {
			ts := time.Duration(i) * time.Microsecond
			w.Span(1, 1, "span", "cat", ts, 500, trace.Int("bucket", int64(i)), trace.Float("x", 0.5))
			w.Instant(1, 1, "ready", "cat", ts, trace.Int("param", int64(i)))
			w.Counter(1, "bytes in flight", ts, trace.Int("bytes", int64(i)))
			w.Flow(uint64(i), "launch", "cat", trace.Point{TS: ts}, trace.Point{TS: ts + 100})
		}
		if err := w.EndStep(); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if n := testing.AllocsPerRun(20, step); n != 0 {
		t.Errorf("%v allocations per step, want 0", n)
	}
}
