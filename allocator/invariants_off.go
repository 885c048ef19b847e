//go:build !invariants

package allocator

// invariants is false without the invariants build tag: misuse is reported
// as an error and no expensive checks run.
const invariants = false
