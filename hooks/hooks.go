package hooks

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// Hook reduces one bucket of gradients (of one floating-point dtype) so
// that, on every rank, the bucket ends holding the average over ranks. It works in two phases, so
// that the Reducer can keep several buckets on the wire at once: Launch
// prepares the bucket (compresses it, if the hook compresses) and issues
// its collective, returning the collective's Work without waiting for it;
// once that Work has completed without error, Finish turns the result into
// the average in the bucket (decompresses it).
//
// A Hook value belongs to one rank. The Reducer calls Setup once, before
// any Launch, then, per bucket per synced step, Launch and, after the Work
// completes, Finish, and Close once. Launch calls come from one goroutine
// in bucket order and Finish calls from another, in the same order; a
// Launch may run while the Finish of an earlier bucket runs, on a
// different Bucket. Launch must not wait for the network, and Finish must
// not issue collectives: every rank must issue the same collectives in the
// same order, and only Launch's order is the same on every rank. A hook
// touches bucket memory only through the Kernels given to Setup, since the
// memory may be a device's.
//
// Every rank of a group must use a hook of the same name, since the hook
// decides which collectives run.
type Hook interface {
	// Name identifies the hook in statistics and errors ("allreduce",
	// "avg", "fp16", "bf16"). The Reducer compares it across ranks.
	Name() string
	// Wire returns the dtype the hook puts on the wire for a bucket of
	// dtype dt (Float16 for the fp16 hook's float32 buckets, dt itself for
	// plain ones), or 0 if the hook does not reduce buckets of dt. The
	// Reducer asks before it builds anything, and refuses parameters of a
	// dtype the hook does not reduce; it also labels the statistics with
	// it.
	Wire(dt comm.DType) comm.DType
	// Scratch returns how many bytes of scratch memory the hook needs to
	// reduce a bucket of count elements of dtype dt (0 for none). The
	// Reducer provides it from its pool as Bucket.Scratch, one region per
	// bucket that may be in flight, and never reuses it while a
	// collective may still write it.
	Scratch(count int, dt comm.DType) int
	// Setup binds the hook to a rank's communicator and to the kernels of
	// the bucket memory. It fails with ErrShared if the hook is already
	// bound to another communicator.
	Setup(c comm.Communicator, k comm.Kernels) error
	// Launch starts reducing b: it prepares b.Buf (and b.Scratch), issues
	// the collective and returns its Work, setting b.WireBytes. It does not
	// wait for the collective. An error means nothing was issued.
	Launch(b *Bucket) (comm.Work, error)
	// Finish completes b once the Work of its Launch has completed
	// without error: on return b.Buf holds the average over ranks, and
	// b.Overflows is set.
	Finish(b *Bucket) error
	// Close releases the hook. It is idempotent.
	Close() error
}

// KernelUse is one operation of comm.Kernels that a hook applies to bucket
// memory: Op (comm.OpScale, comm.OpCompress, ...) on buffers of DType.
type KernelUse struct {
	Op    string
	DType comm.DType
}

// KernelUser is implemented by a hook that can say, once set up, which
// Kernels operations reducing a bucket of dt applies, besides Zero, Copy,
// Upload and Download, which every Kernels does for every dtype. The
// Reducer asks it when it is built and refuses a parameter whose dtype
// needs an operation that its kernels do not do (comm.Supports): a
// device's kernels panic for a dtype they have no code for, on the
// Reducer's launcher goroutine. The built-in hooks implement it; a hook
// that does not is trusted.
type KernelUser interface {
	KernelOps(dt comm.DType) []KernelUse
}

// Bucket is what a Hook reduces: one bucket of gradients.
type Bucket struct {
	Index int         // bucket index in the current layout
	Buf   comm.Buffer // the gradients; after Finish, the average over ranks
	// Tensors are the gradients Buf holds, in their order in it (the
	// Reducer sets them; nil: Buf is one flat vector). Hooks that work
	// per tensor (PowerSGD) read them; they must not be modified.
	Tensors []Tensor
	// Scratch is Hook.Scratch bytes of pool memory (a Uint8 Buffer in
	// the same Location as Buf), the hook's alone from Launch until
	// Finish returns (or, if the collective fails, until it has
	// completed).
	Scratch   comm.Buffer
	WireBytes int64 // set by Launch: payload bytes handed to the collective
	// Overflows is set by Finish for FP16 and BF16 on float32 buckets:
	// the elements whose reduced value is Inf or NaN although this rank's
	// float32 gradient was finite (see the package documentation). For a
	// Scatter bucket it counts this rank's part only.
	Overflows int64
	// Scatter asks for a reduce-scatter instead of an all-reduce
	// (ddp.Options.Shard): Buf.Count is a multiple of the group size N,
	// and Finish leaves the average in this rank's part of Buf (Part)
	// only; the rest of Buf is undefined. The Reducer sets it only for a
	// hook that is a Scatterer.
	Scatter bool
}

// Part returns block rank of Buf's size equal blocks: what a reduce-scatter
// of a Scatter bucket leaves, averaged, on rank rank of a group of size.
func (b *Bucket) Part(rank, size int) comm.Buffer { return part(b.Buf, rank, size) }

// part is block rank of buf's size equal blocks.
func part(buf comm.Buffer, rank, size int) comm.Buffer {
	n := buf.Count / size
	return buf.Slice(rank*n, n)
}

// Tensor is one gradient in a bucket.
type Tensor struct {
	Param  int   // the parameter's index: the same in every bucket layout
	Offset int   // its first element in Bucket.Buf
	Shape  []int // its shape; it holds the product of Shape elements
}

// TensorScratcher is implemented by a hook whose scratch depends on the
// shapes of a bucket's tensors (Bucket.Tensors), not only on its size.
// The Reducer asks it, through ScratchFor, when it lays out the buckets.
type TensorScratcher interface {
	TensorScratch(b *Bucket) int
}

// ScratchFor returns the bytes of scratch h needs to reduce b:
// h.TensorScratch(b) where h is a TensorScratcher, h.Scratch otherwise.
func ScratchFor(h Hook, b *Bucket) int {
	if ts, ok := h.(TensorScratcher); ok {
		return ts.TensorScratch(b)
	}
	return h.Scratch(b.Buf.Count, b.Buf.DType)
}

// Scatterer is implemented by a hook that can reduce-scatter a bucket
// (Bucket.Scatter) with the same arithmetic, element for element, as its
// all-reduce: so the part a rank receives holds the same bits as that
// part of the all-reduced bucket would. Avg, AllReduce, FP16 and BF16 are
// Scatterers; PowerSGD is not (its low-rank factors are not elementwise).
type Scatterer interface {
	Hook
	// Scatters reports that Launch and Finish honour Bucket.Scatter.
	Scatters() bool
}

// PoolUser is implemented by a hook that keeps state between steps in pool
// memory (PowerSGD's errors and Qs). The Reducer calls UsePool with its
// pool after Setup and before any Launch; the hook takes its state from
// that pool and returns it at Close.
type PoolUser interface {
	UsePool(p *allocator.Pool)
}

// Errors returned by hooks; test with errors.Is.
var (
	// ErrNotSetup: Launch or Finish was called before Setup, or after
	// Close.
	ErrNotSetup = errors.New("hooks: hook is not set up")
	// ErrShared: one Hook value was given two communicators. Each rank needs
	// its own hook value.
	ErrShared = errors.New("hooks: hook used by two communicators")
	// ErrScratch: a bucket's scratch is smaller than Scratch asked for.
	ErrScratch = errors.New("hooks: bucket scratch too small")
	// ErrDType: a bucket's dtype is one the hook does not reduce (Wire
	// returns 0 for it).
	ErrDType = errors.New("hooks: bucket dtype not reduced by this hook")
	// ErrUnknown: ByName was given a name it does not know.
	ErrUnknown = errors.New("hooks: unknown hook")
)

// constructors maps the built-in hooks' names, and the aliases ddpbench
// accepts, to their constructors.
var constructors = map[string]func() Hook{
	"avg":       Avg,
	"none":      Avg,
	"allreduce": AllReduce,
	"fp16":      FP16,
	"bf16":      BF16,
	"powersgd":  func() Hook { return PowerSGD(DefaultPowerSGDOptions()) },
}

// ByName returns a new hook of the given name: "avg" (or "none": no
// compression, the default), "allreduce", "fp16", "bf16" or "powersgd"
// (with PyTorch's defaults, DefaultPowerSGDOptions).
func ByName(name string) (Hook, error) {
	if f, ok := constructors[name]; ok {
		return f(), nil
	}
	return nil, fmt.Errorf("%w %q (want %s)", ErrUnknown, name, strings.Join(Names(), ", "))
}

// Names lists the names ByName accepts, sorted.
func Names() []string {
	out := make([]string, 0, len(constructors))
	for n := range constructors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// base is the state every built-in hook keeps: its communicator and
// kernels, bound once by Setup.
type base struct {
	name   string
	c      comm.Communicator
	k      comm.Kernels
	closed bool
}

func (b *base) setup(c comm.Communicator, k comm.Kernels) error {
	switch {
	case c == nil || k == nil:
		return fmt.Errorf("hooks: %s Setup with a nil communicator or kernels", b.name)
	case b.c != nil && b.c != c:
		return fmt.Errorf("%w: %s hook set up on rank %d, then given rank %d's communicator", ErrShared, b.name, b.c.Rank(), c.Rank())
	}
	b.c, b.k, b.closed = c, k, false
	return nil
}

// check validates a Launch or Finish call against the hook's setup; wire
// is the hook's Wire for the bucket's dtype.
func (b *base) check(op string, bk *Bucket, wire comm.DType, scratch int) error {
	switch {
	case b.c == nil || b.closed:
		return fmt.Errorf("%w: %s %s of bucket %d", ErrNotSetup, b.name, op, bk.Index)
	case wire == 0:
		return fmt.Errorf("%w: the %s hook does not reduce bucket %d (%s)", ErrDType, b.name, bk.Index, bk.Buf.DType)
	case bk.Scratch.Bytes() < scratch:
		return fmt.Errorf("%w: bucket %d of %d elements needs %d bytes of scratch, has %d", ErrScratch, bk.Index, bk.Buf.Count, scratch, bk.Scratch.Bytes())
	}
	return nil
}
