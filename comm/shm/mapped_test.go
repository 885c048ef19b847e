//go:build linux

package shm

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestMappedTwice runs the job with each rank on its own mapping of one
// file, at its own address, as processes of one host map a segment: the
// segment holds no address of its own.
func TestMappedTwice(t *testing.T) {
	const n = 3
	l := Layout{Ranks: n, Stage: simStage}
	fd, err := unix.MemfdCreate("ddpgo-shm-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(l.Size())); err != nil {
		t.Fatal(err)
	}
	segs := make([]*Segment, n)
	for r := range n {
		mem, err := unix.Mmap(fd, 0, l.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)
		if segs[r], err = Over(unsafe.Pointer(&mem[0]), len(mem), l); err != nil {
			t.Fatal(err)
		}
	}
	if segs[0].base == segs[1].base {
		t.Fatal("two mappings at one address")
	}
	for _, sched := range [][]byte{nil, {0, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2}} {
		s := newSimOn(t, func(r int) *Segment { return segs[r] }, n, simJob(n))
		s.run(sched)
		s.check()
		// The next job starts over on a zeroed segment (every mapping
		// sees the clearing through the first).
		clear(unsafe.Slice((*byte)(segs[0].base), l.Size()))
	}
	if _, err := Over(unsafe.Add(segs[0].base, 64), l.Size(), l); err == nil {
		t.Error("Over accepted memory that is not page-aligned")
	}
	if _, err := Over(segs[0].base, l.Size()-1, l); err == nil {
		t.Error("Over accepted memory smaller than the layout")
	}
}
