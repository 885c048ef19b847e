package hier

import (
	"fmt"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/reduce"
)

// execute runs one valid operation, phase after phase, and returns its
// error.
func (c *Comm) execute(d *op) error {
	switch d.call.Kind {
	case comm.KindAllReduce:
		return c.allReduce(d.send, d.recv, d.call.Op)
	case comm.KindBroadcast:
		return c.broadcast(d.send, d.call.Root)
	case comm.KindReduce:
		return c.reduce(d.send, d.recv, d.call.Op, d.call.Root)
	case comm.KindAllGather:
		return c.allGather(d.send, d.recv)
	case comm.KindReduceScatter:
		return c.reduceScatter(d.send, d.recv, d.call.Op)
	case comm.KindSend:
		lv, peer := c.route(d.call.Root)
		return c.do(lv, comm.KindSend, func(x comm.Communicator) comm.Work { return x.Send(d.send, peer) })
	case comm.KindRecv:
		lv, peer := c.route(d.call.Root)
		return c.do(lv, comm.KindRecv, func(x comm.Communicator) comm.Work { return x.Recv(d.send, peer) })
	case comm.KindBarrier:
		return c.barrier()
	}
	return fmt.Errorf("%w: hier: operation kind %s", comm.ErrInvalid, d.call.Kind)
}

// pending is an inner operation issued and not yet waited for.
type pending struct {
	lv   int
	what comm.Kind
	w    comm.Work
}

// start issues an operation on level lv, unless the Comm has failed, for
// settle to wait for. Operations started on one level before a settle run
// in the order they were started, as the level runs every rank's
// operations.
func (c *Comm) start(lv int, what comm.Kind, issue func(x comm.Communicator) comm.Work) {
	if c.halted() != nil {
		return
	}
	c.pend = append(c.pend, pending{lv, what, issue(c.lv[lv].c)})
}

// settle waits for every operation started since the last settle, all of
// them even after one has failed (their buffers are the levels' until
// then), and returns the first failure, or the Comm's if it failed
// meanwhile.
func (c *Comm) settle() error {
	var first error
	for _, p := range c.pend {
		if err := c.inner(p.lv, p.what, p.w); err != nil && first == nil {
			first = err
		}
	}
	c.pend = c.pend[:0]
	if first != nil {
		return first
	}
	return c.halted()
}

// do issues an operation on level lv, unless the Comm has failed, and
// waits for it.
func (c *Comm) do(lv int, what comm.Kind, issue func(x comm.Communicator) comm.Work) error {
	c.start(lv, what, issue)
	return c.settle()
}

// route returns the level that carries a message between this rank and
// peer, and peer's rank on it.
func (c *Comm) route(peer int) (lv, rank int) {
	p := c.t.places[peer]
	switch {
	case p.Host == c.host:
		return lvLocal, p.Local
	case p.Local == c.local:
		return lvCross, c.t.crossRank(p.Host, c.local)
	}
	return lvWorld, peer
}

// flat returns the level that spans the whole job, if one does (one host,
// or one rank per host), and the rank of global rank r on it; lv is -1
// otherwise. Operations then go to that level whole.
func (c *Comm) flat(r int) (lv, rank int) {
	switch {
	case c.t.hosts == 1:
		return lvLocal, c.t.places[r].Local
	case c.t.shards == 1 && len(c.t.places) == c.t.hosts:
		return lvCross, c.t.places[r].Host
	}
	return -1, 0
}

// innerOp is the reduction the levels do for op: Avg is summed and
// divided once at the end, since the levels' averages would weigh the
// hosts alike whatever their number of ranks.
func innerOp(o comm.Op) comm.Op {
	if o == comm.Avg {
		return comm.Sum
	}
	return o
}

func (c *Comm) allReduce(send, recv comm.Buffer, o comm.Op) error {
	n := send.Count
	if n == 0 {
		return nil
	}
	if lv, _ := c.flat(0); lv >= 0 {
		return c.do(lv, comm.KindAllReduce, func(x comm.Communicator) comm.Work { return x.AllReduce(send, recv, o) })
	}
	lo, big := innerOp(o), c.t.size[c.host] > 1
	per := c.chunkCount(n, send.DType)
	chunks := (n + per - 1) / per
	part := func(b comm.Buffer, i int) comm.Buffer { return b.Slice(i*per, min(per, n-i*per)) }
	src := send
	if big {
		c.collect(part(send, 0), part(recv, 0), lo)
		if err := c.settle(); err != nil {
			return err
		}
		src = recv
	}
	// Step i: chunk i crosses the hosts while the host collects chunk i+1
	// and spreads chunk i-1.
	for i := range chunks {
		s, r := part(src, i), part(recv, i)
		owner, off, k := false, 0, 0
		if c.local < c.t.shards {
			off, k = c.t.shard(r.Count, c.local)
			owner = k > 0
		}
		if owner {
			c.start(lvCross, comm.KindAllReduce, func(x comm.Communicator) comm.Work {
				return x.AllReduce(s.Slice(off, k), r.Slice(off, k), lo)
			})
		}
		if big && i+1 < chunks {
			c.collect(part(send, i+1), part(recv, i+1), lo)
		}
		if big && i > 0 {
			c.spread(part(recv, i-1))
		}
		if err := c.settle(); err != nil {
			return err
		}
		if owner && o == comm.Avg {
			divide(r.Slice(off, k), c.Size())
		}
	}
	if big {
		c.spread(part(recv, chunks-1))
		return c.settle()
	}
	return nil
}

// chunkCount returns how many elements of dt an all-reduce of n elements
// moves per chunk: all n without Config.ChunkBytes or up to twice it,
// ChunkBytes' worth otherwise.
func (c *Comm) chunkCount(n int, dt comm.DType) int {
	per := c.chunk / dt.Size()
	if c.chunk <= 0 || per < 1 || n <= 2*per {
		return n
	}
	return per
}

// collect starts the reduction of src over the host's ranks into the
// shards of work: shard j (see topo.shard) on local rank j. A host with S
// ranks does it with one reduce-scatter of the S·q elements the shards
// share and a reduce of the leftover to local rank S-1; a host with more
// ranks, one reduce per shard.
func (c *Comm) collect(src, work comm.Buffer, o comm.Op) {
	t, n := c.t, src.Count
	s := t.shards
	if t.size[c.host] == s {
		q := n / s
		if q > 0 {
			c.start(lvLocal, comm.KindReduceScatter, func(x comm.Communicator) comm.Work {
				return x.ReduceScatter(src.Slice(0, s*q), work.Slice(c.local*q, q), o)
			})
		}
		if tail := n - s*q; tail > 0 {
			c.start(lvLocal, comm.KindReduce, func(x comm.Communicator) comm.Work {
				return x.Reduce(src.Slice(s*q, tail), work.Slice(s*q, tail), o, s-1)
			})
		}
		return
	}
	for j := range s {
		if off, k := t.shard(n, j); k > 0 {
			c.start(lvLocal, comm.KindReduce, func(x comm.Communicator) comm.Work {
				return x.Reduce(src.Slice(off, k), work.Slice(off, k), o, j)
			})
		}
	}
}

// spread starts copying each shard of buf from its owner (local rank j
// for shard j) to every rank of the host: the inverse of collect, with an
// all-gather and a broadcast of the leftover, or a broadcast per shard.
func (c *Comm) spread(buf comm.Buffer) {
	t, n := c.t, buf.Count
	s := t.shards
	if t.size[c.host] == s {
		q := n / s
		if q > 0 {
			c.start(lvLocal, comm.KindAllGather, func(x comm.Communicator) comm.Work {
				return x.AllGather(buf.Slice(c.local*q, q), buf.Slice(0, s*q))
			})
		}
		if tail := n - s*q; tail > 0 {
			c.start(lvLocal, comm.KindBroadcast, func(x comm.Communicator) comm.Work {
				return x.Broadcast(buf.Slice(s*q, tail), s-1)
			})
		}
		return
	}
	for j := range s {
		if off, k := t.shard(n, j); k > 0 {
			c.start(lvLocal, comm.KindBroadcast, func(x comm.Communicator) comm.Work {
				return x.Broadcast(buf.Slice(off, k), j)
			})
		}
	}
}

func (c *Comm) broadcast(buf comm.Buffer, root int) error {
	n := buf.Count
	if n == 0 {
		return nil
	}
	if lv, r := c.flat(root); lv >= 0 {
		return c.do(lv, comm.KindBroadcast, func(x comm.Communicator) comm.Work { return x.Broadcast(buf, r) })
	}
	rp, big := c.t.places[root], c.t.size[c.host] > 1
	if c.host == rp.Host && big {
		if err := c.do(lvLocal, comm.KindBroadcast, func(x comm.Communicator) comm.Work { return x.Broadcast(buf, rp.Local) }); err != nil {
			return err
		}
	}
	if c.local < c.t.shards {
		off, k := c.t.shard(n, c.local)
		if k > 0 {
			if err := c.do(lvCross, comm.KindBroadcast, func(x comm.Communicator) comm.Work {
				return x.Broadcast(buf.Slice(off, k), c.t.crossRank(rp.Host, c.local))
			}); err != nil {
				return err
			}
		}
	}
	if c.host != rp.Host && big {
		c.spread(buf)
		return c.settle()
	}
	return nil
}

func (c *Comm) reduce(send, recv comm.Buffer, o comm.Op, root int) error {
	n := send.Count
	if n == 0 {
		return nil
	}
	if lv, r := c.flat(root); lv >= 0 {
		return c.do(lv, comm.KindReduce, func(x comm.Communicator) comm.Work { return x.Reduce(send, recv, o, r) })
	}
	work := recv
	if c.rank != root {
		b, blk, err := c.scratch(n, send.DType)
		if err != nil {
			return err
		}
		defer c.release(blk)
		work = b
	}
	rp, lo, big := c.t.places[root], innerOp(o), c.t.size[c.host] > 1
	src := send
	if big {
		c.collect(send, work, lo)
		if err := c.settle(); err != nil {
			return err
		}
		src = work
	}
	if c.local < c.t.shards {
		off, k := c.t.shard(n, c.local)
		if k > 0 {
			if err := c.do(lvCross, comm.KindReduce, func(x comm.Communicator) comm.Work {
				return x.Reduce(src.Slice(off, k), work.Slice(off, k), lo, c.t.crossRank(rp.Host, c.local))
			}); err != nil {
				return err
			}
		}
	}
	// On root's host, local rank j holds shard j of the result; root
	// takes the shards it does not hold.
	if c.host == rp.Host && big {
		for j := range c.t.shards {
			off, k := c.t.shard(n, j)
			if j == rp.Local || k == 0 {
				continue
			}
			if err := c.do(lvLocal, comm.KindBroadcast, func(x comm.Communicator) comm.Work {
				return x.Broadcast(work.Slice(off, k), j)
			}); err != nil {
				return err
			}
		}
	}
	if o == comm.Avg && c.rank == root {
		divide(recv, c.Size())
	}
	return nil
}

func (c *Comm) allGather(send, recv comm.Buffer) error {
	k := send.Count
	if k == 0 {
		return nil
	}
	t := c.t
	if lv, _ := c.flat(0); lv >= 0 && t.hostMajor {
		return c.do(lv, comm.KindAllGather, func(x comm.Communicator) comm.Work { return x.AllGather(send, recv) })
	}
	if t.even {
		return c.allGatherEven(send, recv)
	}
	// work holds the blocks host by host, each host's in local order:
	// recv itself when the numbering is host-major.
	work := recv
	if !t.hostMajor {
		b, blk, err := c.scratch(recv.Count, recv.DType)
		if err != nil {
			return err
		}
		defer c.release(blk)
		work = b
	}
	section := func(h int) comm.Buffer { return work.Slice(t.first[h]*k, t.size[h]*k) }
	own := section(c.host)
	if t.size[c.host] > 1 {
		if err := c.do(lvLocal, comm.KindAllGather, func(x comm.Communicator) comm.Work { return x.AllGather(send, own) }); err != nil {
			return err
		}
	} else if !comm.InPlace(send, own) {
		comm.HostKernels().Copy(own, send)
	}
	// Local ranks 0 (the cross group of local rank 0 has every host, in
	// host order) exchange the hosts' sections.
	if c.local == 0 {
		for h := range t.hosts {
			if err := c.do(lvCross, comm.KindBroadcast, func(x comm.Communicator) comm.Work { return x.Broadcast(section(h), h) }); err != nil {
				return err
			}
		}
	}
	if t.size[c.host] > 1 {
		lo, hi := t.first[c.host]*k, (t.first[c.host]+t.size[c.host])*k
		for _, b := range []comm.Buffer{work.Slice(0, lo), work.Slice(hi, work.Count-hi)} {
			if b.Count == 0 {
				continue
			}
			if err := c.do(lvLocal, comm.KindBroadcast, func(x comm.Communicator) comm.Work { return x.Broadcast(b, 0) }); err != nil {
				return err
			}
		}
	}
	if !t.hostMajor {
		for r, p := range t.places {
			comm.HostKernels().Copy(recv.Slice(r*k, k), work.Slice((t.first[p.Host]+p.Local)*k, k))
		}
	}
	return nil
}

func (c *Comm) reduceScatter(send, recv comm.Buffer, o comm.Op) error {
	k := recv.Count
	if k == 0 {
		return nil
	}
	if lv, _ := c.flat(0); lv >= 0 && c.t.hostMajor {
		return c.do(lv, comm.KindReduceScatter, func(x comm.Communicator) comm.Work { return x.ReduceScatter(send, recv, o) })
	}
	if c.t.even {
		return c.reduceScatterEven(send, recv, o)
	}
	work, blk, err := c.scratch(send.Count, send.DType)
	if err != nil {
		return err
	}
	defer c.release(blk)
	if err := c.allReduce(send, work, o); err != nil {
		return err
	}
	comm.HostKernels().Copy(recv, work.Slice(c.rank*k, k))
	return nil
}

// reduceScatterEven is ReduceScatter on hosts of L ranks each. Block
// (h, j), the block of local rank j of host h, is copied to place j·H+h
// of scratch memory, so that local rank j's share of the host's
// reduce-scatter is the blocks of local rank j of every host, in host
// order; local rank j then reduce-scatters that share in its cross group,
// whose rank h is host h, and keeps block h: its own. Each rank sends
// (H-1)·count elements across hosts, as with one rank per host.
func (c *Comm) reduceScatterEven(send, recv comm.Buffer, o comm.Op) error {
	t, k := c.t, recv.Count
	hosts, per := t.hosts, t.shards
	work, blk, err := c.scratch(send.Count, send.DType)
	if err != nil {
		return err
	}
	defer c.release(blk)
	for h := range hosts {
		for j := range per {
			comm.HostKernels().Copy(work.Slice((j*hosts+h)*k, k), send.Slice(t.global[t.first[h]+j]*k, k))
		}
	}
	share, lo := work.Slice(c.local*hosts*k, hosts*k), innerOp(o)
	if per > 1 {
		if err := c.do(lvLocal, comm.KindReduceScatter, func(x comm.Communicator) comm.Work { return x.ReduceScatter(work, share, lo) }); err != nil {
			return err
		}
	}
	if hosts > 1 {
		if err := c.do(lvCross, comm.KindReduceScatter, func(x comm.Communicator) comm.Work { return x.ReduceScatter(share, recv, lo) }); err != nil {
			return err
		}
	} else {
		comm.HostKernels().Copy(recv, share)
	}
	if o == comm.Avg {
		divide(recv, c.Size())
	}
	return nil
}

// allGatherEven is AllGather on hosts of L ranks each, the inverse of
// reduceScatterEven: local rank j gathers local rank j's blocks of every
// host in its cross group, into its share of scratch memory; the host
// gathers the shares; and each block is copied from place j·H+h to its
// rank's place in recv. Every local rank carries its part of the traffic
// between hosts.
func (c *Comm) allGatherEven(send, recv comm.Buffer) error {
	t, k := c.t, send.Count
	hosts, per := t.hosts, t.shards
	work, blk, err := c.scratch(recv.Count, recv.DType)
	if err != nil {
		return err
	}
	defer c.release(blk)
	share := work.Slice(c.local*hosts*k, hosts*k)
	if hosts > 1 {
		if err := c.do(lvCross, comm.KindAllGather, func(x comm.Communicator) comm.Work { return x.AllGather(send, share) }); err != nil {
			return err
		}
	} else {
		comm.HostKernels().Copy(share, send)
	}
	if per > 1 {
		if err := c.do(lvLocal, comm.KindAllGather, func(x comm.Communicator) comm.Work { return x.AllGather(share, work) }); err != nil {
			return err
		}
	}
	for h := range hosts {
		for j := range per {
			comm.HostKernels().Copy(recv.Slice(t.global[t.first[h]+j]*k, k), work.Slice((j*hosts+h)*k, k))
		}
	}
	return nil
}

func (c *Comm) barrier() error {
	if lv, _ := c.flat(0); lv >= 0 {
		return c.do(lv, comm.KindBarrier, func(x comm.Communicator) comm.Work { return x.Barrier() })
	}
	big := c.t.size[c.host] > 1
	barrier := func(x comm.Communicator) comm.Work { return x.Barrier() }
	if big {
		if err := c.do(lvLocal, comm.KindBarrier, barrier); err != nil {
			return err
		}
	}
	// Local rank 0's cross group has every host.
	if c.local == 0 {
		if err := c.do(lvCross, comm.KindBarrier, barrier); err != nil {
			return err
		}
	}
	if big {
		return c.do(lvLocal, comm.KindBarrier, barrier)
	}
	return nil
}

// scratch returns n elements of dt from the pool, and the block to
// release once no level can write them.
func (c *Comm) scratch(n int, dt comm.DType) (comm.Buffer, allocator.Block, error) {
	blk, err := c.pool.Get(n * dt.Size())
	if err != nil {
		return comm.Buffer{}, blk, fmt.Errorf("hier: rank %d: scratch memory for %d x %s: %w", c.rank, n, dt, err)
	}
	return comm.HostBuffer(blk.Addr(), n, dt), blk, nil
}

// release returns a scratch block. Every inner operation that used it has
// completed (the worker waits for each), so no level writes it again.
func (c *Comm) release(blk allocator.Block) {
	if err := c.pool.Put(blk); err != nil {
		panic(fmt.Sprintf("hier: rank %d: returning a scratch block: %v", c.rank, err))
	}
}

// divide divides every element of b by n in b's own arithmetic (integers
// truncate toward zero); a half-precision element is multiplied by 1/n in
// float32 and rounded once.
func divide(b comm.Buffer, n int) {
	switch b.DType {
	case comm.Float32:
		reduce.Div(b.AsFloat32(), n)
	case comm.Float64:
		reduce.Div(b.AsFloat64(), n)
	case comm.Int32:
		reduce.Div(b.AsInt32(), n)
	case comm.Int64:
		reduce.Div(b.AsInt64(), n)
	case comm.Uint8:
		reduce.Div(b.AsBytes(), n)
	case comm.Float16, comm.BFloat16:
		comm.HostKernels().Scale(b, 1/float32(n))
	}
}
