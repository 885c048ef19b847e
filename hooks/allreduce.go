package hooks

import (
	"sync"

	"github.com/ddpgo/ddpgo/comm"
)

// AllReduce returns the plain averaging hook, PyTorch's allreduce_hook:
// divide the bucket by the group size in its own dtype (float32, float16
// or bfloat16), then all-reduce it with Sum in place. It needs no scratch
// memory. Dividing before summing keeps the partial sums in the range of
// the gradients themselves, at the cost of a separate pass over the
// bucket. A float64 bucket is all-reduced with comm.Avg instead, which
// every backend computes in float64 arithmetic: dividing first would
// multiply it by 1/N rounded to float32 (comm.Kernels.Scale's factor).
func AllReduce() Hook { return &plain{base: base{name: "allreduce"}, prescale: true} }

// Avg returns the fused averaging hook (the Reducer's default): one
// all-reduce with comm.Avg in place, so the backend averages inside its
// reduction pass (inproc and NCCL multiply each contribution by 1/N as
// they sum it) instead of in a separate pass over the bucket. On a backend
// whose Avg is not native (comm.Caps.NativeAvg false: MPI has no MPI_AVG)
// it does what AllReduce does: scale by 1/N, then Sum (a float64 bucket
// keeps comm.Avg, as in AllReduce). It needs no scratch.
func Avg() Hook { return &plain{base: base{name: "avg"}} }

// plain is the uncompressed hook: AllReduce with prescale, Avg without.
type plain struct {
	base
	prescale bool
	mu       sync.Mutex // Setup and Close: a value shared by mistake fails cleanly
	op       comm.Op
	n        int
}

func (h *plain) Name() string                { return h.name }
func (h *plain) Scratch(int, comm.DType) int { return 0 }
func (h *plain) Finish(b *Bucket) error {
	return h.check("Finish", b, h.Wire(b.Buf.DType), 0)
}

// Wire is the bucket's own dtype, for every floating-point dtype.
func (h *plain) Wire(dt comm.DType) comm.DType {
	if dt.IsFloat() {
		return dt
	}
	return 0
}
func (h *plain) Setup(c comm.Communicator, k comm.Kernels) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.setup(c, k); err != nil {
		return err
	}
	h.n = c.Size()
	h.op = comm.Avg
	if h.prescale || !comm.CapsOf(c).NativeAvg {
		h.op = comm.Sum
	}
	return nil
}

func (h *plain) Launch(b *Bucket) (comm.Work, error) {
	if err := h.check("Launch", b, h.Wire(b.Buf.DType), 0); err != nil {
		return comm.Work{}, err
	}
	b.WireBytes = int64(b.Buf.Bytes())
	op := h.op
	if b.Buf.DType == comm.Float64 {
		op = comm.Avg
	} else if op == comm.Sum && h.n > 1 {
		h.k.Scale(b.Buf, 1/float32(h.n))
	}
	if b.Scatter {
		return h.c.ReduceScatter(b.Buf, b.Part(h.c.Rank(), h.n), op), nil
	}
	return h.c.AllReduce(b.Buf, b.Buf, op), nil
}

// Scatters: the reduce-scatter does the all-reduce's arithmetic.
func (h *plain) Scatters() bool { return true }

// KernelOps is the prescaling Scale, where Launch does one: for every
// dtype but float64, when the collective is a Sum over more than one rank.
func (h *plain) KernelOps(dt comm.DType) []KernelUse {
	if dt == comm.Float64 || !dt.IsFloat() || h.op != comm.Sum || h.n < 2 {
		return nil
	}
	return []KernelUse{{comm.OpScale, dt}}
}

func (h *plain) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return nil
}
