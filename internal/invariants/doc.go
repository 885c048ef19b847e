// Package invariants tells code which checks a build runs, as pebble's
// internal/invariants does: Enabled under the invariants build tag (make
// test turns it on), RaceEnabled under the race detector.
//
// Expensive self-checks go behind Enabled, which is a constant: in a
// build without the tag the compiler drops them, so the hot path pays
// nothing, while every test run checks them and panics loudly, through
// Violated, rather than corrupt quietly. Tests that count allocations or
// walk large spaces look at RaceEnabled, since the race detector
// allocates and slows everything down.
package invariants

import "fmt"

// Violated panics with a message naming the package and the broken
// invariant. Callers build nothing before they know the check failed, so
// a passing check allocates nothing.
func Violated(pkg, format string, args ...any) {
	panic(fmt.Sprintf("%s: invariant violated: %s", pkg, fmt.Sprintf(format, args...)))
}
