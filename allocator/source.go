package allocator

import "unsafe"

// Region is a contiguous range of memory obtained from a Source. Addr may be
// a device address that Go code must not dereference.
type Region struct {
	Addr unsafe.Pointer
	Size int
}

// Source maps and unmaps the slabs a Pool carves blocks from.
//
// Alloc returns a region of at least size bytes whose address is a multiple
// of Alignment; the pool only asks for multiples of the page size. Free
// releases a region Alloc returned, exactly once. Name identifies the
// source in errors and metrics. Host reports whether Go code may read and
// write the memory: a device source (cuMemAlloc, ncclMemAlloc) returns
// false, and then Block.Bytes and the other views panic while Block.Addr
// still works.
//
// The pool calls a Source with its own lock held, never concurrently.
type Source interface {
	Alloc(size int) (Region, error)
	Free(Region) error
	Name() string
	Host() bool
}
