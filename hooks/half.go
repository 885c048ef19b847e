package hooks

import (
	"sync"

	"github.com/ddpgo/ddpgo/comm"
)

// FP16 returns the half-precision compression hook, PyTorch's
// fp16_compress_hook done more accurately: scale the float32 bucket by 1/N
// and round once to IEEE binary16 into scratch memory, all-reduce the
// scratch with Sum in float16, and convert the sum back into the float32
// bucket. (PyTorch converts first and divides in float16, rounding twice.)
// It halves the bytes on the wire. Values whose magnitude after scaling
// exceeds 65504 become ±Inf; Bucket.Overflows counts them.
//
// FP16 and BF16 compress float32 buckets. A float16 or bfloat16 bucket is
// already as narrow as the wire, so it is reduced in its own dtype as
// AllReduce reduces it (divided by N, then summed in place), with no
// scratch and no overflow count. A float64 bucket is refused (Wire returns
// 0, and the Reducer refuses the parameter when it is built): rounding a
// gradient the model keeps in float64 to 16 bits would throw away what it
// asked float64 for; reduce such models with Avg or AllReduce.
func FP16() Hook { return &half{base: base{name: "fp16"}, wire: comm.Float16} }

// BF16 returns the bfloat16 compression hook, PyTorch's bf16_compress_hook:
// like FP16 with bfloat16 on the wire, which keeps float32's range (so
// overflow is practically impossible) with 8 bits of precision.
func BF16() Hook { return &half{base: base{name: "bf16"}, wire: comm.BFloat16} }

type half struct {
	base
	wire  comm.DType
	mu    sync.Mutex // Setup and Close: a value shared by mistake fails cleanly
	scale float32
}

func (h *half) Name() string { return h.name }

func (h *half) Wire(dt comm.DType) comm.DType {
	switch dt {
	case comm.Float32:
		return h.wire
	case comm.Float16, comm.BFloat16:
		return dt
	}
	return 0
}

func (h *half) Scratch(count int, dt comm.DType) int {
	if dt != comm.Float32 {
		return 0
	}
	return count * h.wire.Size()
}

func (h *half) Setup(c comm.Communicator, k comm.Kernels) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.setup(c, k); err != nil {
		return err
	}
	h.scale = 1 / float32(c.Size())
	return nil
}

// wireBuf is the bucket's scratch seen as its wire dtype.
func (h *half) wireBuf(b *Bucket) comm.Buffer {
	w := b.Scratch
	w.DType, w.Count = h.wire, b.Buf.Count
	if w.Count == 0 {
		w.Addr = nil
	}
	return w
}

func (h *half) Launch(b *Bucket) (comm.Work, error) {
	dt := b.Buf.DType
	if err := h.check("Launch", b, h.Wire(dt), h.Scratch(b.Buf.Count, dt)); err != nil {
		return comm.Work{}, err
	}
	if dt != comm.Float32 { // already half width: reduce in place
		if h.scale != 1 {
			h.k.Scale(b.Buf, h.scale)
		}
		b.WireBytes = int64(b.Buf.Bytes())
		if b.Scatter {
			return h.c.ReduceScatter(b.Buf, b.Part(h.c.Rank(), h.c.Size()), comm.Sum), nil
		}
		return h.c.AllReduce(b.Buf, b.Buf, comm.Sum), nil
	}
	w := h.wireBuf(b)
	h.k.Compress(w, b.Buf, h.scale)
	b.WireBytes = int64(w.Bytes())
	if b.Scatter {
		return h.c.ReduceScatter(w, part(w, h.c.Rank(), h.c.Size()), comm.Sum), nil
	}
	return h.c.AllReduce(w, w, comm.Sum), nil
}

// Scatters: compression and decompression are elementwise, so a
// reduce-scatter of the wire buffer gives each rank the bits the
// all-reduce gives that part.
func (h *half) Scatters() bool { return true }

func (h *half) Finish(b *Bucket) error {
	dt := b.Buf.DType
	if err := h.check("Finish", b, h.Wire(dt), h.Scratch(b.Buf.Count, dt)); err != nil {
		return err
	}
	if dt != comm.Float32 {
		b.Overflows = 0
		return nil
	}
	w, buf := h.wireBuf(b), b.Buf
	if b.Scatter { // only this rank's part was reduced
		w, buf = part(w, h.c.Rank(), h.c.Size()), b.Part(h.c.Rank(), h.c.Size())
	}
	// buf still holds this rank's float32 input: count the elements
	// whose sum is Inf or NaN although the input was finite. A rank's own
	// conversion overflow makes the sum non-finite, so this counts it,
	// the overflows of other ranks' conversions and those of the sum
	// itself. The common case (nothing non-finite) costs one word-wise
	// scan of the half-precision sum.
	b.Overflows = h.k.Overflows(w, buf)
	h.k.Decompress(buf, w)
	return nil
}

// KernelOps: a float32 bucket is compressed, counted and decompressed
// through the wire dtype; a half-precision one is scaled in its own dtype
// when there is more than one rank.
func (h *half) KernelOps(dt comm.DType) []KernelUse {
	switch dt {
	case comm.Float32:
		return []KernelUse{{comm.OpCompress, h.wire}, {comm.OpOverflows, h.wire}, {comm.OpDecompress, h.wire}}
	case comm.Float16, comm.BFloat16:
		if h.scale != 1 {
			return []KernelUse{{comm.OpScale, dt}}
		}
	}
	return nil
}

func (h *half) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return nil
}
