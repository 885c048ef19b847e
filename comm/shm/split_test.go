package shm

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestSplit checks that the parts of a direct collective cover every
// element exactly once, on cache-line boundaries.
func TestSplit(t *testing.T) {
	for _, sz := range []int{1, 2, 4, 8} {
		for _, parts := range []int{1, 2, 3, 4, 7} {
			for _, count := range []int{0, 1, 15, 16, 17, 1000, 4099, 1 << 20} {
				next := 0
				for p := range parts {
					lo, hi := Split(count, sz, p, parts)
					if lo != next || hi < lo {
						t.Fatalf("Split(%d, %d, %d, %d) = [%d, %d), want to start at %d", count, sz, p, parts, lo, hi, next)
					}
					if lo < count && (lo*sz)%64 != 0 {
						t.Fatalf("Split(%d, %d, %d, %d) starts at byte %d, not a cache line", count, sz, p, parts, lo*sz)
					}
					next = hi
				}
				if next != count {
					t.Fatalf("Split(%d, %d, *, %d) covers %d elements", count, sz, parts, next)
				}
			}
		}
	}
}

// TestMemmove checks the piecewise copy against copy for sizes around the
// piece size, with the destination before, after and overlapping the
// source either way.
func TestMemmove(t *testing.T) {
	for _, n := range []int{0, 1, 100, maxMove - 1, maxMove, maxMove + 1, 2*maxMove + 77} {
		for _, shift := range []int{-maxMove - 3, -5, 0, 5, maxMove + 3, 3 * maxMove} {
			mem := make([]byte, n+2*maxMove+4*maxMove)
			for i := range mem {
				mem[i] = byte(i*7 + i>>8)
			}
			want := append([]byte(nil), mem...)
			src := 2 * maxMove
			dst := src + shift
			copy(want[dst:dst+n], want[src:src+n])
			Move(unsafe.Pointer(&mem[dst]), unsafe.Pointer(&mem[src]), n)
			if !bytes.Equal(mem, want) {
				t.Fatalf("n=%d, dst-src=%d: differs from copy", n, shift)
			}
		}
	}
}
