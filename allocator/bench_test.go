package allocator

import (
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

var benchSizes = []struct {
	name string
	n    int
}{
	{"4KiB", 4 * kib},
	{"1MiB", 1 * mib},
	{"25MiB", 25 * mib},
}

// BenchmarkGetPut measures a Get/Put pair served from a warm pool.
func BenchmarkGetPut(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			p, err := New(Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			blk, _ := p.Get(s.n)
			p.Put(blk)
			b.ReportAllocs()
			for b.Loop() {
				blk, err := p.Get(s.n)
				if err != nil {
					b.Fatal(err)
				}
				p.Put(blk)
			}
		})
	}
}

// BenchmarkMmap is the baseline the pool replaces: an anonymous mmap and
// munmap of the same size, touching nothing.
func BenchmarkMmap(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			for b.Loop() {
				ptr, err := unix.MmapPtr(-1, 0, nil, uintptr(s.n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
				if err != nil {
					b.Fatal(err)
				}
				if err := unix.MunmapPtr(ptr, uintptr(s.n)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMmapTouch is what a fresh buffer really costs before it can hold
// a gradient: mmap, one write per 4 KiB page (the page faults and the
// kernel's zeroing), munmap. A pool block is already faulted in.
func BenchmarkMmapTouch(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			for b.Loop() {
				ptr, err := unix.MmapPtr(-1, 0, nil, uintptr(s.n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
				if err != nil {
					b.Fatal(err)
				}
				mem := unsafe.Slice((*byte)(ptr), s.n)
				for i := 0; i < len(mem); i += 4096 {
					mem[i] = 1
				}
				if err := unix.MunmapPtr(ptr, uintptr(s.n)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGetPutParallel measures Get/Put pairs from every P at once, each
// goroutine holding a second block so that ranges are split and coalesced.
func BenchmarkGetPutParallel(b *testing.B) {
	for _, s := range benchSizes[:2] {
		b.Run(s.name, func(b *testing.B) {
			p, err := New(Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				hold, err := p.Get(s.n)
				if err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					blk, err := p.Get(s.n)
					if err != nil {
						b.Error(err)
						return
					}
					p.Put(blk)
				}
				p.Put(hold)
			})
		})
	}
}

// BenchmarkLockFloor is the floor under any thread-safe Get/Put pair on the
// machine: two uncontended lock/unlock pairs, the synchronisation a Get and
// a Put each need. BenchmarkGetPut minus this is the pool's bookkeeping.
func BenchmarkLockFloor(b *testing.B) {
	var mu sync.Mutex
	for b.Loop() {
		mu.Lock()
		mu.Unlock()
		mu.Lock()
		mu.Unlock()
	}
}
