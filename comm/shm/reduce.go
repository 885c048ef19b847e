package shm

import (
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/internal/reduce"
)

// chunkBytes is the block size of the reduction loops: small enough that a
// block of every input stays in L1 while it is reduced and copied out.
const chunkBytes = 8 << 10

// reducer is an endpoint's scratch for reductions: the reduction kernels
// of package internal/reduce (and fp16's for half precision) applied to
// every rank's memory, without allocating.
type reducer struct {
	srcs, dsts   []unsafe.Pointer
	sends, recvs []unsafe.Pointer
	ptrs         []unsafe.Pointer
	views        [][]byte // reinterpreted as [][]T by the kernels
	tmp          unsafe.Pointer
	tmpMem       []byte
}

func newReducer(n int) reducer {
	r := reducer{
		srcs:   make([]unsafe.Pointer, n),
		dsts:   make([]unsafe.Pointer, n),
		sends:  make([]unsafe.Pointer, n),
		recvs:  make([]unsafe.Pointer, n),
		ptrs:   make([]unsafe.Pointer, n),
		views:  make([][]byte, n),
		tmpMem: make([]byte, chunkBytes+line),
	}
	off := (line - int(uintptr(unsafe.Pointer(&r.tmpMem[0]))%line)) % line
	r.tmp = unsafe.Pointer(&r.tmpMem[off])
	return r
}

// reduceInto reduces m elements at srcs (every rank's, in rank order) into
// dsts[0] and copies the result to the other dsts, chunk by chunk so the
// copies read from L1.
//
// stream, for the two-rank float32 sum and average into two outputs,
// writes them with streaming stores when neither output is its rank's
// input.
func (r *reducer) reduceInto(dsts, srcs []unsafe.Pointer, dt comm.DType, op comm.Op, m int, stream bool) {
	if len(srcs) == 1 {
		// One rank: every op (Avg divides by 1) leaves the input as it is,
		// so the reduction is at most a copy, and in place nothing at all.
		for _, dst := range dsts {
			Move(dst, srcs[0], m*dt.Size())
		}
		return
	}
	if dt == comm.Float32 && (op == comm.Sum || op == comm.Avg) && len(srcs) == 2 && len(dsts) == 2 {
		// The two-rank all-reduce: one pass, both outputs stored at once;
		// Avg is the same pre-multiplied sum as the general path's, in the
		// same pass, so averaging costs what summing costs.
		f := func(p unsafe.Pointer) []float32 { return unsafe.Slice((*float32)(p), m) }
		stream = stream && dsts[0] != srcs[0] && dsts[1] != srcs[1]
		switch {
		case op == comm.Sum && stream:
			reduce.SumFloat32TwiceNT(f(dsts[0]), f(dsts[1]), f(srcs[0]), f(srcs[1]))
		case op == comm.Sum:
			reduce.SumFloat32Twice(f(dsts[0]), f(dsts[1]), f(srcs[0]), f(srcs[1]))
		case stream:
			reduce.AvgFloat32TwiceNT(f(dsts[0]), f(dsts[1]), f(srcs[0]), f(srcs[1]))
		default:
			reduce.AvgFloat32Twice(f(dsts[0]), f(dsts[1]), f(srcs[0]), f(srcs[1]))
		}
		return
	}
	if dt == comm.Float32 && op == comm.Sum && len(srcs) == 2 && len(dsts) == 1 {
		// A rank's own output of a two-rank staged all-reduce: the kernel
		// the general path below calls, without the blocks it needs for
		// more outputs or more inputs (a quarter of a 16-byte all-reduce's
		// protocol steps).
		f := func(p unsafe.Pointer) []float32 { return unsafe.Slice((*float32)(p), m) }
		reduce.SumFloat32(f(dsts[0]), f(srcs[0]), f(srcs[1]))
		return
	}
	sz := dt.Size()
	chunk := chunkBytes / sz
	ptrs := r.ptrs[:len(srcs)]
	for off := 0; off < m; off += chunk {
		k := min(chunk, m-off)
		for j, s := range srcs {
			ptrs[j] = unsafe.Add(s, off*sz)
		}
		out := unsafe.Add(dsts[0], off*sz)
		r.combine(dt, op, out, ptrs, k)
		for _, dst := range dsts[1:] {
			Move(unsafe.Add(dst, off*sz), out, k*sz)
		}
	}
}

// combine reduces m elements at every srcs[j] into dst, which may be one
// of them.
func (r *reducer) combine(dt comm.DType, op comm.Op, dst unsafe.Pointer, srcs []unsafe.Pointer, m int) {
	n := len(srcs)
	switch dt {
	case comm.Float32:
		if op == comm.Avg {
			reduce.AvgFloat32(unsafe.Slice((*float32)(dst), m), views[float32](r, srcs, m), unsafe.Slice((*float32)(r.tmp), m))
			return
		}
		combineT[float32](r, reduce.Kernel[float32](op), dst, srcs, m)
	case comm.Float64:
		if op == comm.Avg {
			reduce.AvgFloat64(unsafe.Slice((*float64)(dst), m), views[float64](r, srcs, m), unsafe.Slice((*float64)(r.tmp), m))
			return
		}
		combineT[float64](r, reduce.Kernel[float64](op), dst, srcs, m)
	case comm.Int32:
		combineT[int32](r, reduce.Kernel[int32](op), dst, srcs, m)
		if op == comm.Avg {
			reduce.Div(unsafe.Slice((*int32)(dst), m), n)
		}
	case comm.Int64:
		combineT[int64](r, reduce.Kernel[int64](op), dst, srcs, m)
		if op == comm.Avg {
			reduce.Div(unsafe.Slice((*int64)(dst), m), n)
		}
	case comm.Uint8:
		combineT[uint8](r, reduce.Kernel[uint8](op), dst, srcs, m)
		if op == comm.Avg {
			reduce.Div(unsafe.Slice((*uint8)(dst), m), n)
		}
	case comm.Float16, comm.BFloat16:
		switch op {
		case comm.Max:
			combineT[uint16](r, reduce.MaxHalf, dst, srcs, m)
			return
		case comm.Min:
			combineT[uint16](r, reduce.MinHalf, dst, srcs, m)
			return
		}
		ss := views[uint16](r, srcs, m)
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
			scratch := unsafe.Slice((*float32)(r.tmp), 2*bf16Block)
			reduce.AvgBFloat16(out, ss, scratch[:bf16Block], scratch[bf16Block:])
		}
	}
}

// bf16Block is the block of a bfloat16 average: two float32 blocks of it
// fill the chunk scratch.
const bf16Block = chunkBytes / 8

// views returns srcs as m-element slices of T, in the reducer's scratch.
func views[T any](r *reducer, srcs []unsafe.Pointer, m int) [][]T {
	ss := (*(*[][]T)(unsafe.Pointer(&r.views)))[:len(srcs)]
	for j, p := range srcs {
		ss[j] = unsafe.Slice((*T)(p), m)
	}
	return ss
}

func combineT[T reduce.Elem](r *reducer, k reduce.Binary[T], dst unsafe.Pointer, srcs []unsafe.Pointer, m int) {
	reduce.N(k, unsafe.Slice((*T)(dst), m), views[T](r, srcs, m), unsafe.Slice((*T)(r.tmp), m))
}

// maxMove bounds the bytes of one copy: the runtime's memmove cannot be
// preempted, so a large copy is cut into pieces of well under a
// millisecond, and the garbage collector and the scheduler never wait on
// it for long.
const maxMove = 1 << 20

// Move copies n bytes from src to dst, which may overlap, in pieces the
// scheduler can preempt between.
func Move(dst, src unsafe.Pointer, n int) {
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
