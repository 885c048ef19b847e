package trace

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// DefaultMaxSteps is the number of steps a Writer records when
// Options.MaxSteps is zero.
const DefaultMaxSteps = 3

// DefaultMaxEvents is the per-step event bound when Options.MaxEvents is
// zero.
const DefaultMaxEvents = 1 << 20

// ErrInvalid reports an event that breaks the trace format: a negative
// duration, a flow that ends before it starts, a non-numeric counter, or,
// from tracetest.Validate, any structural fault of a parsed trace.
var ErrInvalid = errors.New("trace: invalid")

// ErrClosed reports a call on a closed Writer.
var ErrClosed = errors.New("trace: writer closed")

// Options configure a Writer.
type Options struct {
	// MaxSteps bounds the number of steps written: 0 means
	// DefaultMaxSteps, a negative value means no bound.
	MaxSteps int
	// MaxEvents bounds the events buffered in one step (metadata not
	// counted): 0 means DefaultMaxEvents. Events past it are dropped and
	// counted.
	MaxEvents int
	// Start is the wall-clock origin used by Writer.At; zero means the
	// time New was called.
	Start time.Time
	// Metadata is written into the trace's "otherData" object, keys
	// sorted. The keys "trace_steps" and "trace_dropped_events" are set by
	// the Writer.
	Metadata map[string]string
}

// Point is one end of a flow arrow: a lane and a time on it.
type Point struct {
	Pid, Tid int
	TS       time.Duration
}

// Arg is one entry of an event's "args" object. Build it with Int, Float
// or String.
type Arg struct {
	Key  string
	kind argKind
	i    int64
	f    float64
	s    string
}

type argKind uint8

const (
	argInt argKind = iota
	argFloat
	argString
)

// Int returns an integer argument.
func Int(key string, v int64) Arg { return Arg{Key: key, kind: argInt, i: v} }

// Float returns a floating-point argument. NaN and infinities are written
// as strings, since JSON has no literal for them.
func Float(key string, v float64) Arg { return Arg{Key: key, kind: argFloat, f: v} }

// String returns a string argument.
func String(key, v string) Arg { return Arg{Key: key, kind: argString, s: v} }

func (a Arg) numeric() bool {
	return a.kind == argInt || (a.kind == argFloat && !math.IsNaN(a.f) && !math.IsInf(a.f, 0))
}

// Writer streams a trace to an io.Writer. Create it with New; finish it
// with Close.
type Writer struct {
	mu   sync.Mutex
	out  io.Writer
	opt  Options
	base time.Time

	events []event
	args   []Arg // arena: event.args indexes into it
	meta   []meta
	procs  map[int]string
	lanes  map[[2]int]string
	buf    []byte

	seq     uint64
	steps   int
	dropped int
	invalid int
	wrote   bool // header and at least the opening bracket written
	comma   bool // an event has been written
	closed  bool
	err     error // first invalid event
	werr    error // first write failure; later writes are skipped
}

type event struct {
	ph       byte
	pid, tid int
	ts, dur  time.Duration
	name     string
	cat      string
	id       uint64
	argOff   int32
	argN     int32
	seq      uint64
}

type meta struct {
	pid, tid int
	kind     uint8 // metaProcessName...; also the order within one lane
	name     string
	index    int
}

const (
	metaProcessName uint8 = iota
	metaProcessSort
	metaThreadName
	metaThreadSort
)

// New returns a Writer that writes to out. The output is a complete JSON
// object only after Close.
func New(out io.Writer, o Options) *Writer {
	if o.MaxSteps == 0 {
		o.MaxSteps = DefaultMaxSteps
	}
	if o.MaxEvents <= 0 {
		o.MaxEvents = DefaultMaxEvents
	}
	base := o.Start
	if base.IsZero() {
		base = time.Now()
	}
	return &Writer{
		out:   out,
		opt:   o,
		base:  base,
		procs: make(map[int]string),
		lanes: make(map[[2]int]string),
	}
}

// At returns t as a trace timestamp: the time since Options.Start.
func (w *Writer) At(t time.Time) time.Duration { return t.Sub(w.base) }

// Recording reports whether events are still being kept: false once
// MaxSteps steps have been written or the Writer is closed. Callers can
// skip building events when it is false.
func (w *Writer) Recording() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.recording()
}

func (w *Writer) recording() bool {
	return !w.closed && (w.opt.MaxSteps < 0 || w.steps < w.opt.MaxSteps)
}

// Steps returns the number of steps written so far.
func (w *Writer) Steps() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.steps
}

// Dropped returns the number of events not written: past the step bound,
// past the per-step event bound, or invalid.
func (w *Writer) Dropped() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped
}

// Process names process pid (a rank) and sorts it by pid on screen.
// Naming a process again with a different name renames it.
func (w *Writer) Process(pid int, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.recording() {
		return
	}
	if old, ok := w.procs[pid]; ok && old == name {
		return
	}
	w.procs[pid] = name
	w.meta = append(w.meta,
		meta{pid: pid, kind: metaProcessName, name: name},
		meta{pid: pid, kind: metaProcessSort, index: pid})
}

// Thread names lane tid of process pid and sorts it by tid within the
// process.
func (w *Writer) Thread(pid, tid int, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.recording() {
		return
	}
	k := [2]int{pid, tid}
	if old, ok := w.lanes[k]; ok && old == name {
		return
	}
	w.lanes[k] = name
	w.meta = append(w.meta,
		meta{pid: pid, tid: tid, kind: metaThreadName, name: name},
		meta{pid: pid, tid: tid, kind: metaThreadSort, index: tid})
}

// Span records a complete event ("X"): name on lane (pid, tid) from start
// for dur. Spans on one lane should not overlap; tracetest.Validate
// reports it if they do. A negative dur is invalid: the span is dropped and the error is
// returned by the next EndStep or Close.
func (w *Writer) Span(pid, tid int, name, cat string, start, dur time.Duration, args ...Arg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.admit() {
		return
	}
	if dur < 0 {
		w.reject(fmt.Errorf("%w: span %q on pid %d tid %d at %v has negative duration %v", ErrInvalid, name, pid, tid, start, dur))
		return
	}
	w.add(event{ph: 'X', pid: pid, tid: tid, ts: start, dur: dur, name: name, cat: cat}, args)
}

// Instant records an instant event ("i", thread scope) on lane (pid, tid)
// at ts, such as a gradient-ready mark.
func (w *Writer) Instant(pid, tid int, name, cat string, ts time.Duration, args ...Arg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.admit() {
		return
	}
	w.add(event{ph: 'i', pid: pid, tid: tid, ts: ts, name: name, cat: cat}, args)
}

// Flow records an arrow from one lane to another: a flow start ("s") at
// from and a flow finish ("f", bound to its enclosing slice) at to, both
// with the given id, name and cat. Viewers join the two by (cat, name, id),
// so id must be unique among the trace's flows of that cat and name. A
// viewer draws the arrow only if from.TS falls inside a span on from's
// lane and to.TS inside a span on to's lane (start <= ts < end): put the
// finish at the start of the destination span, and the start inside the
// span that produced it. A finish earlier than the start is invalid.
func (w *Writer) Flow(id uint64, name, cat string, from, to Point) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.admit() {
		return
	}
	if to.TS < from.TS {
		w.reject(fmt.Errorf("%w: flow %q id %d ends at %v before it starts at %v", ErrInvalid, name, id, to.TS, from.TS))
		return
	}
	if len(w.events)+2 > w.opt.MaxEvents {
		w.dropped++
		return
	}
	w.add(event{ph: 's', pid: from.Pid, tid: from.Tid, ts: from.TS, name: name, cat: cat, id: id}, nil)
	w.add(event{ph: 'f', pid: to.Pid, tid: to.Tid, ts: to.TS, name: name, cat: cat, id: id}, nil)
}

// Counter records counter name of process pid at ts: each value is one
// series (for example Int("bytes", n)). Values must be numeric and finite;
// otherwise the sample is dropped and the error returned by the next
// EndStep or Close.
func (w *Writer) Counter(pid int, name string, ts time.Duration, values ...Arg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.admit() {
		return
	}
	if len(values) == 0 {
		w.reject(fmt.Errorf("%w: counter %q on pid %d at %v has no values", ErrInvalid, name, pid, ts))
		return
	}
	for _, v := range values {
		if !v.numeric() {
			w.reject(fmt.Errorf("%w: counter %q on pid %d at %v: value %q is not a finite number", ErrInvalid, name, pid, ts, v.Key))
			return
		}
	}
	w.add(event{ph: 'C', pid: pid, ts: ts, name: name}, values)
}

// admit reports whether one more event may be buffered, counting it as
// dropped if not.
func (w *Writer) admit() bool {
	if !w.recording() || len(w.events) >= w.opt.MaxEvents {
		w.dropped++
		return false
	}
	return true
}

func (w *Writer) reject(err error) {
	w.dropped++
	w.invalid++
	if w.err == nil {
		w.err = err
	}
}

func (w *Writer) add(e event, args []Arg) {
	e.argOff = int32(len(w.args))
	e.argN = int32(len(args))
	w.args = append(w.args, args...)
	e.seq = w.seq
	w.seq++
	w.events = append(w.events, e)
}

// EndStep writes the buffered events as one step, sorted, and counts the
// step. After MaxSteps steps, further events are dropped. It returns the
// first write error or invalid event seen so far.
func (w *Writer) EndStep() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if !w.recording() {
		return w.failure()
	}
	w.flush()
	w.steps++
	return w.failure()
}

// Close writes any buffered events (as a last, partial step, if the step
// bound allows) and the end of the JSON object. It does not close the
// underlying io.Writer. Closing twice is a no-op.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	if w.recording() && (len(w.events) > 0 || len(w.meta) > 0) {
		w.flush()
		if len(w.events) > 0 {
			w.steps++
		}
	}
	w.closed = true
	w.buf = w.buf[:0]
	if !w.wrote {
		w.buf = append(w.buf, `{"traceEvents":[`...)
		w.wrote = true
	}
	w.buf = append(w.buf, "\n],\n"...)
	w.buf = append(w.buf, `"displayTimeUnit":"ns",`...)
	w.buf = append(w.buf, "\n"...)
	w.buf = w.appendOtherData(w.buf)
	w.buf = append(w.buf, "}\n"...)
	w.write()
	w.events, w.args, w.meta = nil, nil, nil
	return w.failure()
}

func (w *Writer) appendOtherData(b []byte) []byte {
	kv := make(map[string]string, len(w.opt.Metadata)+2)
	for k, v := range w.opt.Metadata {
		kv[k] = v
	}
	kv["trace_steps"] = fmt.Sprint(w.steps)
	kv["trace_dropped_events"] = fmt.Sprint(w.dropped)
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b = append(b, `"otherData":{`...)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, kv[k])
	}
	return append(b, '}')
}

// flush encodes pending metadata and events and writes them.
func (w *Writer) flush() {
	w.buf = w.buf[:0]
	if !w.wrote {
		w.buf = append(w.buf, `{"traceEvents":[`...)
		w.wrote = true
	}
	slices.SortFunc(w.meta, func(a, b meta) int {
		if c := cmpInt(a.pid, b.pid); c != 0 {
			return c
		}
		// Process metadata before lane metadata.
		ak, bk := a.kind >= metaThreadName, b.kind >= metaThreadName
		if ak != bk {
			if !ak {
				return -1
			}
			return 1
		}
		if c := cmpInt(a.tid, b.tid); c != 0 {
			return c
		}
		return cmpInt(int(a.kind), int(b.kind))
	})
	for _, m := range w.meta {
		w.sep()
		w.buf = appendMeta(w.buf, m)
	}
	slices.SortFunc(w.events, compareEvents)
	for i := range w.events {
		w.sep()
		e := &w.events[i]
		w.buf = appendEvent(w.buf, e, w.args[e.argOff:e.argOff+e.argN])
	}
	w.write()
	w.meta = w.meta[:0]
	w.events = w.events[:0]
	w.args = w.args[:0]
}

func (w *Writer) sep() {
	if w.comma {
		w.buf = append(w.buf, ",\n"...)
	} else {
		w.buf = append(w.buf, '\n')
		w.comma = true
	}
}

func (w *Writer) write() {
	if w.werr != nil {
		return // the output is already broken
	}
	if _, err := w.out.Write(w.buf); err != nil {
		w.werr = fmt.Errorf("trace: write: %w", err)
	}
}

// failure returns the error EndStep and Close report: a write failure
// first, then the first invalid event.
func (w *Writer) failure() error {
	if w.werr != nil {
		return w.werr
	}
	if w.err != nil && w.invalid > 1 {
		return fmt.Errorf("%w (and %d more invalid events)", w.err, w.invalid-1)
	}
	return w.err
}

// phaseOrder puts, at equal time and lane, a span before the marks and
// flow ends that bind to it.
func phaseOrder(ph byte) int {
	switch ph {
	case 'X':
		return 0
	case 'C':
		return 1
	case 'i':
		return 2
	case 's':
		return 3
	default: // 'f'
		return 4
	}
}

func compareEvents(a, b event) int {
	if c := cmpInt64(int64(a.ts), int64(b.ts)); c != 0 {
		return c
	}
	if c := cmpInt(a.pid, b.pid); c != 0 {
		return c
	}
	if c := cmpInt(a.tid, b.tid); c != 0 {
		return c
	}
	if c := cmpInt(phaseOrder(a.ph), phaseOrder(b.ph)); c != 0 {
		return c
	}
	if c := cmpInt64(int64(b.dur), int64(a.dur)); c != 0 { // enclosing span first
		return c
	}
	return cmpInt64(int64(a.seq), int64(b.seq))
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
