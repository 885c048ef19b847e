package ddp

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/trace"
	"github.com/ddpgo/ddpgo/trace/tracetest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestTimelineGolden renders a fixed two-rank step (bucket 1 complete
// before bucket 0, overlapping collectives, a no-sync step and an unused
// parameter) and compares the trace byte for byte with
// testdata/timeline.golden.json. Run with -update to rewrite it after an
// intended change, then review the diff (and open it in ui.perfetto.dev).
func TestTimelineGolden(t *testing.T) {
	s := overlappingStep()
	u := overlappingStep()
	u.Step, u.Start, u.Unused = s.Step+1, s.Start.Add(u.Wall*2), []int{3}
	u.ParamReady = append([]time.Duration(nil), s.ParamReady...)
	u.ParamReady[3] = u.Wall - time.Microsecond // marked by the Reducer in Wait
	local := StepStats{Step: s.Step + 2, Start: u.Start.Add(u.Wall * 2), Wall: s.Wall / 2, ParamReady: s.ParamReady}
	params := []Param{{Name: "W1"}, {Name: "b1"}, {Name: "W2"}, {Name: "b2"}}
	var out bytes.Buffer
	w := trace.New(&out, trace.Options{MaxSteps: -1, Start: s.Start, Metadata: map[string]string{"model": "golden"}})
	for _, st := range []*StepStats{&s, &u, &local} {
		for rank := range 2 {
			WriteTimeline(w, rank, st, params)
		}
		if err := w.EndStep(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tracetest.Validate(bytes.NewReader(out.Bytes())); err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	golden := filepath.Join("testdata", "timeline.golden.json")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestTimelineGolden -update to create it)", err)
	}
	if got := out.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("trace differs from %s at line %d (run with -update and review the diff):\n got: %s\nwant: %s", golden, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("trace differs from %s: %d lines, want %d (run with -update and review the diff)", golden, len(gl), len(wl))
	}
}
