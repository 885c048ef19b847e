package inproc

import (
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/internal/invariants"
	"github.com/ddpgo/ddpgo/internal/reduce"
)

// runPart does part p of parts of the collective described by every rank's
// call D (d is this rank's). With parts == 1 it does the whole collective.
func (c *Comm) runPart(D []desc, d *desc, p, parts int) {
	n := c.g.n
	sz := d.dt.Size()
	switch d.kind {
	case comm.KindAllReduce:
		lo, hi := split(d.count, sz, p, parts)
		for j := range n {
			c.srcs[j] = unsafe.Add(D[j].send, lo*sz)
			c.dsts[j] = unsafe.Add(D[j].recv, lo*sz)
		}
		c.reduceInto(c.dsts[:n], c.srcs[:n], d.dt, d.op, hi-lo)
	case comm.KindReduce:
		lo, hi := split(d.count, sz, p, parts)
		for j := range n {
			c.srcs[j] = unsafe.Add(D[j].send, lo*sz)
		}
		c.dsts[0] = unsafe.Add(D[d.root].recv, lo*sz)
		c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, hi-lo)
	case comm.KindBroadcast:
		lo, hi := split(d.count, sz, p, parts)
		src := unsafe.Add(D[d.root].send, lo*sz)
		for j := range n {
			if j != d.root {
				memmove(unsafe.Add(D[j].recv, lo*sz), src, (hi-lo)*sz)
			}
		}
	case comm.KindAllGather:
		for q := range n {
			if parts == 1 || q == p {
				src := D[q].send
				for j := range n {
					memmove(unsafe.Add(D[j].recv, q*d.count*sz), src, d.count*sz)
				}
			}
		}
	case comm.KindReduceScatter:
		for q := range n {
			if parts == 1 || q == p {
				for j := range n {
					c.srcs[j] = unsafe.Add(D[j].send, q*d.count*sz)
				}
				c.dsts[0] = D[q].recv
				c.reduceInto(c.dsts[:1], c.srcs[:n], d.dt, d.op, d.count)
			}
		}
	}
}

// split returns part p of parts of count elements of sz bytes, with part
// boundaries on 64-byte multiples.
func split(count, sz, p, parts int) (lo, hi int) {
	if parts == 1 {
		return 0, count
	}
	align := max(64/sz, 1)
	per := (count + parts - 1) / parts
	per = (per + align - 1) / align * align
	lo = min(p*per, count)
	hi = min(lo+per, count)
	if invariants.Enabled && !(lo <= hi && (lo*sz)%64 == 0 || lo == count) {
		invariants.Violated("inproc", "split(%d, %d, %d, %d) = [%d, %d)", count, sz, p, parts, lo, hi)
	}
	return lo, hi
}

// reduceInto reduces m elements at srcs into dsts[0] and copies the result
// to the other dsts, chunk by chunk so the copies read from L1.
func (c *Comm) reduceInto(dsts, srcs []unsafe.Pointer, dt comm.DType, op comm.Op, m int) {
	if len(srcs) == 1 {
		// One rank: every op (Avg divides by 1) leaves the input as it is,
		// so the reduction is at most a copy, and in place nothing at all.
		for _, dst := range dsts {
			memmove(dst, srcs[0], m*dt.Size())
		}
		return
	}
	if dt == comm.Float32 && (op == comm.Sum || op == comm.Avg) && len(srcs) == 2 && len(dsts) == 2 {
		// The two-rank all-reduce: one pass, both outputs stored at once;
		// Avg is the same pre-multiplied sum as the general path's, in the
		// same pass, so averaging costs what summing costs.
		f := func(p unsafe.Pointer) []float32 { return unsafe.Slice((*float32)(p), m) }
		if op == comm.Sum {
			reduce.SumFloat32Twice(f(dsts[0]), f(dsts[1]), f(srcs[0]), f(srcs[1]))
		} else {
			reduce.AvgFloat32Twice(f(dsts[0]), f(dsts[1]), f(srcs[0]), f(srcs[1]))
		}
		return
	}
	sz := dt.Size()
	chunk := chunkBytes / sz
	ptrs := c.ptrs[:len(srcs)]
	for off := 0; off < m; off += chunk {
		k := min(chunk, m-off)
		for j, s := range srcs {
			ptrs[j] = unsafe.Add(s, off*sz)
		}
		out := unsafe.Add(dsts[0], off*sz)
		c.combine(dt, op, out, ptrs, k)
		for _, dst := range dsts[1:] {
			memmove(unsafe.Add(dst, off*sz), out, k*sz)
		}
	}
}

// combine reduces m elements at every srcs[j] into dst, which may be one
// of them.
func (c *Comm) combine(dt comm.DType, op comm.Op, dst unsafe.Pointer, srcs []unsafe.Pointer, m int) {
	n := c.g.n
	switch dt {
	case comm.Float32:
		if op == comm.Avg {
			reduce.AvgFloat32(unsafe.Slice((*float32)(dst), m), views[float32](c, srcs, m), unsafe.Slice((*float32)(c.tmp), m))
			return
		}
		combineT[float32](c, reduce.Kernel[float32](op), dst, srcs, m)
	case comm.Float64:
		if op == comm.Avg {
			reduce.AvgFloat64(unsafe.Slice((*float64)(dst), m), views[float64](c, srcs, m), unsafe.Slice((*float64)(c.tmp), m))
			return
		}
		combineT[float64](c, reduce.Kernel[float64](op), dst, srcs, m)
	case comm.Int32:
		combineT[int32](c, reduce.Kernel[int32](op), dst, srcs, m)
		if op == comm.Avg {
			reduce.Div(unsafe.Slice((*int32)(dst), m), n)
		}
	case comm.Int64:
		combineT[int64](c, reduce.Kernel[int64](op), dst, srcs, m)
		if op == comm.Avg {
			reduce.Div(unsafe.Slice((*int64)(dst), m), n)
		}
	case comm.Uint8:
		combineT[uint8](c, reduce.Kernel[uint8](op), dst, srcs, m)
		if op == comm.Avg {
			reduce.Div(unsafe.Slice((*uint8)(dst), m), n)
		}
	case comm.Float16, comm.BFloat16:
		switch op {
		case comm.Max:
			combineT[uint16](c, reduce.MaxHalf, dst, srcs, m)
			return
		case comm.Min:
			combineT[uint16](c, reduce.MinHalf, dst, srcs, m)
			return
		}
		ss := views[uint16](c, srcs, m)
		out := unsafe.Slice((*uint16)(dst), m)
		switch {
		case dt == comm.Float16 && op == comm.Sum:
			fp16.SumHalf(out, ss)
		case dt == comm.Float16:
			// A float32 sum of binary16 values cannot overflow (65504 times
			// any group size stays far below 3.4e38), so scaling the sum
			// before the one rounding gives the pre-multiplied sum's
			// guarantee with one rounding fewer.
			fp16.SumScaledHalf(out, ss, 1/float32(n))
		case op == comm.Sum:
			fp16.SumBFloat16(out, ss)
		default:
			// bfloat16 has float32's range: its sum must be pre-multiplied.
			scratch := unsafe.Slice((*float32)(c.tmp), 2*bf16Block)
			reduce.AvgBFloat16(out, ss, scratch[:bf16Block], scratch[bf16Block:])
		}
	}
}

// bf16Block is the block of a bfloat16 average: two float32 blocks of it
// fill the worker's chunk scratch.
const bf16Block = chunkBytes / 8

// views returns srcs as m-element slices of T, in the worker's scratch.
func views[T any](c *Comm, srcs []unsafe.Pointer, m int) [][]T {
	ss := (*(*[][]T)(unsafe.Pointer(&c.views)))[:len(srcs)]
	for j, p := range srcs {
		ss[j] = unsafe.Slice((*T)(p), m)
	}
	return ss
}

func combineT[T reduce.Elem](c *Comm, k reduce.Binary[T], dst unsafe.Pointer, srcs []unsafe.Pointer, m int) {
	reduce.N(k, unsafe.Slice((*T)(dst), m), views[T](c, srcs, m), unsafe.Slice((*T)(c.tmp), m))
}

// maxMove bounds the bytes of one copy: the runtime's memmove cannot be
// preempted, so a large copy is cut into pieces of well under a
// millisecond, and the garbage collector and the scheduler never wait on
// it for long.
const maxMove = 1 << 20

// memmove copies n bytes from src to dst, which may overlap.
func memmove(dst, src unsafe.Pointer, n int) {
	if n == 0 || dst == src {
		return
	}
	piece := func(off int) {
		k := min(maxMove, n-off)
		copy(unsafe.Slice((*byte)(unsafe.Add(dst, off)), k), unsafe.Slice((*byte)(unsafe.Add(src, off)), k))
	}
	if uintptr(dst) > uintptr(src) && uintptr(dst) < uintptr(src)+uintptr(n) {
		// dst overlaps the end of src: copy the last piece first.
		for off := (n - 1) / maxMove * maxMove; off >= 0; off -= maxMove {
			piece(off)
		}
		return
	}
	for off := 0; off < n; off += maxMove {
		piece(off)
	}
}
