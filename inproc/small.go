package inproc

import (
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// Small collectives. At arrival every rank copies its input into a staging
// buffer of its own, and once the last rank has opened the gate every rank
// computes its own output from the staged inputs, in rank order, so every
// rank gets the same bits. A rank's buffers are touched by that rank alone:
// no rank waits for another to finish reading, and a rank completes its
// own operation. That costs a copy of the input and parallel reads of the
// others' staged inputs, against one rank reading every input and writing
// every output while the others wait; on two cores it halves the memory
// traffic on the critical path and saves the cache-line hand-offs of
// completing another rank's operation.
//
// Each rank has two staging buffers, used by collectives of odd and even
// numbers: a rank arrives at collective k+2 only after completing k+1,
// which opened only once every rank had arrived at it, that is, had
// finished collective k and its reads of buffer k%2.

// stageBytes is the size of a staging buffer: a small collective's input.
const stageBytes = parallelBytes

// staged returns rank's staging buffer for collective k.
func (g *group) staged(rank int, k uint64) unsafe.Pointer { return g.comms[rank].stage[k%2] }

// stageIn copies this rank's input of small collective d (number k) into
// its staging buffer.
func (c *Comm) stageIn(d *desc, k uint64) {
	if c.stage[0] == nil {
		// Made on first use, so that large groups that never run small
		// collectives do not pay for them; 64-byte aligned for the SIMD
		// kernels.
		mem := make([]byte, 2*stageBytes+64)
		off := (64 - int(uintptr(unsafe.Pointer(&mem[0]))%64)) % 64
		c.stageMem = mem
		c.stage[0] = unsafe.Pointer(&mem[off])
		c.stage[1] = unsafe.Pointer(&mem[off+stageBytes])
	}
	n := d.count * d.dt.Size()
	switch d.kind {
	case comm.KindBarrier:
		return
	case comm.KindBroadcast:
		if d.root != c.rank {
			return
		}
	case comm.KindReduceScatter:
		n *= c.g.n
	}
	if n > stageBytes { // checked always: the alternative is a write past the buffer
		violated("rank %d stages %d bytes of %s #%d", c.rank, n, d.kind, k)
	}
	memmove(c.stage[k%2], d.send, n)
}

// ownPart computes this rank's output of small collective k (its call d,
// every rank's in s.d) from the staged inputs.
func (c *Comm) ownPart(s *collSlot, d *desc, k uint64) {
	g := c.g
	n := g.n
	sz := d.dt.Size()
	switch d.kind {
	case comm.KindAllReduce:
		for j := range n {
			c.srcs[j] = g.staged(j, k)
		}
		c.dsts[0] = d.recv
		c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, d.count)
	case comm.KindReduce:
		if d.root != c.rank {
			return
		}
		for j := range n {
			c.srcs[j] = g.staged(j, k)
		}
		c.dsts[0] = d.recv
		c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, d.count)
	case comm.KindBroadcast:
		if d.root != c.rank {
			memmove(d.recv, g.staged(d.root, k), d.count*sz)
		}
	case comm.KindAllGather:
		for j := range n {
			memmove(unsafe.Add(d.recv, j*d.count*sz), g.staged(j, k), d.count*sz)
		}
	case comm.KindReduceScatter:
		for j := range n {
			c.srcs[j] = unsafe.Add(g.staged(j, k), c.rank*d.count*sz)
		}
		c.dsts[0] = d.recv
		c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, d.count)
	}
}
