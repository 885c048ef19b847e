// Package tracetest checks timelines in the Chrome Trace Event Format, as
// package trace writes them, for tests (as net/http/httptest serves
// net/http's): programs that only write traces do not link the checker.
//
// Validate parses a trace and checks its structure: required fields per
// phase, non-negative durations, no overlapping spans on a lane, every
// flow start matched by one finish that is not earlier and that falls on
// a span (so viewers draw the arrow), numeric counters, and a name for
// every process and lane in use. Every problem wraps trace.ErrInvalid.
// Rules relaxes the strict checks for traces from other tools.
package tracetest
