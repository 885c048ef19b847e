//go:build !race

package commtest

const raceEnabled = false
