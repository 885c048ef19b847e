//go:build invariants

package inproc

const invariants = true
