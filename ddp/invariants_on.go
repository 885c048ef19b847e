//go:build invariants

package ddp

// invariants enables expensive consistency checks that panic on violation;
// tests turn it on with -tags invariants.
const invariants = true
