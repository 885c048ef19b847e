package bench

import (
	"context"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// rankBufs is one rank's buffers and its outcome in the current
// placement.
type rankBufs struct {
	// send and recv are the buffers' bytes: views of host pool blocks,
	// or, for device buffers, host copies that fillInputs writes and
	// uploads, and into which the result is downloaded to be checked.
	send, recv []byte
	// sendBuf and recvBuf are the buffers as collectives take them
	// (Uint8, the whole size); kern is set for device buffers.
	sendBuf, recvBuf comm.Buffer
	kern             comm.Kernels
	elapsed          time.Duration
	wrong            int64
	err              error
	// pending is an operation whose Wait ended with its context: the
	// backend may still write its buffers until it completes.
	pending    comm.Work
	hasPending bool
}

// drainTimeout bounds the wait, after an aborted or interrupted
// placement, for the operations still pending: an aborted backend
// completes them within a bound it documents (seconds); past this one the
// buffers are leaked rather than reused.
const drainTimeout = 30 * time.Second

// newRankBufs returns a send and a receive buffer of size bytes for each
// of n ranks, from a CommPool over src (nil: HostSource; the
// communicator's own host memory where it has one, comm.HostSourceOf)
// (collectives take pool memory, never Go heap memory), and the function
// that returns them. A buffer whose
// operation may still be pending is never returned to the pool.
func newRankBufs(n, size int, src allocator.Source) ([]*rankBufs, func(), error) {
	// Two blocks per rank, all carved from one slab sized for them (not
	// the default 64 MiB: a sweep of small sizes maps, and under the
	// invariants tag poisons, only what it uses). The limit is that slab
	// and a page of rounding.
	per := int64(size+allocator.Alignment-1) &^ (allocator.Alignment - 1)
	slab := 2 * int64(n) * per
	if slab > math.MaxInt-(1<<20) {
		return nil, nil, fmt.Errorf("bench: %d ranks x 2 buffers of %d bytes: more than an address space holds", n, size)
	}
	pool, err := allocator.New(allocator.Options{Source: src, Limit: slab + 1<<20, SlabSize: int(slab)})
	if err != nil {
		return nil, nil, fmt.Errorf("bench: CommPool for %d ranks of 2 x %d bytes: %w", n, size, err)
	}
	var blocks []allocator.Block
	ranks := make([]*rankBufs, n)
	release := func() {
		for i, b := range blocks {
			if rb := ranks[i/2]; rb == nil || !rb.drained() {
				continue // the backend may still write it: leak it
			}
			pool.Put(b)
		}
		pool.Close() // a leaked block keeps its slab mapped
	}
	for r := range ranks {
		for range 2 {
			b, err := pool.Get(size)
			if err != nil {
				release()
				return nil, nil, fmt.Errorf("bench: rank %d: a buffer of %d bytes (%d ranks x 2): %w", r, size, n, err)
			}
			blocks = append(blocks, b)
		}
		rb := &rankBufs{send: blocks[2*r].Bytes()[:size:size], recv: blocks[2*r+1].Bytes()[:size:size]}
		rb.sendBuf = comm.HostBuffer(blocks[2*r].Addr(), size, comm.Uint8)
		rb.recvBuf = comm.HostBuffer(blocks[2*r+1].Addr(), size, comm.Uint8)
		ranks[r] = rb
	}
	return ranks, release, nil
}

// newDeviceBufs is newRankBufs in each rank's device memory: a CommPool
// per rank over its communicator's Source, and host copies of both
// buffers to fill and check them.
func newDeviceBufs(comms []comm.Communicator, size int) ([]*rankBufs, func(), error) {
	per := int64(size+allocator.Alignment-1) &^ (allocator.Alignment - 1)
	if 2*per > math.MaxInt-(1<<20) {
		return nil, nil, fmt.Errorf("bench: 2 buffers of %d bytes: more than an address space holds", size)
	}
	pools := make([]*allocator.Pool, len(comms))
	blocks := make([][2]allocator.Block, len(comms))
	ranks := make([]*rankBufs, len(comms))
	release := func() {
		for i, p := range pools {
			if p == nil {
				continue
			}
			if rb := ranks[i]; rb == nil || rb.drained() {
				for _, b := range blocks[i] {
					if b.Addr() != nil {
						p.Put(b)
					}
				}
			}
			p.Close() // a leaked block keeps its slab mapped
		}
	}
	for r, c := range comms {
		dm, ok := c.(DeviceMemory)
		if !ok {
			release()
			return nil, nil, fmt.Errorf("%w: device buffers need a communicator with device memory (DeviceMemory); rank %d's (%s) has none",
				ErrConfig, c.Rank(), comm.CapsOf(c).Backend)
		}
		p, err := allocator.New(allocator.Options{Source: dm.Source(), Limit: 2*per + 1<<20, SlabSize: int(2 * per)})
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("bench: rank %d: a device CommPool of 2 x %d bytes: %w", c.Rank(), size, err)
		}
		pools[r] = p
		rb := &rankBufs{send: make([]byte, size), recv: make([]byte, size), kern: dm.Kernels()}
		for i, dst := range []*comm.Buffer{&rb.sendBuf, &rb.recvBuf} {
			b, err := p.Get(size)
			if err != nil {
				release()
				return nil, nil, fmt.Errorf("bench: rank %d: a device buffer of %d bytes: %w", c.Rank(), size, err)
			}
			blocks[r][i] = b
			*dst = comm.Buffer{Addr: b.Addr(), Count: size, DType: comm.Uint8, Loc: comm.Device, Device: comm.DeviceOf(c)}
		}
		ranks[r] = rb
	}
	return ranks, release, nil
}

// typed returns the first elems elements of dt of b (a Uint8 buffer).
func typed(b comm.Buffer, elems int, dt comm.DType) comm.Buffer {
	b.Count, b.DType = elems, dt
	if elems == 0 {
		b.Addr = nil
	}
	return b
}

// wait waits for w, remembering it if ctx ends first.
func (b *rankBufs) wait(ctx context.Context, w comm.Work) error {
	err := w.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		b.pending, b.hasPending = w, true
	}
	return err
}

// drained waits (bounded) for an operation left pending, and reports
// whether the backend is done with the rank's buffers.
func (b *rankBufs) drained() bool {
	if !b.hasPending {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := b.pending.Wait(ctx); err != nil && ctx.Err() != nil {
		return false
	}
	b.hasPending = false
	return true
}

// upload copies the host copies of a device rank's buffers (what
// fillInputs wrote, count elements of dt) into the device buffers.
func (b *rankBufs) upload(count int, dt comm.DType) {
	n := count * dt.Size()
	b.kern.Upload(typed(b.sendBuf, n, comm.Uint8), b.send[:n])
	b.kern.Upload(typed(b.recvBuf, n, comm.Uint8), b.recv[:n])
}

// download copies out (device memory) into the host copy of the receive
// buffer, whose filled values the check no longer needs, and returns it
// as a host Buffer.
func (b *rankBufs) download(out comm.Buffer) comm.Buffer {
	if out.Count == 0 {
		return comm.Buffer{DType: out.DType}
	}
	h := b.recv[:out.Bytes()]
	b.kern.Download(h, out)
	return comm.HostBuffer(unsafe.Pointer(unsafe.SliceData(h)), out.Count, out.DType)
}
