package inproc

import (
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/invariants"
)

// Small collectives. When it publishes its call, every rank copies its
// input into its header (up to inlineBytes) or into a staging buffer of
// its own, and once every rank has published, every rank judges the calls
// and computes its own output from the staged inputs, in rank order, so
// every rank gets the same bits. A rank's buffers are touched by that rank
// alone: no rank waits for another to finish reading, nobody needs to
// open a gate, and a rank completes its own operation. That costs a copy
// of the input and parallel reads of the others' staged inputs, against
// one rank reading every input and writing every output while the others
// wait; on two cores it halves the memory traffic on the critical path
// and leaves about two cache-line hand-offs on it (the publication, and
// its read), which is what a collective needs at the least.
//
// Each rank has two headers and two staging buffers, used by collectives
// of odd and even numbers: a rank publishes collective k+2 only after
// completing k+1, which it did only once every rank had published k+1,
// that is, had completed k and its reads of the others' k%2 inputs.

// stageBytes is the size of a staging buffer: a small collective's input.
const stageBytes = parallelBytes

// input is where rank's input of small collective k (whose header h says
// how large it is) was staged.
func (g *group) input(rank int, k uint64, h *header) unsafe.Pointer {
	if stagedBytes(h, g.n) <= inlineBytes {
		return unsafe.Pointer(&h.data[0])
	}
	return g.comms[rank].stage[k%2]
}

// stagedBytes is the size of the input a rank stages for the call h says.
func stagedBytes(h *header, n int) int {
	b := int(h.count) * h.dt.Size()
	switch h.kind {
	case comm.KindBarrier:
		return 0
	case comm.KindReduceScatter:
		return b * n
	}
	return b
}

// stageIn copies this rank's input of small collective d into its header
// h or its staging buffer.
func (c *Comm) stageIn(d *desc, h *header) {
	if d.kind == comm.KindBarrier || d.kind == comm.KindBroadcast && d.root != c.rank {
		return
	}
	n := stagedBytes(h, c.g.n)
	if n > stageBytes { // checked always: the alternative is a write past the buffer
		invariants.Violated("inproc", "rank %d stages %d bytes of %s #%d", c.rank, n, d.kind, d.num)
	}
	dst := unsafe.Pointer(&h.data[0])
	if n > inlineBytes {
		if c.stage[0] == nil {
			// Made on first use, so that large groups that never run
			// small collectives of more than a few elements do not pay
			// for them; 64-byte aligned for the SIMD kernels.
			mem := make([]byte, 2*stageBytes+64)
			off := (64 - int(uintptr(unsafe.Pointer(&mem[0]))%64)) % 64
			c.stageMem = mem
			c.stage[0] = unsafe.Pointer(&mem[off])
			c.stage[1] = unsafe.Pointer(&mem[off+stageBytes])
		}
		dst = c.stage[d.num%2]
	}
	memmove(dst, d.send, n)
}

// ownPart computes this rank's output of small collective d, once every
// rank has published and the calls agree.
func (c *Comm) ownPart(d *desc) {
	g := c.g
	n := g.n
	k := d.num
	p := k % 2
	sz := d.dt.Size()
	in := func(j int) unsafe.Pointer { return g.input(j, k, g.comms[j].hdr[p]) }
	switch d.kind {
	case comm.KindAllReduce:
		for j := range n {
			c.srcs[j] = in(j)
		}
		c.dsts[0] = d.recv
		c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, d.count)
	case comm.KindReduce:
		if d.root != c.rank {
			return
		}
		for j := range n {
			c.srcs[j] = in(j)
		}
		c.dsts[0] = d.recv
		c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, d.count)
	case comm.KindBroadcast:
		if d.root != c.rank {
			memmove(d.recv, in(d.root), d.count*sz)
		}
	case comm.KindAllGather:
		for j := range n {
			memmove(unsafe.Add(d.recv, j*d.count*sz), in(j), d.count*sz)
		}
	case comm.KindReduceScatter:
		for j := range n {
			c.srcs[j] = unsafe.Add(in(j), c.rank*d.count*sz)
		}
		c.dsts[0] = d.recv
		c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, d.count)
	}
}
