//go:build invariants

package bucket

// invariants turns on self-checks of every computed layout.
const invariants = true
