package ddp

import (
	"math"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
)

// Param describes one parameter whose gradient the Reducer averages.
type Param struct {
	Name  string
	Shape []int
	// DType is the gradient's element type: comm.Float32 (0 means
	// Float32), Float64, Float16 or BFloat16. Parameters of each dtype
	// are bucketed apart, and the hook reduces each bucket in its dtype
	// (see package hooks, "Dtypes"). Grad, SetGrad and AddGrad take
	// float32 gradients; GradBuffer gives every dtype.
	DType comm.DType
}

// Numel returns the number of elements of p (1 for a scalar), or -1 if a
// dimension is negative or the product does not fit in an int.
func (p Param) Numel() int {
	n := 1
	for _, d := range p.Shape {
		if d < 0 || d != 0 && n > math.MaxInt/d {
			return -1
		}
		n *= d
	}
	return n
}

// Defaults of Options.
const (
	DefaultBucketCap      = 25 << 20
	DefaultFirstBucketCap = 1 << 20
	DefaultTimeout        = comm.DefaultTimeout
	DefaultStallInterval  = comm.DefaultStallInterval
	DefaultDrainTimeout   = 30 * time.Second
)

// Options configures a Reducer. The zero value gives PyTorch DDP's
// bucket sizes (25 MiB, 1 MiB for the first), averaging with hooks.Avg,
// every bucket allowed in flight at once, host memory, and gradients as
// bucket views (PyTorch's gradient_as_bucket_view=True, which is not
// PyTorch's default).
type Options struct {
	// BucketCap and FirstBucketCap are byte limits of the buckets; 0 means
	// DefaultBucketCap and DefaultFirstBucketCap.
	BucketCap, FirstBucketCap int
	// Hook reduces each bucket; nil means hooks.Avg(), which averages
	// inside the backend's reduction pass. The Reducer owns the hook and
	// closes it. Each rank needs its own Hook value.
	Hook hooks.Hook
	// MaxInFlight bounds how many buckets may be on the wire at once: a
	// bucket launches only while fewer than MaxInFlight earlier buckets
	// are still being reduced. 0 means no bound (every bucket). Each
	// bucket that may be in flight has its own hook scratch.
	MaxInFlight int
	// Pool provides bucket and scratch memory; nil means a host pool owned
	// (and closed) by the Reducer, over the communicator's own host memory
	// where it has some (comm.HostSourcer: package mpi's shared memory,
	// which its all-reduces on one machine read and write in place), else
	// over allocator.HostSource. A pool of device memory (Pool.Host
	// false) needs device Kernels and a communicator that carries device
	// memory (comm.Caps.DeviceMemory).
	Pool *allocator.Pool
	// Kernels operate on the pool's memory (zeroing, copies, the hooks'
	// compression). nil means comm.HostKernels for a host pool, and the
	// communicator's own kernels (comm.KernelSource) for a device pool.
	Kernels comm.Kernels
	// CopyGrads keeps each gradient in its own Go slice, copied into the
	// bucket when marked ready and back once reduced. The default (false)
	// makes Grad(i) a view of the bucket memory itself: no copies. Host
	// pools only.
	CopyGrads bool
	// FindUnusedParameters makes Wait treat parameters never marked ready
	// in a synced step as unused: they are reduced with the gradient they
	// hold (zero unless accumulated in no-sync steps) and listed in
	// StepStats.Unused. Without it, such parameters make Wait fail with
	// ErrUnready.
	FindUnusedParameters bool
	// StaticGraph promises that the set of parameters that get no gradient
	// is the same in every synced step. The first synced step finds them as
	// FindUnusedParameters does; later steps mark them ready at Begin, so
	// their buckets need not wait for Wait.
	StaticGraph bool
	// NoZeroGrad skips zeroing the gradients (PyTorch's
	// zero_grad(set_to_none=True) instead of zero_grad()): see the package
	// documentation, "Zeroing".
	NoZeroGrad bool
	// KeepLayout disables the rebuild of buckets after the first synced
	// step: the initial layout stays.
	KeepLayout bool
	// Shard shards the optimizer's work and state across ranks (ZeRO
	// stage 1; package documentation, "Sharded optimizer state"): each
	// bucket is reduce-scattered instead of all-reduced, so a rank
	// receives the average of its own part of the bucket only (Owned),
	// steps those elements alone, and publishes them with Gather;
	// WaitGather then gives every rank every updated parameter.
	// ShardElements partitions each bucket by elements, for elementwise
	// optimizers; ShardParams by whole parameters. Shard implies
	// KeepLayout, since a rebuilt layout would move the ownership, and
	// with it the optimizer state, between ranks. It needs a hook that is
	// a hooks.Scatterer (not PowerSGD), a host pool and float32
	// parameters; with Join, a joined rank calls JoinEach.
	Shard ShardMode
	// Buffers are model state that is not a gradient but must be the same
	// on every rank, such as BatchNorm's running statistics (PyTorch's
	// broadcast_buffers): any dtype, the same on every rank. The Reducer
	// keeps them in pool memory of its own (Buffer(i)) and broadcasts them
	// from rank 0 in every synced step, overlapped with backward: the
	// broadcast is issued just before bucket 0's collective and complete
	// when Wait returns, so every rank ends the step with rank 0's values.
	// Forward updates them before the step's first Ready; nothing may
	// write or read them from then until Wait returns. No-sync steps leave
	// them as they are.
	Buffers []Param
	// Join enables uneven inputs: ranks may run out of batches at
	// different steps and call Join (see JoinMode). It costs one small
	// all-reduce per synced step, issued at Begin and hidden behind the
	// step; JoinOff (the zero value) costs nothing.
	Join JoinMode
	// Timeout bounds how long Wait waits for the step's collectives, and
	// how long New, the rebuild and BroadcastParameters wait for theirs;
	// 0 means DefaultTimeout. On expiry the step fails and the group is
	// aborted.
	Timeout time.Duration
	// StallInterval is how long Wait waits before reporting a stall (and
	// again after each further interval); 0 means DefaultStallInterval.
	// Timeout, StallInterval and OnStall make the comm.Watchdog that
	// watches Wait, as the backends' own waits are watched.
	StallInterval time.Duration
	// OnStall receives stall reports on the goroutine in Wait; nil logs
	// them with the log package. A report names the step and the bucket
	// waited for in Detail, and in Missing the ranks that have not joined
	// its collective (where the backend can tell, as inproc can; nil
	// where it cannot), or this rank alone when the bucket still waits
	// for this rank's own gradients (Detail names them).
	OnStall func(comm.Stall)
	// DrainTimeout is how long the Reducer waits, once it has aborted the
	// group (a failed step, Close during a step), for collectives still in
	// flight before it gives their memory up: that memory is then kept
	// out of the pool, on purpose and reported, until they complete, and
	// never reused while they may still write it. 0 means
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
}

// withDefaults returns o with its zero fields replaced by the defaults.
func (o Options) withDefaults() Options {
	if o.BucketCap == 0 {
		o.BucketCap = DefaultBucketCap
	}
	if o.FirstBucketCap == 0 {
		o.FirstBucketCap = DefaultFirstBucketCap
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.StallInterval <= 0 {
		o.StallInterval = DefaultStallInterval
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.Hook == nil {
		o.Hook = hooks.Avg()
	}
	if o.Shard != ShardOff {
		o.KeepLayout = true
	}
	return o
}
