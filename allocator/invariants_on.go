//go:build invariants

package allocator

// invariants is true under the invariants build tag: misuse panics, freed
// host memory is poisoned and checked, and the free lists and slab layouts
// are verified after every operation.
const invariants = true
