package tracetest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/ddpgo/ddpgo/trace"
)

// Rules select how strictly Validate checks a trace. The zero Rules are
// the strict ones, which every trace made by a trace.Writer used as
// documented passes.
type Rules struct {
	// Nesting allows a span to lie entirely within another span of its
	// lane (shared ends allowed), as call stacks do. Partial overlap is
	// always an error. Without Nesting, spans on one lane must not overlap
	// at all; touching ends are fine.
	Nesting bool
	// LooseFlows skips the check that each flow start and finish falls on
	// a span of its lane, without which viewers draw no arrow.
	LooseFlows bool
	// ZeroIDs allows events on pid 0 and on tid 0. Perfetto reserves
	// both for the kernel's idle task and may merge or misplace their
	// events, so the strict rules reject them: number ranks and lanes
	// from 1.
	ZeroIDs bool
	// MaxErrors bounds the problems reported; 0 means 20.
	MaxErrors int
}

// Summary describes a valid trace.
type Summary struct {
	Events int            // all events, metadata included
	Phases map[string]int // events per phase ("X", "i", "s", "f", "C", "M", ...)
	Pids   []int          // processes that have events, ascending
	Lanes  []Lane         // lanes that have events, by pid then tid
	Flows  int            // flow start/finish pairs matched
	// Start and End bound the events' times: the earliest timestamp and
	// the latest timestamp or span end.
	Start, End time.Duration
}

// Lane is one (pid, tid) lane of a Summary.
type Lane struct {
	Pid, Tid int
	Name     string // from thread_name metadata
	Spans    int    // complete events on the lane
	Events   int    // all non-metadata events on the lane
}

// Validate checks a trace with the strict Rules. The trace may be in
// object form ({"traceEvents": [...]}) or array form. Every problem found
// (up to Rules.MaxErrors) is reported, each wrapping trace.ErrInvalid and naming
// the event by its index in traceEvents, phase, name, lane and time.
func Validate(r io.Reader) (Summary, error) { return Rules{}.Validate(r) }

// Validate checks a trace read from r under the rules ru.
func (ru Rules) Validate(r io.Reader) (Summary, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Summary{}, fmt.Errorf("trace: read: %w", err)
	}
	raws, err := splitEvents(data)
	if err != nil {
		return Summary{}, err
	}
	v := validator{rules: ru, max: ru.MaxErrors}
	if v.max <= 0 {
		v.max = 20
	}
	v.init()
	for i, raw := range raws {
		v.event(i, raw)
	}
	v.finish()
	return v.sum, v.result()
}

// splitEvents returns the raw events of either trace form.
func splitEvents(data []byte) ([]json.RawMessage, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("%w: empty input", trace.ErrInvalid)
	}
	switch trimmed[0] {
	case '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(trimmed, &raws); err != nil {
			return nil, fmt.Errorf("%w: array form: %v", trace.ErrInvalid, err)
		}
		return raws, nil
	case '{':
		var obj struct {
			TraceEvents     *[]json.RawMessage `json:"traceEvents"`
			DisplayTimeUnit *string            `json:"displayTimeUnit"`
		}
		if err := json.Unmarshal(trimmed, &obj); err != nil {
			return nil, fmt.Errorf("%w: object form: %v", trace.ErrInvalid, err)
		}
		if obj.TraceEvents == nil {
			return nil, fmt.Errorf("%w: object form without \"traceEvents\"", trace.ErrInvalid)
		}
		if u := obj.DisplayTimeUnit; u != nil && *u != "ms" && *u != "ns" {
			return nil, fmt.Errorf("%w: displayTimeUnit %q is neither \"ms\" nor \"ns\"", trace.ErrInvalid, *u)
		}
		return *obj.TraceEvents, nil
	}
	return nil, fmt.Errorf("%w: input is neither a JSON object nor an array (starts with %q)", trace.ErrInvalid, trimmed[0])
}

type rawEvent struct {
	Name *string         `json:"name"`
	Cat  *string         `json:"cat"`
	Ph   *string         `json:"ph"`
	TS   *json.Number    `json:"ts"`
	Dur  *json.Number    `json:"dur"`
	Pid  *json.Number    `json:"pid"`
	Tid  *json.Number    `json:"tid"`
	ID   json.RawMessage `json:"id"`
	BP   *string         `json:"bp"`
	S    *string         `json:"s"`
	Args json.RawMessage `json:"args"`
}

type laneKey struct{ pid, tid int }

type span struct {
	start, end time.Duration
	idx        int
}

type flowKey struct{ cat, id string }

type flowEnd struct {
	idx      int
	ts       time.Duration
	lane     laneKey
	name     string
	enclosed bool // bp "e"
}

type flowPair struct {
	s, f       []flowEnd
	firstIndex int
}

type validator struct {
	rules Rules
	max   int
	errs  []error
	extra int

	sum       Summary
	desc      []string // per event, for messages
	spans     map[laneKey][]span
	laneUse   map[laneKey]int // first event index using the lane
	laneCount map[laneKey]*Lane
	pidUse    map[int]int
	procNamed map[int]bool
	laneNamed map[laneKey]string
	flows     map[flowKey]*flowPair
	haveTime  bool
}

func (v *validator) init() {
	v.sum.Phases = make(map[string]int)
	v.spans = make(map[laneKey][]span)
	v.laneUse = make(map[laneKey]int)
	v.laneCount = make(map[laneKey]*Lane)
	v.pidUse = make(map[int]int)
	v.procNamed = make(map[int]bool)
	v.laneNamed = make(map[laneKey]string)
	v.flows = make(map[flowKey]*flowPair)
}

func (v *validator) fail(format string, a ...any) {
	if len(v.errs) >= v.max {
		v.extra++
		return
	}
	v.errs = append(v.errs, fmt.Errorf("%w: "+format, append([]any{trace.ErrInvalid}, a...)...))
}

func (v *validator) result() error {
	if len(v.errs) == 0 {
		return nil
	}
	if v.extra > 0 {
		v.errs = append(v.errs, fmt.Errorf("%w: and %d more problems", trace.ErrInvalid, v.extra))
	}
	return errors.Join(v.errs...)
}

// describe names event i for error messages.
func describe(i int, e *rawEvent) string {
	var b []byte
	b = append(b, "event "...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, " ("...)
	if e.Ph != nil {
		b = append(b, *e.Ph...)
	} else {
		b = append(b, "no ph"...)
	}
	if e.Name != nil {
		b = append(b, ' ')
		b = strconv.AppendQuote(b, *e.Name)
	}
	if e.Pid != nil {
		b = append(b, " pid "...)
		b = append(b, e.Pid.String()...)
	}
	if e.Tid != nil {
		b = append(b, " tid "...)
		b = append(b, e.Tid.String()...)
	}
	if e.TS != nil {
		b = append(b, " ts "...)
		b = append(b, e.TS.String()...)
	}
	if len(e.ID) > 0 {
		b = append(b, " id "...)
		b = append(b, e.ID...)
	}
	b = append(b, ')')
	return string(b)
}

// looseDescribe names an event whose fields have the wrong JSON types,
// using whichever of ph and name are strings.
func looseDescribe(i int, raw json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return fmt.Sprintf("event %d (not an object)", i)
	}
	var e rawEvent
	var ph, name string
	if json.Unmarshal(m["ph"], &ph) == nil {
		e.Ph = &ph
	}
	if json.Unmarshal(m["name"], &name) == nil {
		e.Name = &name
	}
	return describe(i, &e)
}

func parseInt(n *json.Number) (int, bool) {
	i, err := strconv.ParseInt(n.String(), 10, 32)
	if err != nil {
		return 0, false
	}
	return int(i), true
}

// maxMicros keeps converted times far from Duration overflow.
const maxMicros = 1e12

func parseMicros(n *json.Number) (time.Duration, bool) {
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil || math.IsNaN(f) || math.Abs(f) > maxMicros {
		return 0, false
	}
	return time.Duration(math.Round(f * 1e3)), true
}

// argsObject returns the entries of an "args" object, or ok=false if raw
// is present but not an object.
func argsObject(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		return nil, true
	}
	if t[0] != '{' {
		return nil, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(t, &m); err != nil {
		return nil, false
	}
	return m, true
}

func isNumber(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || (t[0] != '-' && (t[0] < '0' || t[0] > '9')) {
		return false
	}
	var f float64
	return json.Unmarshal(t, &f) == nil
}

// flowID normalises an "id" (a number or a string) into a map key.
func flowID(raw json.RawMessage) (string, bool) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "", false
	}
	if t[0] == '"' {
		var s string
		if json.Unmarshal(t, &s) != nil {
			return "", false
		}
		return "s:" + s, true
	}
	if !isNumber(t) {
		return "", false
	}
	return "n:" + string(t), true
}

func (v *validator) event(i int, raw json.RawMessage) {
	v.sum.Events++
	var e rawEvent
	if err := json.Unmarshal(raw, &e); err != nil {
		d := looseDescribe(i, raw)
		v.desc = append(v.desc, d)
		v.fail("%s: %v", d, err)
		return
	}
	d := describe(i, &e)
	v.desc = append(v.desc, d)
	if e.Ph == nil || len(*e.Ph) != 1 {
		v.fail("%s: missing or malformed \"ph\"", d)
		return
	}
	ph := *e.Ph
	v.sum.Phases[ph]++

	var need struct{ name, ts, tid bool }
	need.ts = ph != "M"
	switch ph {
	case "X", "B", "i", "I", "s", "t", "f", "C", "M":
		need.name = true
	}
	switch ph {
	case "X", "B", "E", "s", "t", "f":
		need.tid = true
	case "i", "I":
		need.tid = e.S == nil || *e.S == "t"
	case "M":
		need.tid = e.Name != nil && (*e.Name == "thread_name" || *e.Name == "thread_sort_index")
	}

	if need.name && e.Name == nil {
		v.fail("%s: missing \"name\"", d)
	}
	if e.Pid == nil {
		v.fail("%s: missing \"pid\"", d)
		return
	}
	pid, ok := parseInt(e.Pid)
	if !ok {
		v.fail("%s: \"pid\" %s is not a 32-bit integer", d, e.Pid)
		return
	}
	var tid int
	if need.tid {
		if e.Tid == nil {
			v.fail("%s: missing \"tid\"", d)
			return
		}
		if tid, ok = parseInt(e.Tid); !ok {
			v.fail("%s: \"tid\" %s is not a 32-bit integer", d, e.Tid)
			return
		}
	}
	var ts time.Duration
	if need.ts {
		if e.TS == nil {
			v.fail("%s: missing \"ts\"", d)
			return
		}
		if ts, ok = parseMicros(e.TS); !ok {
			v.fail("%s: \"ts\" %s is not a number of microseconds within ±1e12", d, e.TS)
			return
		}
	}
	args, ok := argsObject(e.Args)
	if !ok {
		v.fail("%s: \"args\" is not an object", d)
		return
	}

	if ph == "M" {
		v.metadata(d, &e, pid, tid, args)
		return
	}
	if !v.rules.ZeroIDs && (pid == 0 || need.tid && tid == 0) {
		v.fail("%s: pid 0 and tid 0 are the idle task to Perfetto; number processes and lanes from 1", d)
	}
	end := ts
	lane := laneKey{pid, tid}
	switch ph {
	case "X":
		if e.Dur == nil {
			v.fail("%s: complete event without \"dur\"", d)
			return
		}
		dur, ok := parseMicros(e.Dur)
		if !ok {
			v.fail("%s: \"dur\" %s is not a number of microseconds within ±1e12", d, e.Dur)
			return
		}
		if dur < 0 {
			v.fail("%s: negative \"dur\" %s", d, e.Dur)
			return
		}
		end = ts + dur
		v.spans[lane] = append(v.spans[lane], span{start: ts, end: end, idx: i})
	case "i", "I":
		if e.S != nil && *e.S != "t" && *e.S != "p" && *e.S != "g" {
			v.fail("%s: instant scope %q is not \"g\", \"p\" or \"t\"", d, *e.S)
			return
		}
	case "s", "t", "f":
		id, ok := flowID(e.ID)
		if !ok {
			v.fail("%s: flow event without a numeric or string \"id\"", d)
			return
		}
		if e.BP != nil && *e.BP != "e" {
			v.fail("%s: binding point %q is not \"e\"", d, *e.BP)
			return
		}
		if ph != "t" {
			cat := ""
			if e.Cat != nil {
				cat = *e.Cat
			}
			k := flowKey{cat, id}
			p := v.flows[k]
			if p == nil {
				p = &flowPair{firstIndex: i}
				v.flows[k] = p
			}
			fe := flowEnd{idx: i, ts: ts, lane: lane, name: deref(e.Name), enclosed: e.BP != nil}
			if ph == "s" {
				p.s = append(p.s, fe)
			} else {
				p.f = append(p.f, fe)
			}
		}
	case "C":
		if len(args) == 0 {
			v.fail("%s: counter without values in \"args\"", d)
			return
		}
		for _, k := range sortedKeys(args) {
			if !isNumber(args[k]) {
				v.fail("%s: counter value %q is not a number: %s", d, k, args[k])
				return
			}
		}
	}
	v.time(ts, end)
	if _, seen := v.pidUse[pid]; !seen {
		v.pidUse[pid] = i
	}
	if need.tid {
		if _, seen := v.laneUse[lane]; !seen {
			v.laneUse[lane] = i
			v.laneCount[lane] = &Lane{Pid: pid, Tid: tid}
		}
		l := v.laneCount[lane]
		l.Events++
		if ph == "X" {
			l.Spans++
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (v *validator) time(start, end time.Duration) {
	if !v.haveTime {
		v.sum.Start, v.sum.End, v.haveTime = start, end, true
		return
	}
	v.sum.Start = min(v.sum.Start, start)
	v.sum.End = max(v.sum.End, end)
}

func (v *validator) metadata(d string, e *rawEvent, pid, tid int, args map[string]json.RawMessage) {
	switch deref(e.Name) {
	case "process_name", "thread_name":
		var name string
		if raw, ok := args["name"]; !ok || json.Unmarshal(raw, &name) != nil {
			v.fail("%s: metadata without a string \"args.name\"", d)
			return
		}
		if *e.Name == "process_name" {
			v.procNamed[pid] = true
		} else {
			v.laneNamed[laneKey{pid, tid}] = name
		}
	case "process_sort_index", "thread_sort_index":
		if raw, ok := args["sort_index"]; !ok || !isNumber(raw) {
			v.fail("%s: metadata without a numeric \"args.sort_index\"", d)
		}
	}
}

func (v *validator) finish() {
	lanes := make([]laneKey, 0, len(v.laneUse))
	for k := range v.laneUse {
		lanes = append(lanes, k)
	}
	slices.SortFunc(lanes, func(a, b laneKey) int {
		if c := cmp.Compare(a.pid, b.pid); c != 0 {
			return c
		}
		return cmp.Compare(a.tid, b.tid)
	})
	// Per-lane spans, sorted by start, enclosing spans first.
	maxEnds := make(map[laneKey][]time.Duration, len(v.spans))
	for _, k := range lanes {
		ss := v.spans[k]
		slices.SortFunc(ss, func(a, b span) int {
			if c := cmp.Compare(int64(a.start), int64(b.start)); c != 0 {
				return c
			}
			if c := cmp.Compare(int64(b.end), int64(a.end)); c != 0 {
				return c
			}
			return cmp.Compare(a.idx, b.idx)
		})
		v.overlaps(ss)
		me := make([]time.Duration, len(ss))
		for i, s := range ss {
			me[i] = s.end
			if i > 0 {
				me[i] = max(me[i], me[i-1])
			}
		}
		maxEnds[k] = me
	}
	v.checkFlows(maxEnds)

	pids := make([]int, 0, len(v.pidUse))
	for p := range v.pidUse {
		pids = append(pids, p)
	}
	slices.Sort(pids)
	v.sum.Pids = pids
	for _, p := range pids {
		if !v.procNamed[p] {
			v.fail("pid %d has no process_name metadata (first used by %s)", p, v.desc[v.pidUse[p]])
		}
	}
	for _, k := range lanes {
		name, ok := v.laneNamed[k]
		if !ok {
			v.fail("lane pid %d tid %d has no thread_name metadata (first used by %s)", k.pid, k.tid, v.desc[v.laneUse[k]])
		}
		l := v.laneCount[k]
		l.Name = name
		v.sum.Lanes = append(v.sum.Lanes, *l)
	}
}

// overlaps checks one lane's spans, sorted by start with enclosing spans
// first.
func (v *validator) overlaps(ss []span) {
	if !v.rules.Nesting {
		last := -1 // the span reaching furthest so far
		for i, s := range ss {
			if last >= 0 && s.start < ss[last].end {
				v.fail("%s overlaps %s on its lane (%v..%v against %v..%v)",
					v.desc[s.idx], v.desc[ss[last].idx], s.start, s.end, ss[last].start, ss[last].end)
			}
			if last < 0 || s.end > ss[last].end {
				last = i
			}
		}
		return
	}
	var stack []span
	for _, s := range ss {
		for len(stack) > 0 && stack[len(stack)-1].end <= s.start {
			stack = stack[:len(stack)-1]
		}
		if n := len(stack); n > 0 && s.end > stack[n-1].end {
			top := stack[n-1]
			v.fail("%s partially overlaps %s on its lane (%v..%v against %v..%v)",
				v.desc[s.idx], v.desc[top.idx], s.start, s.end, top.start, top.end)
			continue
		}
		stack = append(stack, s)
	}
}

func (v *validator) checkFlows(maxEnds map[laneKey][]time.Duration) {
	pairs := make([]*flowPair, 0, len(v.flows))
	for _, p := range v.flows {
		pairs = append(pairs, p)
	}
	slices.SortFunc(pairs, func(a, b *flowPair) int { return cmp.Compare(a.firstIndex, b.firstIndex) })
	for _, p := range pairs {
		switch {
		case len(p.s) == 0:
			v.fail("%s: flow finish without a flow start of the same cat and id", v.desc[p.f[0].idx])
			continue
		case len(p.f) == 0:
			v.fail("%s: dangling flow start: no flow finish of the same cat and id", v.desc[p.s[0].idx])
			continue
		case len(p.s) > 1:
			v.fail("%s: flow id reused: another flow start is %s", v.desc[p.s[1].idx], v.desc[p.s[0].idx])
			continue
		case len(p.f) > 1:
			v.fail("%s: flow id reused: another flow finish is %s", v.desc[p.f[1].idx], v.desc[p.f[0].idx])
			continue
		}
		s, f := p.s[0], p.f[0]
		if f.ts < s.ts {
			v.fail("%s: flow finishes before its start %s", v.desc[f.idx], v.desc[s.idx])
			continue
		}
		if s.name != f.name {
			v.fail("%s: flow finish named %q but its start %s is named %q (viewers will not join them)",
				v.desc[f.idx], f.name, v.desc[s.idx], s.name)
			continue
		}
		v.sum.Flows++
		if v.rules.LooseFlows {
			continue
		}
		spans := v.spans[s.lane]
		if !enclosed(spans, maxEnds[s.lane], s.ts) {
			v.fail("%s: flow start lies on no span of its lane; viewers will not draw the arrow", v.desc[s.idx])
		}
		if f.enclosed {
			if !enclosed(v.spans[f.lane], maxEnds[f.lane], f.ts) {
				v.fail("%s: flow finish (bp \"e\") lies on no span of its lane; viewers will not draw the arrow", v.desc[f.idx])
			}
		} else {
			if !anyStartsAfter(v.spans[f.lane], f.ts) {
				v.fail("%s: flow finish has no span starting at or after it on its lane; viewers will not draw the arrow", v.desc[f.idx])
			}
		}
	}
}

// enclosed reports whether some span (sorted by start; maxEnd its running
// maximum of ends) satisfies start <= ts < end.
func enclosed(ss []span, maxEnd []time.Duration, ts time.Duration) bool {
	k, _ := slices.BinarySearchFunc(ss, ts, func(s span, t time.Duration) int {
		if s.start <= t {
			return -1
		}
		return 1
	})
	// k is the first span starting after ts.
	return k > 0 && maxEnd[k-1] > ts
}

// anyStartsAfter reports whether a span (sorted by start) starts at or
// after ts: the slice a finish without "bp" binds to.
func anyStartsAfter(ss []span, ts time.Duration) bool {
	return len(ss) > 0 && ss[len(ss)-1].start >= ts
}
