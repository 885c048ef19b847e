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

// A Retirer is a Source that can retire a region instead of freeing it:
// its addresses stay mapped, to fresh zero-filled memory that takes no
// physical page until written, so that Go code still viewing it reads
// zeros and writes harmlessly instead of faulting. The address space stays
// reserved for the life of the process. HostSource is a Retirer; a pool
// retires rather than frees only where Options.Retire asks.
type Retirer interface {
	Retire(Region) error
}
