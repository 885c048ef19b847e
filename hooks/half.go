package hooks

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
)

// FP16 returns the half-precision compression hook, PyTorch's
// fp16_compress_hook: scale the float32 bucket by 1/N and round once to
// IEEE binary16 into scratch memory, all-reduce the scratch with Sum in
// float16, and convert the sum back into the float32 bucket. It halves the
// bytes on the wire. Values whose magnitude after scaling exceeds 65504
// become ±Inf; Times.Overflows counts them (see Times).
func FP16() Hook {
	return &half{
		name: "fp16", wire: comm.Float16, exp: 0x7c00,
		compress: fp16.ScaleToHalf, decompress: fp16.HalfToFloat32,
	}
}

// BF16 returns the bfloat16 compression hook, PyTorch's bf16_compress_hook:
// like FP16 with bfloat16 on the wire, which keeps float32's range (so
// overflow is practically impossible) with 8 bits of precision.
func BF16() Hook {
	return &half{
		name: "bf16", wire: comm.BFloat16, exp: 0x7f80,
		compress: fp16.ScaleToBFloat16, decompress: fp16.BFloat16ToFloat32,
	}
}

type half struct {
	name       string
	wire       comm.DType
	exp        uint16 // exponent mask: all ones means Inf or NaN
	compress   func(dst []uint16, src []float32, scale float32)
	decompress func(dst []float32, src []uint16)

	mu      sync.Mutex // Setup and Close: a value shared by mistake fails cleanly
	c       comm.Communicator
	pool    *allocator.Pool
	scratch allocator.Block
	max     int // elements the scratch holds
	have    bool
	closed  bool
}

func (h *half) Name() string { return h.name }

func (h *half) Setup(c comm.Communicator, pool *allocator.Pool, counts []int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c != nil && h.c != c {
		return fmt.Errorf("%w: %s hook set up on rank %d, then given rank %d's communicator", ErrShared, h.name, h.c.Rank(), c.Rank())
	}
	if pool == nil {
		return fmt.Errorf("hooks: %s hook needs a pool for its scratch", h.name)
	}
	need := maxCount(counts)
	if h.have && (need > h.max || pool != h.pool) {
		if err := h.pool.Put(h.scratch); err != nil {
			return fmt.Errorf("hooks: %s hook returning its scratch: %w", h.name, err)
		}
		h.have = false
	}
	if !h.have {
		blk, err := pool.Get(max(need, 1) * 2)
		if err != nil {
			return fmt.Errorf("hooks: %s hook scratch for %d elements: %w", h.name, need, err)
		}
		h.scratch, h.have, h.max, h.pool = blk, true, need, pool
	}
	h.c, h.closed = c, false
	return nil
}

func (h *half) Reduce(ctx context.Context, c comm.Communicator, b *Bucket) error {
	if err := check(h.name, h.c, h.closed || !h.have, h.max, c, b); err != nil {
		return err
	}
	t := &b.Times
	*t = Times{}
	n := b.Buf.Count
	buf := b.Buf.AsFloat32()
	s := h.scratch.Uint16s()[:n]

	t.CompressStart = since(b.Start)
	h.compress(s, buf, 1/float32(c.Size()))
	t.CompressEnd = since(b.Start)

	t.CollectiveStart = t.CompressEnd
	wb := comm.HostBuffer(h.scratch.Addr(), n, h.wire)
	err := c.AllReduce(wb, wb, comm.Sum).Wait(ctx)
	t.CollectiveEnd = since(b.Start)
	t.WireBytes = int64(n * h.wire.Size())
	if err != nil {
		t.DecompressEnd = t.CollectiveEnd
		return fmt.Errorf("hooks: %s of bucket %d (%d elements): %w", h.name, b.Index, n, err)
	}
	// buf still holds this rank's float32 input: count the elements whose
	// sum is Inf or NaN although the input was finite. A rank's own
	// conversion overflow makes the sum non-finite, so this counts it, the
	// overflows of other ranks' conversions and those of the sum itself.
	// The common case (nothing non-finite) costs one word-wise scan.
	if anyNonfinite(s, h.exp) {
		t.Overflows = overflows(s, buf, h.exp)
	}
	h.decompress(buf, s)
	t.DecompressEnd = since(b.Start)
	return nil
}

// anyNonfinite reports whether some element of s has an all-ones exponent
// (Inf or NaN) under mask exp, four elements per 64-bit word.
func anyNonfinite(s []uint16, exp uint16) bool {
	const ones, highs = 0x0001_0001_0001_0001, 0x8000_8000_8000_8000
	m := uint64(exp) * ones
	nw := len(s) / 4
	if nw > 0 {
		words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(s))), nw)
		var acc uint64
		for _, w := range words {
			// A lane of t is zero exactly where the exponent is all ones;
			// (t - ones) &^ t has a lane's high bit set if some lane is zero.
			t := w&m ^ m
			acc |= (t - ones) &^ t
		}
		if acc&highs != 0 {
			return true
		}
	}
	for _, v := range s[nw*4:] {
		if v&exp == exp {
			return true
		}
	}
	return false
}

// overflows counts the elements of s that are Inf or NaN where in is
// finite.
func overflows(s []uint16, in []float32, exp uint16) int64 {
	var n int64
	for i, v := range s {
		if v&exp == exp && !isInf(in[i]) && in[i] == in[i] {
			n++
		}
	}
	return n
}

func isInf(f float32) bool { return f > maxFloat32 || f < -maxFloat32 }

const maxFloat32 = 3.40282346638528859811704183484516925440e+38

func (h *half) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if !h.have {
		return nil
	}
	h.have = false
	if err := h.pool.Put(h.scratch); err != nil {
		return fmt.Errorf("hooks: %s hook returning its scratch: %w", h.name, err)
	}
	return nil
}
