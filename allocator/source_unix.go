//go:build unix

package allocator

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// HostSource returns the source of host memory: private anonymous mappings
// made with mmap and released with munmap. The memory is off the Go heap, so
// a block may be handed to C code that keeps it past the call. Pages are
// zero-filled by the kernel and backed lazily, on first touch.
func HostSource() Source { return hostSource{} }

type hostSource struct{}

func (hostSource) Alloc(size int) (Region, error) {
	if size <= 0 {
		return Region{}, fmt.Errorf("%w: host mmap of %d bytes", ErrInvalid, size)
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return Region{}, fmt.Errorf("allocator: host mmap of %d bytes: %w", size, err)
	}
	return Region{Addr: p, Size: size}, nil
}

func (hostSource) Free(r Region) error {
	if err := unix.MunmapPtr(r.Addr, uintptr(r.Size)); err != nil {
		return fmt.Errorf("allocator: host munmap of %d bytes at %p: %w", r.Size, r.Addr, err)
	}
	return nil
}

// Retire maps fresh private zero pages over r in one mmap (MAP_FIXED
// replaces the old mapping atomically, so no other mapping can take the
// addresses in between), without reserving swap for them.
func (hostSource) Retire(r Region) error {
	_, err := unix.MmapPtr(-1, 0, r.Addr, uintptr(r.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil {
		return fmt.Errorf("allocator: host mmap of zero pages over %d bytes at %p: %w", r.Size, r.Addr, err)
	}
	return nil
}

func (hostSource) Name() string { return "host" }
func (hostSource) Host() bool   { return true }
