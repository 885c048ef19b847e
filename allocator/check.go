package allocator

import (
	"fmt"
	"unsafe"
)

// poisonWord fills freed host memory under the invariants build tag. Read as
// float32 values it is a NaN (0x7fc0dead), so arithmetic on memory used
// after Put turns to NaN; read as uint16 it is a NaN and a large negative
// half. Get verifies a range is still poisoned, which catches writes after
// Put.
const poisonWord = 0x7fc0dead_7fc0dead

func poison(addr unsafe.Pointer, size int) {
	w := unsafe.Slice((*uint64)(addr), size/8)
	for i := range w {
		w[i] = poisonWord
	}
}

// poisoned returns "" if size bytes at addr hold the poison, or a message
// naming the first word that does not.
func poisoned(addr unsafe.Pointer, size int, op string, n int) string {
	w := unsafe.Slice((*uint64)(addr), size/8)
	for i, v := range w {
		if v != poisonWord {
			return fmt.Sprintf("allocator: invariant: %s(%d): free memory at %p+%d was written after Put (found %#x)", op, n, addr, i*8, v)
		}
	}
	return ""
}

// checkLocked verifies the pool's structure: every live slab is covered by
// its nodes in address order without gaps, no two free neighbours are left
// uncoalesced, every free range is on the right free list and nothing else
// is, and the counters agree with the nodes. It panics on the first
// violation. The caller holds p.mu.
func (p *Pool) checkLocked() {
	fail := func(format string, args ...any) {
		panic(fmt.Sprintf("allocator: invariant: "+format, args...))
	}
	var inUse, mapped int64
	var blocks, slabs, free int
	for s := range p.slabs {
		sl := &p.slabs[s]
		if !sl.live {
			continue
		}
		slabs++
		mapped += int64(sl.region.Size)
		off, used, prev := 0, 0, int32(none)
		prevFree := false
		for i := sl.first; i != none; i = p.nodes[i].next {
			nd := &p.nodes[i]
			switch {
			case int(nd.slab) != s:
				fail("slab %d: node %d says slab %d", s, i, nd.slab)
			case nd.off != off:
				fail("slab %d: node %d at offset %d, want %d", s, i, nd.off, off)
			case nd.prev != prev:
				fail("slab %d: node %d prev %d, want %d", s, i, nd.prev, prev)
			case nd.size <= 0 || nd.size%Alignment != 0:
				fail("slab %d: node %d size %d", s, i, nd.size)
			}
			switch nd.state {
			case stateUsed:
				used++
				inUse += int64(nd.req)
				if nd.req > nd.size || nd.req%Alignment != 0 {
					fail("slab %d: block %d of %d bytes in a range of %d", s, i, nd.req, nd.size)
				}
				prevFree = false
			case stateFree:
				if prevFree {
					fail("slab %d: free nodes %d and %d are neighbours but not coalesced", s, prev, i)
				}
				free++
				prevFree = true
			default:
				fail("slab %d: node %d in state %d", s, i, nd.state)
			}
			off += nd.size
			prev = i
		}
		if off != sl.region.Size {
			fail("slab %d: nodes cover %d bytes of %d", s, off, sl.region.Size)
		}
		if used != sl.used {
			fail("slab %d: %d blocks used, counter says %d", s, used, sl.used)
		}
		if sl.dedicated && p.nodes[sl.first].next != none {
			fail("dedicated slab %d is split", s)
		}
		blocks += used
	}
	listed := 0
	for b := range p.bins {
		if (p.bins[b] != none) != (p.binMask&(1<<b) != 0) {
			fail("bin %d: head %d, mask bit %v", b, p.bins[b], p.binMask&(1<<b) != 0)
		}
		listed += p.checkList(p.bins[b], false, b, fail)
	}
	listed += p.checkList(p.bigFree, true, 0, fail)
	if listed != free {
		fail("%d free ranges on lists, %d in slabs", listed, free)
	}
	if inUse != p.st.InUse || blocks != p.st.Blocks || mapped != p.st.Mapped || slabs != p.st.Slabs {
		fail("counters InUse %d Blocks %d Mapped %d Slabs %d; nodes say %d %d %d %d",
			p.st.InUse, p.st.Blocks, p.st.Mapped, p.st.Slabs, inUse, blocks, mapped, slabs)
	}
	if p.st.Mapped > p.limit {
		fail("mapped %d bytes over the limit %d", p.st.Mapped, p.limit)
	}
}

func (p *Pool) checkList(head int32, dedicated bool, bin int, fail func(string, ...any)) int {
	n, prev := 0, int32(none)
	for i := head; i != none; i = p.nodes[i].fnext {
		nd := &p.nodes[i]
		if nd.state != stateFree || nd.fprev != prev || p.slabs[nd.slab].dedicated != dedicated || !p.slabs[nd.slab].live {
			fail("free list (bin %d, dedicated %v): node %d state %d fprev %d want %d", bin, dedicated, i, nd.state, nd.fprev, prev)
		}
		if !dedicated && binOf(nd.size) != bin {
			fail("node %d of %d bytes in bin %d, want %d", i, nd.size, bin, binOf(nd.size))
		}
		n++
		prev = i
		if n > len(p.nodes) {
			fail("free list (bin %d) has a cycle", bin)
		}
	}
	return n
}
