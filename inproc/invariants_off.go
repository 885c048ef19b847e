//go:build !invariants

package inproc

// invariants enables the protocol's self-checks (go test -tags invariants).
// The checks build their messages only when they fail, so they allocate
// nothing on the normal path.
const invariants = false
