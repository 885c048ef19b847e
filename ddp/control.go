package ddp

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// Control traffic: the Reducer's own collectives (the cross-rank check of
// New, the rebuilt layout's broadcast, BroadcastParameters) carry host
// values through pool memory, uploaded before the collective and
// downloaded after with the pool's kernels, so a backend only ever sees
// pool memory (device memory for a device pool) and a cgo backend never
// holds a Go-heap pointer past a call.

// region returns count elements of dt at byte offset off of blk.
func (r *Reducer) region(blk allocator.Block, off, count int, dt comm.DType) comm.Buffer {
	if count == 0 {
		return comm.Buffer{DType: dt, Loc: location(r.host), Device: r.dev}
	}
	return comm.Buffer{Addr: unsafe.Add(blk.Addr(), off), Count: count, DType: dt, Loc: location(r.host), Device: r.dev}
}

// ctlAllGather gathers every rank's mine into all (Size times as long),
// through pool memory. what names the exchange in errors.
func (r *Reducer) ctlAllGather(ctx context.Context, what string, mine, all []byte, dt comm.DType) error {
	sendBytes := alignUp(len(mine))
	blk, err := r.pool.Get(sendBytes + len(all))
	if err != nil {
		return fmt.Errorf("ddp: rank %d: memory for %s (%d bytes): %w", r.c.Rank(), what, sendBytes+len(all), err)
	}
	send := r.region(blk, 0, len(mine)/dt.Size(), dt)
	recv := r.region(blk, sendBytes, len(all)/dt.Size(), dt)
	r.kern.Upload(send, mine)
	w := r.c.AllGather(send, recv)
	if err := w.Wait(ctx); err != nil {
		return r.abandon(w, blk, what, err)
	}
	r.kern.Download(all, recv)
	return r.pool.Put(blk)
}

// ctlBroadcast broadcasts data from root into data on every rank, through
// pool memory.
func (r *Reducer) ctlBroadcast(ctx context.Context, what string, data []byte, dt comm.DType, root int) error {
	blk, err := r.pool.Get(max(len(data), 1))
	if err != nil {
		return fmt.Errorf("ddp: rank %d: memory for %s (%d bytes): %w", r.c.Rank(), what, len(data), err)
	}
	buf := r.region(blk, 0, len(data)/dt.Size(), dt)
	if r.c.Rank() == root {
		r.kern.Upload(buf, data)
	}
	w := r.c.Broadcast(buf, root)
	if err := w.Wait(ctx); err != nil {
		return r.abandon(w, blk, what, err)
	}
	if r.c.Rank() != root {
		r.kern.Download(data, buf)
	}
	return r.pool.Put(blk)
}

// abandon returns the error of a control collective whose wait failed,
// after settling its block: if the collective is still in flight (the
// wait's context ended), the block stays out of the pool until it
// completes, and the error wraps ErrInFlight too.
func (r *Reducer) abandon(w comm.Work, blk allocator.Block, what string, err error) error {
	if done, _ := w.Test(); !done {
		// Abort with the cause first: settle's own abort names only the
		// memory, and over MPI the first abort is the one the job ends
		// with.
		r.c.Abort(fmt.Errorf("ddp: rank %d: %s: %w", r.c.Rank(), what, err))
	}
	if serr := r.settle([]comm.Work{w}, []allocator.Block{blk}, what); serr != nil {
		return fmt.Errorf("%w; %w", err, serr)
	}
	return err
}

// alignUp rounds n up to the pool's alignment.
func alignUp(n int) int {
	return (n + allocator.Alignment - 1) / allocator.Alignment * allocator.Alignment
}

// asBytes views a slice of fixed-size elements as bytes.
func asBytes[T int64 | uint8 | float32](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}
