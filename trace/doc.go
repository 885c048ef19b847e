// Package trace writes and checks timelines in the Chrome Trace Event
// Format, the JSON that ui.perfetto.dev and chrome://tracing open.
//
// The model is the viewer's: a process (pid) holds named lanes (tid); a
// lane holds complete spans ("X"), instant marks ("i") and the ends of flow
// arrows ("s" at the source, "f" at the destination); a process holds
// counters ("C"). Metadata events ("M") name processes and lanes and fix
// their order on screen. For data-parallel training the natural mapping is
// one process per rank, one lane for compute (gradient-ready marks) and
// one lane per phase of a bucket's reduction (wait, compress, collective,
// decompress), an arrow from a bucket's last ready mark to its collective,
// and a bytes-in-flight counter per rank. Number processes and lanes from
// 1 (pid rank+1): Perfetto reserves pid 0 and tid 0 for the idle task.
//
// A viewer draws a flow arrow only if each end falls inside a span of its
// lane (start <= ts < end). The finish belongs at the start of the
// destination span; the start needs a span around it on its own lane, so
// give the compute lane a span that covers the ready marks, such as one
// for the whole step, from its beginning to the end of Wait.
//
// Timestamps are time.Duration values measured from the start of the
// trace (see Writer.At) and are written in microseconds with nanosecond
// precision, exactly, without floating-point rounding.
//
// A Writer streams events to an io.Writer step by step. Events of the
// current step are buffered; EndStep sorts them (by time, then process,
// lane, phase, longest span first, then call order) and writes them, so the
// output is deterministic and memory is bounded by one step. After
// Options.MaxSteps steps the Writer records nothing more. Close writes the
// closing bracket, so a closed Writer's output is always one valid JSON
// object. A Writer is safe for concurrent use.
//
// Package trace/tracetest checks a trace's structure (what a viewer needs
// to draw it), for tests; a program that writes traces does not link it.
package trace
