//go:build race

package invariants

// RaceEnabled reports whether the race detector is on.
const RaceEnabled = true
