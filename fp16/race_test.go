//go:build race

package fp16

// raceEnabled is set when the race detector is on: it slows the 2^32 walk
// down by an order of magnitude, so the walk then samples chunks.
const raceEnabled = true
