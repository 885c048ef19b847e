package nccl

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// ncclDataType_t and ncclRedOp_t values (src/nccl.h.in).
func ncclType(dt comm.DType) int {
	switch dt {
	case comm.Uint8:
		return 1 // ncclUint8
	case comm.Int32:
		return 2 // ncclInt32
	case comm.Int64:
		return 4 // ncclInt64
	case comm.Float16:
		return 6 // ncclFloat16
	case comm.Float32:
		return 7 // ncclFloat32
	case comm.Float64:
		return 8 // ncclFloat64
	case comm.BFloat16:
		return 9 // ncclBfloat16
	}
	return -1
}

func ncclOp(op comm.Op) int {
	switch op {
	case comm.Sum:
		return 0 // ncclSum
	case comm.Max:
		return 2 // ncclMax
	case comm.Min:
		return 3 // ncclMin
	case comm.Avg:
		return 4 // ncclAvg
	}
	return -1
}

// redop is op as NCCL gets it. Over one rank every op is the identity,
// and NCCL (2.19 on) carries ncclSum, ncclMax and ncclMin as a copy but
// ncclAvg as a one-rank pre-multiplying kernel, which on NCCL 2.28.9 got
// the last of 4099 float64 elements wrong (docs/lab/nccl-gpu.md): ask for the
// copy.
func (c *Comm) redop(op comm.Op) int {
	if c.size == 1 && ncclOp(op) >= 0 {
		return ncclOp(comm.Sum)
	}
	return ncclOp(op)
}

// check checks a call against the comm contract's argument rules (package
// comm/backend, which every backend enforces), with device memory valid on
// this rank's device only. It returns a failed Work for an invalid call.
func (c *Comm) check(call comm.Call, send, recv *comm.Buffer, desc comm.Buffer) (comm.Work, bool) {
	v := c.rules.Check(&call, send, recv)
	if v.OK() {
		return comm.Work{}, true
	}
	return comm.FailedWork(&comm.OpError{Rank: c.rank, Kind: call.Kind, Count: desc.Count, DType: desc.DType,
		Err: fmt.Errorf("nccl: %w", v.Err(call, c.size))}), false
}

// AllReduce reduces send over every rank into recv (ncclAllReduce).
func (c *Comm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	call := comm.Call{Kind: comm.KindAllReduce, Op: op, DType: send.DType, Count: send.Count}
	if w, ok := c.check(call, &send, &recv, send); !ok {
		return w
	}
	return c.issue(call.Kind, send, recv, copAllReduce, c.redop(op), 0, send.Count, true, true)
}

// Broadcast copies root's buf to every rank (ncclBroadcast, in place).
func (c *Comm) Broadcast(buf comm.Buffer, root int) comm.Work {
	call := comm.Call{Kind: comm.KindBroadcast, DType: buf.DType, Count: buf.Count, Root: root}
	if w, ok := c.check(call, &buf, &buf, buf); !ok {
		return w
	}
	return c.issue(call.Kind, buf, buf, copBroadcast, 0, root, buf.Count, c.rank == root, true)
}

// Reduce reduces send over every rank into recv on root (ncclReduce).
func (c *Comm) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	call := comm.Call{Kind: comm.KindReduce, Op: op, DType: send.DType, Count: send.Count, Root: root}
	if w, ok := c.check(call, &send, &recv, send); !ok {
		return w
	}
	if c.rank != root {
		// recv is ignored off the root; NCCL wants no buffer there.
		recv = comm.Buffer{DType: send.DType, Loc: send.Loc, Device: send.Device}
		return c.issue(call.Kind, send, recv, copReduce, c.redop(op), root, send.Count, true, false)
	}
	return c.issue(call.Kind, send, recv, copReduce, c.redop(op), root, send.Count, true, true)
}

// AllGather gathers every rank's send into recv, in rank order
// (ncclAllGather).
func (c *Comm) AllGather(send, recv comm.Buffer) comm.Work {
	call := comm.Call{Kind: comm.KindAllGather, DType: send.DType, Count: send.Count}
	if w, ok := c.check(call, &send, &recv, send); !ok {
		return w
	}
	return c.issue(call.Kind, send, recv, copAllGather, 0, 0, send.Count, true, true)
}

// ReduceScatter reduces send over every rank and leaves block Rank in recv
// (ncclReduceScatter).
func (c *Comm) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	call := comm.Call{Kind: comm.KindReduceScatter, Op: op, DType: recv.DType, Count: recv.Count}
	if w, ok := c.check(call, &send, &recv, recv); !ok {
		return w
	}
	return c.issue(call.Kind, send, recv, copReduceScatter, c.redop(op), 0, recv.Count, true, true)
}

// Send sends buf to peer (ncclSend).
func (c *Comm) Send(buf comm.Buffer, peer int) comm.Work {
	call := comm.Call{Kind: comm.KindSend, DType: buf.DType, Count: buf.Count, Root: peer}
	if w, ok := c.check(call, &buf, &buf, buf); !ok {
		return w
	}
	return c.issue(call.Kind, buf, comm.Buffer{DType: buf.DType}, copSend, 0, peer, buf.Count, true, false)
}

// Recv receives into buf from peer (ncclRecv).
func (c *Comm) Recv(buf comm.Buffer, peer int) comm.Work {
	call := comm.Call{Kind: comm.KindRecv, DType: buf.DType, Count: buf.Count, Root: peer}
	if w, ok := c.check(call, &buf, &buf, buf); !ok {
		return w
	}
	return c.issue(call.Kind, comm.Buffer{DType: buf.DType}, buf, copRecv, 0, peer, buf.Count, false, true)
}

// Barrier is an all-reduce of one float on the communicator's scratch
// memory: NCCL has no barrier of its own.
func (c *Comm) Barrier() comm.Work {
	b := comm.Buffer{Addr: c.scratch, Count: 1, DType: comm.Float32, Loc: comm.Device, Device: c.dev.ordinal}
	return c.issueKind(comm.KindBarrier, b, b, copAllReduce, 0, 0, 1, true, true, comm.Buffer{DType: comm.Float32})
}

// issue stages host buffers and launches one operation. in says whether
// send's contents go in (staged host to device), out whether recv's come
// back.
func (c *Comm) issue(kind comm.Kind, send, recv comm.Buffer, op, redop, peer, count int, in, out bool) comm.Work {
	desc := send
	if kind == comm.KindRecv || kind == comm.KindReduceScatter {
		desc = recv
	}
	return c.issueKind(kind, send, recv, op, redop, peer, count, in, out, desc)
}

// newSlot reserves and publishes the next operation (backend.Ring). Inside
// a group its slot must not be one of the group's, which are launched
// only at GroupEnd: Reserve would wait for one of them. It fails once the
// communicator is stopping. The caller holds issueMu.
func (c *Comm) newSlot(kind comm.Kind, count int, dt comm.DType) (*slot, error) {
	if err := c.stoppingErr(); err != nil {
		return nil, err
	}
	if len(c.grouped) >= backend.RingSize {
		return nil, fmt.Errorf("%w: nccl: rank %d: a group of more than %d operations (backend.RingSize)", comm.ErrInvalid, c.rank, backend.RingSize)
	}
	// Waits for the operation a ring before, which the watchdog bounds.
	seq := c.ops.Reserve(c)
	sl := c.ops.Op(seq)
	ev := sl.event // the issuer's own: only it writes the field
	if ev == 0 {
		var err error
		if ev, err = c.d.eventCreate(c.ctx); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.stoppingErr(); err != nil {
		// Nothing published: teardown has failed everything that was.
		sl.event = ev
		return nil, err
	}
	*sl = slot{seq: seq, event: ev, kind: kind, count: count, dtype: dt, issued: time.Now(), stage: sl.stage[:0], pins: sl.pins[:0]}
	c.ops.Publish(seq)
	return sl, nil
}

func (c *Comm) issueKind(kind comm.Kind, send, recv comm.Buffer, op, redop, peer, count int, in, out bool, desc comm.Buffer) comm.Work {
	c.issueMu.Lock()
	defer c.issueMu.Unlock()
	sl, err := c.newSlot(kind, desc.Count, desc.DType)
	if err != nil {
		return comm.FailedWork(&comm.OpError{Rank: c.rank, Kind: kind, Count: desc.Count, DType: desc.DType, Err: err})
	}
	p := pending{s: sl}
	sp, rp := uintptr(send.Addr), uintptr(recv.Addr)
	if send.Loc == comm.Host && send.Bytes() > 0 && kind != comm.KindRecv && in {
		dev, err := c.stageIn(sl, &p, send)
		if err != nil {
			return c.failSlot(sl, err)
		}
		sp = dev
		if comm.InPlace(send, recv) {
			rp = dev
		}
	} else if send.Loc == comm.Host && send.Bytes() > 0 && kind != comm.KindRecv {
		// Broadcast off the root: nothing goes in, the result comes back.
		blk, err := c.stage(sl, send.Bytes())
		if err != nil {
			return c.failSlot(sl, err)
		}
		sp, rp = uintptr(blk.Addr()), uintptr(blk.Addr())
	}
	if recv.Loc == comm.Host && recv.Bytes() > 0 && kind != comm.KindSend && out {
		if rp == uintptr(recv.Addr) {
			blk, err := c.stage(sl, recv.Bytes())
			if err != nil {
				return c.failSlot(sl, err)
			}
			rp = uintptr(blk.Addr())
		}
		if err := c.stageOut(sl, &p, recv, rp); err != nil {
			return c.failSlot(sl, err)
		}
	}
	p.nccl = newCop(op, ncclType(desc.DType), redop, peer, sp, rp, count)
	if c.depth > 0 {
		c.grouped = append(c.grouped, p)
		return comm.NewWork(c, sl.seq)
	}
	c.lockCalls()
	c.one[0] = p
	c.launch(c.one[:], false)
	c.one[0] = pending{}
	c.unlockCalls()
	return comm.NewWork(c, sl.seq)
}

// hcopyHeader is the room at the start of a pinned block for the
// ddp_hcopy argument of the host function that fills or empties it.
const hcopyHeader = 64

// stageIn stages host buffer b on the device: a host function copies it
// into pinned memory and the pinned memory is copied to the device, both
// on the stream when the operation's turn comes, so the operation reads
// what the operations before it left there. It returns the device
// address.
func (c *Comm) stageIn(sl *slot, p *pending, b comm.Buffer) (uintptr, error) {
	n := b.Bytes()
	pin, err := c.pin(sl, n)
	if err != nil {
		return 0, err
	}
	dev, err := c.stage(sl, n)
	if err != nil {
		return 0, err
	}
	data := uintptr(pin.Addr()) + hcopyHeader
	setHcopy(pin, data, uintptr(b.Addr), n)
	p.pre = append(p.pre,
		newCop(copHostFn, 0, 0, 0, uintptr(pin.Addr()), 0, 0),
		newCop(copHtoD, 0, 0, 0, data, uintptr(dev.Addr()), n))
	return uintptr(dev.Addr()), nil
}

// stageOut brings the result at device address dev back into host buffer
// b, on the stream right after the operation.
func (c *Comm) stageOut(sl *slot, p *pending, b comm.Buffer, dev uintptr) error {
	n := b.Bytes()
	pin, err := c.pin(sl, n)
	if err != nil {
		return err
	}
	data := uintptr(pin.Addr()) + hcopyHeader
	setHcopy(pin, uintptr(b.Addr), data, n)
	p.post = append(p.post,
		newCop(copDtoH, 0, 0, 0, dev, data, n),
		newCop(copHostFn, 0, 0, 0, uintptr(pin.Addr()), 0, 0))
	return nil
}

// setHcopy writes ddp_hcopy {dst, src, n} at the start of pinned block b.
func setHcopy(b allocator.Block, dst, src uintptr, n int) {
	h := (*[3]uint64)(unsafe.Pointer(unsafe.SliceData(b.Bytes())))
	h[0], h[1], h[2] = uint64(dst), uint64(src), uint64(n)
}

// pin takes pinned host memory for n bytes of staging plus the header.
func (c *Comm) pin(sl *slot, n int) (allocator.Block, error) {
	blk, err := c.pinned.Get(n + hcopyHeader)
	if err != nil {
		return blk, fmt.Errorf("nccl: pinned host memory to stage %d bytes: %w", n, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if sl.err != nil {
		// Abort or Close failed the operation while it was being issued.
		c.pinned.Put(blk)
		return blk, sl.err
	}
	sl.pins = append(sl.pins, blk)
	return blk, nil
}

// stage takes device memory for a host buffer of n bytes; it stays the
// operation's until the operation completes.
func (c *Comm) stage(sl *slot, n int) (allocator.Block, error) {
	blk, err := c.staging.Get(n)
	if err != nil {
		return blk, fmt.Errorf("nccl: staging %d bytes of host memory on device %d: %w", n, c.dev.ordinal, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if sl.err != nil {
		c.staging.Put(blk)
		return blk, sl.err
	}
	sl.stage = append(sl.stage, blk)
	return blk, nil
}

// failSlot fails an operation that could not be launched: nothing of it
// is on the stream, and its staging memory goes back at once.
func (c *Comm) failSlot(sl *slot, err error) comm.Work {
	c.mu.Lock()
	if sl.err == nil {
		c.failLocked(sl, c.opError(sl, err))
		c.unstage(sl)
	}
	c.mu.Unlock()
	return comm.NewWork(c, sl.seq)
}

// failLocked marks sl failed; it completes in order with the rest, with
// this error. Its staging memory stays its own: the caller returns it
// when nothing of the operation is on the stream, else completing it
// (advance, teardown) does once the stream has passed it. The caller
// holds c.mu.
func (c *Comm) failLocked(sl *slot, err error) {
	sl.err = err
	sl.recorded = true
}

// unstage returns an operation's staging memory. The caller holds c.mu.
func (c *Comm) unstage(sl *slot) {
	for _, b := range sl.stage {
		c.staging.Put(b)
	}
	for _, b := range sl.pins {
		c.pinned.Put(b)
	}
	sl.stage, sl.pins = sl.stage[:0], sl.pins[:0]
}

// GroupStart starts a group: operations issued until the matching
// GroupEnd are launched together, in one ncclGroupStart/End. Kernels and
// copies issued inside the group go on the stream before the group's
// collectives, as with NCCL's own groups.
func (c *Comm) GroupStart() {
	c.issueMu.Lock()
	c.depth++
	c.issueMu.Unlock()
}

// GroupEnd ends a group; the outermost launches its operations as one
// launch. An error of the launch is also every grouped operation's, and
// their Works report it.
func (c *Comm) GroupEnd() error {
	c.issueMu.Lock()
	defer c.issueMu.Unlock()
	if c.depth == 0 {
		return fmt.Errorf("%w: nccl: rank %d: GroupEnd without GroupStart", comm.ErrInvalid, c.rank)
	}
	c.depth--
	if c.depth > 0 || len(c.grouped) == 0 {
		return nil
	}
	ps := c.grouped
	c.grouped = nil
	c.lockCalls()
	c.launch(ps, true)
	c.unlockCalls()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		if p.s.err != nil {
			return p.s.err
		}
	}
	return nil
}
