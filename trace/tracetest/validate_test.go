package tracetest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/trace"
	"github.com/ddpgo/ddpgo/trace/tracetest"
)

// named is the metadata that names pid 1 and its lanes 1 and 2; events
// after it start at index 3.
var named = []string{
	`{"ph":"M","name":"process_name","pid":1,"args":{"name":"rank 0"}}`,
	`{"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"compute"}}`,
	`{"ph":"M","name":"thread_name","pid":1,"tid":2,"args":{"name":"collective"}}`,
}

func doc(events ...string) string {
	return `{"traceEvents":[` + strings.Join(events, ",\n") + `],"displayTimeUnit":"ns"}`
}

func withNames(events ...string) string {
	return doc(append(append([]string{}, named...), events...)...)
}

type validateCase struct {
	name  string
	in    string
	rules tracetest.Rules
	want  string // substring of the error; "" = valid
}

var validateCases = []validateCase{
	// Spans on one lane.
	{"touching spans", withNames(
		`{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10}`,
		`{"ph":"X","name":"b","pid":1,"tid":1,"ts":10,"dur":5}`), tracetest.Rules{}, ""},
	{"overlap", withNames(
		`{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10}`,
		`{"ph":"X","name":"b","pid":1,"tid":1,"ts":5,"dur":10}`), tracetest.Rules{},
		`event 4 (X "b" pid 1 tid 1 ts 5) overlaps event 3 (X "a" pid 1 tid 1 ts 0) on its lane`},
	{"overlap found past a short span", withNames(
		`{"ph":"X","name":"long","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"X","name":"short","pid":1,"tid":2,"ts":1,"dur":1}`,
		`{"ph":"X","name":"late","pid":1,"tid":1,"ts":50,"dur":1}`), tracetest.Rules{},
		`event 5 (X "late" pid 1 tid 1 ts 50) overlaps event 3 (X "long"`},
	{"nested is overlap when strict", withNames(
		`{"ph":"X","name":"outer","pid":1,"tid":1,"ts":0,"dur":10}`,
		`{"ph":"X","name":"inner","pid":1,"tid":1,"ts":2,"dur":3}`), tracetest.Rules{},
		`event 4 (X "inner" pid 1 tid 1 ts 2) overlaps event 3 (X "outer"`},
	{"nested allowed", withNames(
		`{"ph":"X","name":"inner","pid":1,"tid":1,"ts":2,"dur":3}`,
		`{"ph":"X","name":"outer","pid":1,"tid":1,"ts":0,"dur":10}`,
		`{"ph":"X","name":"same","pid":1,"tid":1,"ts":0,"dur":10}`,
		`{"ph":"X","name":"next","pid":1,"tid":1,"ts":10,"dur":1}`), tracetest.Rules{Nesting: true}, ""},
	{"partial overlap when nesting", withNames(
		`{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10}`,
		`{"ph":"X","name":"b","pid":1,"tid":1,"ts":5,"dur":10}`), tracetest.Rules{Nesting: true},
		`event 4 (X "b" pid 1 tid 1 ts 5) partially overlaps event 3 (X "a"`},
	{"missing dur", withNames(`{"ph":"X","name":"a","pid":1,"tid":1,"ts":0}`), tracetest.Rules{},
		`event 3 (X "a" pid 1 tid 1 ts 0): complete event without "dur"`},
	{"negative dur", withNames(`{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":-1}`), tracetest.Rules{},
		`event 3 (X "a" pid 1 tid 1 ts 0): negative "dur" -1`},
	{"missing ts", withNames(`{"ph":"i","name":"r","pid":1,"tid":1}`), tracetest.Rules{},
		`event 3 (i "r" pid 1 tid 1): missing "ts"`},
	{"missing name", withNames(`{"ph":"X","pid":1,"tid":1,"ts":0,"dur":1}`), tracetest.Rules{},
		`event 3 (X pid 1 tid 1 ts 0): missing "name"`},
	{"missing tid", withNames(`{"ph":"X","name":"a","pid":1,"ts":0,"dur":1}`), tracetest.Rules{},
		`event 3 (X "a" pid 1 ts 0): missing "tid"`},
	{"missing ph", withNames(`{"name":"a","pid":1,"tid":1,"ts":0}`), tracetest.Rules{},
		`event 3 (no ph "a" pid 1 tid 1 ts 0): missing or malformed "ph"`},
	{"fractional pid", withNames(`{"ph":"i","name":"a","pid":0.5,"tid":1,"ts":0}`), tracetest.Rules{},
		`"pid" 0.5 is not a 32-bit integer`},
	{"ts not a number", withNames(`{"ph":"i","name":"a","pid":1,"tid":1,"ts":true}`), tracetest.Rules{},
		`event 3 (i "a"): json: cannot unmarshal bool`},
	{"event not an object", withNames(`[1]`), tracetest.Rules{}, `event 3 (not an object): json: cannot unmarshal array`},
	{"args not an object", withNames(`{"ph":"i","name":"a","pid":1,"tid":1,"ts":0,"args":[1]}`), tracetest.Rules{},
		`event 3 (i "a" pid 1 tid 1 ts 0): "args" is not an object`},
	{"bad instant scope", withNames(`{"ph":"i","name":"a","pid":1,"tid":1,"ts":0,"s":"x"}`), tracetest.Rules{},
		`instant scope "x"`},
	{"global instant needs no lane", withNames(`{"ph":"i","name":"a","pid":1,"ts":0,"s":"g"}`), tracetest.Rules{}, ""},

	{"pid 0", doc(`{"ph":"M","name":"process_name","pid":0,"args":{"name":"p"}}`,
		`{"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"t"}}`,
		`{"ph":"i","name":"a","pid":0,"tid":1,"ts":0}`), tracetest.Rules{},
		`event 2 (i "a" pid 0 tid 1 ts 0): pid 0 and tid 0 are the idle task to Perfetto`},
	{"tid 0", doc(`{"ph":"M","name":"process_name","pid":1,"args":{"name":"p"}}`,
		`{"ph":"M","name":"thread_name","pid":1,"tid":0,"args":{"name":"t"}}`,
		`{"ph":"X","name":"a","pid":1,"tid":0,"ts":0,"dur":1}`), tracetest.Rules{},
		`event 2 (X "a" pid 1 tid 0 ts 0): pid 0 and tid 0`},
	{"zero ids allowed", doc(`{"ph":"M","name":"process_name","pid":0,"args":{"name":"p"}}`,
		`{"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"t"}}`,
		`{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":1}`), tracetest.Rules{ZeroIDs: true}, ""},

	// Naming.
	{"unnamed lane", withNames(`{"ph":"X","name":"a","pid":1,"tid":7,"ts":0,"dur":1}`), tracetest.Rules{},
		`lane pid 1 tid 7 has no thread_name metadata (first used by event 3 (X "a" pid 1 tid 7 ts 0))`},
	{"unnamed process", doc(`{"ph":"C","name":"bytes","pid":3,"ts":0,"args":{"v":1}}`), tracetest.Rules{},
		`pid 3 has no process_name metadata (first used by event 0 (C "bytes" pid 3 ts 0))`},
	{"name without args.name", doc(`{"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"nom":"x"}}`), tracetest.Rules{},
		`event 0 (M "thread_name" pid 1 tid 1): metadata without a string "args.name"`},
	{"sort index not numeric", withNames(`{"ph":"M","name":"thread_sort_index","pid":1,"tid":1,"args":{"sort_index":"1"}}`), tracetest.Rules{},
		`metadata without a numeric "args.sort_index"`},

	// Counters.
	{"counter", withNames(`{"ph":"C","name":"bytes in flight","pid":1,"ts":1,"args":{"bytes":4096,"f":-1.5e3}}`), tracetest.Rules{}, ""},
	{"counter string value", withNames(`{"ph":"C","name":"bytes in flight","pid":1,"ts":1,"args":{"bytes":"4096"}}`), tracetest.Rules{},
		`event 3 (C "bytes in flight" pid 1 ts 1): counter value "bytes" is not a number: "4096"`},
	{"counter without args", withNames(`{"ph":"C","name":"c","pid":1,"ts":1}`), tracetest.Rules{},
		`event 3 (C "c" pid 1 ts 1): counter without values in "args"`},

	// Flows.
	{"flow", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"X","name":"collective","pid":1,"tid":2,"ts":50,"dur":10}`,
		`{"ph":"s","name":"launch","cat":"ddp","pid":1,"tid":1,"ts":40,"id":"0x1"}`,
		`{"ph":"f","name":"launch","cat":"ddp","pid":1,"tid":2,"ts":50,"id":"0x1","bp":"e"}`,
		`{"ph":"s","name":"launch","cat":"ddp","pid":1,"tid":1,"ts":41,"id":1}`,
		`{"ph":"f","name":"launch","cat":"ddp","pid":1,"tid":2,"ts":45,"id":1}`), tracetest.Rules{}, ""},
	{"dangling flow", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"s","name":"launch","cat":"ddp","pid":1,"tid":1,"ts":40,"id":9}`), tracetest.Rules{},
		`event 4 (s "launch" pid 1 tid 1 ts 40 id 9): dangling flow start: no flow finish of the same cat and id`},
	{"finish in another cat", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"s","name":"launch","cat":"a","pid":1,"tid":1,"ts":40,"id":9}`,
		`{"ph":"f","name":"launch","cat":"b","pid":1,"tid":1,"ts":50,"id":9,"bp":"e"}`), tracetest.Rules{},
		`dangling flow start`},
	{"finish without start", withNames(
		`{"ph":"X","name":"c","pid":1,"tid":2,"ts":0,"dur":100}`,
		`{"ph":"f","name":"launch","pid":1,"tid":2,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{},
		`event 4 (f "launch" pid 1 tid 2 ts 40 id 9): flow finish without a flow start`},
	{"flow backwards", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"f","name":"launch","pid":1,"tid":1,"ts":30,"id":9,"bp":"e"}`,
		`{"ph":"s","name":"launch","pid":1,"tid":1,"ts":40,"id":9}`), tracetest.Rules{},
		`event 4 (f "launch" pid 1 tid 1 ts 30 id 9): flow finishes before its start event 5`},
	{"flow names differ", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"f","name":"b","pid":1,"tid":1,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{},
		`flow finish named "b" but its start event 4`},
	{"flow id reused", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":31,"id":9}`,
		`{"ph":"f","name":"a","pid":1,"tid":1,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{},
		`event 5 (s "a" pid 1 tid 1 ts 31 id 9): flow id reused`},
	{"flow without id", withNames(`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30}`), tracetest.Rules{},
		`flow event without a numeric or string "id"`},
	{"bad binding point", withNames(`{"ph":"f","name":"a","pid":1,"tid":1,"ts":30,"id":1,"bp":"x"}`), tracetest.Rules{},
		`binding point "x" is not "e"`},
	{"flow start off any span", withNames(
		`{"ph":"i","name":"ready","pid":1,"tid":1,"ts":30}`,
		`{"ph":"X","name":"collective","pid":1,"tid":2,"ts":40,"dur":10}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"f","name":"a","pid":1,"tid":2,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{},
		`event 5 (s "a" pid 1 tid 1 ts 30 id 9): flow start lies on no span of its lane`},
	{"loose flows", withNames(
		`{"ph":"i","name":"ready","pid":1,"tid":1,"ts":30}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"f","name":"a","pid":1,"tid":2,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{LooseFlows: true}, ""},
	{"flow start at a span's end", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":30}`,
		`{"ph":"X","name":"collective","pid":1,"tid":2,"ts":40,"dur":10}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"f","name":"a","pid":1,"tid":2,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{},
		`flow start lies on no span of its lane`},
	{"flow finish off any span", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"X","name":"collective","pid":1,"tid":2,"ts":0,"dur":39}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"f","name":"a","pid":1,"tid":2,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{},
		`event 6 (f "a" pid 1 tid 2 ts 40 id 9): flow finish (bp "e") lies on no span of its lane`},
	{"flow finish with no later span", withNames(
		`{"ph":"X","name":"backward","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"X","name":"collective","pid":1,"tid":2,"ts":0,"dur":50}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"f","name":"a","pid":1,"tid":2,"ts":40,"id":9}`), tracetest.Rules{},
		`flow finish has no span starting at or after it`},
	{"nested flow source", withNames(
		`{"ph":"X","name":"outer","pid":1,"tid":1,"ts":0,"dur":100}`,
		`{"ph":"X","name":"inner","pid":1,"tid":1,"ts":10,"dur":5}`,
		`{"ph":"X","name":"collective","pid":1,"tid":2,"ts":40,"dur":10}`,
		`{"ph":"s","name":"a","pid":1,"tid":1,"ts":30,"id":9}`,
		`{"ph":"f","name":"a","pid":1,"tid":2,"ts":40,"id":9,"bp":"e"}`), tracetest.Rules{Nesting: true}, ""},

	// Other phases and forms.
	{"begin and end", withNames(
		`{"ph":"B","name":"a","pid":1,"tid":1,"ts":0}`,
		`{"ph":"E","pid":1,"tid":1,"ts":5}`), tracetest.Rules{}, ""},
	{"array form", `[` + strings.Join(named, ",") + `,{"ph":"i","name":"a","pid":1,"tid":1,"ts":1}]`, tracetest.Rules{}, ""},
	{"empty object", `{"traceEvents":[]}`, tracetest.Rules{}, ""},
	{"no traceEvents", `{"events":[]}`, tracetest.Rules{}, `object form without "traceEvents"`},
	{"bad time unit", `{"traceEvents":[],"displayTimeUnit":"s"}`, tracetest.Rules{}, `displayTimeUnit "s"`},
	{"truncated", `{"traceEvents":[{"ph":"X"`, tracetest.Rules{}, `object form: unexpected end of JSON input`},
	{"not JSON", `hello`, tracetest.Rules{}, `neither a JSON object nor an array`},
	{"empty", ` `, tracetest.Rules{}, `empty input`},
	{"error cap", withNames(
		`{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":10}`,
		`{"ph":"X","name":"b","pid":1,"tid":1,"ts":1,"dur":10}`,
		`{"ph":"X","name":"c","pid":1,"tid":1,"ts":2,"dur":10}`,
		`{"ph":"X","name":"d","pid":1,"tid":1,"ts":3,"dur":10}`), tracetest.Rules{MaxErrors: 2},
		`and 1 more problems`},
}

func TestValidate(t *testing.T) {
	for _, tc := range validateCases {
		t.Run(tc.name, func(t *testing.T) {
			sum, err := tc.rules.Validate(strings.NewReader(tc.in))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if sum.Events == 0 && tc.name != "empty object" {
					t.Errorf("summary counts no events: %+v", sum)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !errors.Is(err, trace.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error\n  %v\ndoes not contain\n  %s", err, tc.want)
			}
		})
	}
}

// TestValidateReportsAll checks that independent faults are all reported.
func TestValidateReportsAll(t *testing.T) {
	in := doc(
		`{"ph":"X","name":"a","pid":1,"tid":1,"ts":0}`,
		`{"ph":"X","name":"b","pid":2,"tid":1,"ts":0,"dur":1}`,
		`{"ph":"s","name":"c","pid":2,"tid":1,"ts":0,"id":1}`)
	_, err := tracetest.Validate(strings.NewReader(in))
	for _, want := range []string{`without "dur"`, "dangling flow start", "pid 2 has no process_name", "lane pid 2 tid 1 has no thread_name"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

func TestValidateReadError(t *testing.T) {
	_, err := tracetest.Validate(errReader{})
	if !errors.Is(err, errDisk) {
		t.Errorf("Validate = %v, want the reader's error", err)
	}
}

var errDisk = errors.New("disk full")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errDisk }

func FuzzValidate(f *testing.F) {
	golden, err := os.ReadFile(filepath.Join("..", "testdata", "steps.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden)
	for _, tc := range validateCases {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, ru := range []tracetest.Rules{{}, {Nesting: true, LooseFlows: true}} {
			sum, err := ru.Validate(bytes.NewReader(data))
			if err != nil {
				if !errors.Is(err, trace.ErrInvalid) {
					t.Fatalf("error %v does not wrap ErrInvalid", err)
				}
				continue
			}
			if !json.Valid(data) {
				t.Fatalf("invalid JSON accepted: %q", data)
			}
			n := 0
			for _, c := range sum.Phases {
				n += c
			}
			if n != sum.Events || sum.Start > sum.End {
				t.Fatalf("inconsistent summary %+v", sum)
			}
		}
	})
}

// FuzzWriter checks that whatever names and times a caller passes, the
// Writer's output is valid JSON that Validate accepts.
func FuzzWriter(f *testing.F) {
	f.Add("rank 0", "compute", "ready \"p\"\n", int64(1500), int64(2500), int64(7))
	f.Add("\xff", "\x00", "", int64(-1), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, proc, lane, name string, ts, dur, v int64) {
		var buf bytes.Buffer
		w := trace.New(&buf, trace.Options{Metadata: map[string]string{name: lane}})
		w.Process(1, proc)
		w.Thread(1, 2, lane)
		w.Thread(1, 3, lane)
		w.Span(1, 2, name, lane, 0, 1<<40)
		w.Span(1, 3, name, proc, 0, 1<<40)
		ts = ts % (1 << 40)
		if ts < 0 {
			ts = -ts
		}
		w.Instant(1, 2, name, "", time.Duration(ts), trace.Int(name, v), trace.String(lane, proc))
		w.Counter(1, name, 0, trace.Int(name, v))
		w.Flow(uint64(v), name, lane, trace.Point{Pid: 1, Tid: 2, TS: time.Duration(ts)}, trace.Point{Pid: 1, Tid: 3, TS: time.Duration(ts)})
		if dur >= 0 {
			w.Span(1, 2, name, "", 1<<40, 0)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(buf.Bytes()) {
			t.Fatalf("invalid JSON:\n%s", buf.Bytes())
		}
		if _, err := tracetest.Validate(&buf); err != nil {
			t.Fatal(err)
		}
	})
}
