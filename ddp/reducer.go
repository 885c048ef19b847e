package ddp

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bucket"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
)

// step states
const (
	idle int32 = iota
	syncing
	local // no-sync step
)

// Reducer averages gradients across the ranks of a communicator, bucket by
// bucket, overlapping communication with the rest of backward. See the
// package documentation for the step protocol.
type Reducer struct {
	c       comm.Communicator
	params  []Param
	tensors []bucket.Tensor
	o       Options
	pool    *allocator.Pool
	ownPool bool
	kern    comm.Kernels
	host    bool // the pool's memory is addressable from Go
	dev     int  // device memory's ordinal (comm.DeviceOf), in its Buffers
	hook    hooks.Hook

	lay     atomic.Pointer[layout] // current layout (read by the communication goroutines)
	next    []bucket.Bucket        // layout to adopt at the next Begin
	copies  []comm.Buffer          // CopyGrads: per-parameter gradients in Go memory
	byName  map[string]int         // parameter name -> index; -1 for a name shared by several
	layGen  uint64                 // layouts adopted so far (Generation)
	rebuilt bool                   // the rebuild (or the decision not to) is done
	retired *layout                // the layout Begin replaced, until the step ends (canary.go)
	held    []bool                 // the retired layout's parameters that were handed out

	state    atomic.Int32
	prevSync bool // the last step was synced (or there was none): Begin zeroes
	stepNo   uint64
	start    time.Time
	order    []atomic.Int32 // ready order of the current step
	nready   atomic.Int32
	isUnused []bool // marked by the Reducer (unused) in this step
	// Lazy zeroing: see zero.go.
	gen      atomic.Uint32
	fresh    []atomic.Uint32
	out      []atomic.Bool // handed out by Grad or GradBuffer: Begin zeroes it (zero.go)
	static   []bool        // StaticGraph: unused in the first synced step
	staticOK bool          // static set known
	reduced  atomic.Int32
	// Options.Shard (shard.go): the step's buckets all-gathered so far,
	// and whether its reduction is over and WaitGather awaited.
	gathered  atomic.Int32
	gathering atomic.Bool

	cur, last *StepStats
	statsBuf  [2]StepStats

	// The communication goroutines (pipeline.go).
	pipeline
	dog comm.Watchdog // watches Wait

	mu        sync.Mutex
	err       error
	failed    atomic.Bool
	closed    atomic.Bool
	inCall    atomic.Int32  // the blocking call in progress (calls.go)
	left      chan struct{} // leave tells Close the call has returned
	closeOnce sync.Once
	closeErr  error

	bufs    bufferSet // Options.Buffers
	bufRoot int       // the rank the buffers are broadcast from in this step
	join    joinState // Options.Join

	reap reaper // memory held back from collectives that did not complete
}

// New builds a rank's Reducer. It is collective: every rank of c must call
// it with the same parameters (count, shapes and dtypes) and options that
// agree on the bucket caps and the hook kind. It checks the parameters
// across ranks and fails with ErrParamMismatch naming the first parameter
// and rank that differ. A rank that cannot build its Reducer (a parameter
// it does not support, bad options, no memory) still takes part in the
// check, so that every rank fails together instead of waiting for it.
func New(ctx context.Context, c comm.Communicator, params []Param, o Options) (*Reducer, error) {
	if c == nil {
		return nil, fmt.Errorf("ddp: nil communicator")
	}
	o = o.withDefaults()
	r := &Reducer{c: c, o: o, hook: o.Hook, prevSync: true, left: make(chan struct{}, 1)}
	r.dog = comm.Watchdog{StallInterval: o.StallInterval, Timeout: o.Timeout, OnStall: o.OnStall}
	r.reap.r = r
	fatal, local := r.memory(params)
	if fatal != nil {
		// Without memory this rank cannot even take part in the check:
		// abort, so that the peers fail instead of waiting for it.
		err := fmt.Errorf("ddp: rank %d: %w", c.Rank(), fatal)
		c.Abort(err)
		r.release()
		return nil, err
	}
	if local == nil {
		local = r.prepare(params)
	}
	cctx, cancel, explain := bounded(ctx, o.Timeout)
	exchange, err := r.checkParams(cctx, failureOf(local))
	err = explain(err)
	cancel()
	if exchange && local == nil {
		// The check's collective failed here (a cancelled context, a
		// timeout) but may have completed on the peers, which would go on
		// to wait for this rank's buckets: abort the group, as a failed
		// step does. A verdict (a mismatch, a peer that could not build
		// its Reducer) is every rank's alike, and the group stays usable.
		c.Abort(err)
	}
	if err != nil || local != nil {
		r.release()
		if local != nil {
			return nil, local
		}
		return nil, err
	}
	r.start = time.Now()
	r.startWorkers()
	return r, nil
}

// memory chooses the pool and the kernels. A fatal error leaves the rank
// unable to stage even the cross-rank check; a local one is this rank's
// mistake, which the check tells the peers of.
func (r *Reducer) memory(params []Param) (fatal, local error) {
	o := &r.o
	r.pool = o.Pool
	if r.pool == nil {
		// Room for the gradients, the hooks' scratch and the old layout
		// during a rebuild. Sizes that overflow are prepare's to report.
		total := int64(0)
		for _, p := range params {
			size := int64(4)
			if p.DType != 0 && p.DType.Size() != 0 {
				size = int64(p.DType.Size())
			}
			if n := p.Numel(); n >= 0 && int64(n) <= (math.MaxInt64/8-total)/size {
				total += int64(n) * size
			}
		}
		limit := max(allocator.DefaultLimit, 3*total+64<<20)
		// The communicator's own host memory where it has one (package
		// mpi: memory the ranks of one machine reduce in place).
		var err error
		if r.pool, err = allocator.New(allocator.Options{Source: comm.HostSourceOf(r.c), Limit: limit, Retire: true}); err != nil {
			return fmt.Errorf("creating the pool: %w", err), nil
		}
		r.ownPool = true
	}
	r.host = r.pool.Host()
	if !r.host {
		r.dev = comm.DeviceOf(r.c)
	}
	r.kern = o.Kernels
	if r.kern == nil {
		if r.host {
			r.kern = comm.HostKernels()
		} else if ks, ok := r.c.(comm.KernelSource); ok {
			r.kern = ks.Kernels()
		}
	}
	caps := comm.CapsOf(r.c)
	rank := r.c.Rank()
	var bad error
	switch {
	case r.kern == nil:
		bad = fmt.Errorf("%w: rank %d: Options.Pool holds device memory and neither Options.Kernels nor the communicator (%q) provides kernels for it", ErrOptions, rank, caps.Backend)
	case r.kern.Location() != location(r.host):
		bad = fmt.Errorf("%w: rank %d: Options.Kernels work on %v memory, the pool holds %v memory", ErrOptions, rank, r.kern.Location(), location(r.host))
	case !r.host && !caps.DeviceMemory:
		bad = fmt.Errorf("%w: rank %d: Options.Pool holds device memory, which the communicator (%q) does not carry", ErrOptions, rank, caps.Backend)
	case r.host && !caps.HostMemory:
		return nil, fmt.Errorf("%w: rank %d: the communicator (%q) carries device memory only; give the Reducer a device pool (Options.Pool) and its kernels", ErrOptions, rank, caps.Backend)
	case !r.host && o.CopyGrads:
		return nil, fmt.Errorf("%w: rank %d: CopyGrads keeps gradients in Go memory; it needs a host pool", ErrOptions, rank)
	}
	if bad == nil {
		return nil, nil
	}
	// This memory cannot stage the cross-rank check. Stage it in a host
	// pool of the Reducer's own, where the communicator carries host
	// memory, so that the peers learn of this rank's mistake from the
	// check; otherwise the mistake is fatal.
	if !caps.HostMemory {
		return bad, nil
	}
	pool, err := allocator.New(allocator.Options{Retire: true})
	if err != nil {
		return fmt.Errorf("%w (and creating a host pool to tell the peers failed: %w)", bad, err), nil
	}
	if r.ownPool {
		r.pool.Close()
	}
	r.pool, r.ownPool, r.host, r.dev, r.kern = pool, true, true, 0, comm.HostKernels()
	return nil, bad
}

func location(host bool) comm.Location {
	if host {
		return comm.Host
	}
	return comm.Device
}

// prepare checks the parameters and options of one rank and builds its
// initial layout. Its error is this rank's alone; New still runs the
// cross-rank check with it, so that the peers learn of it.
func (r *Reducer) prepare(params []Param) error {
	o := &r.o
	r.params = make([]Param, len(params))
	r.tensors = make([]bucket.Tensor, len(params))
	if len(params) == 0 {
		return fmt.Errorf("%w: rank %d: no parameters", ErrUnsupported, r.c.Rank())
	}
	if o.BucketCap < 0 || o.FirstBucketCap < 0 || o.MaxInFlight < 0 {
		return fmt.Errorf("%w: rank %d: bucket caps %d (first) and %d, MaxInFlight %d: want positive byte counts and a non-negative window",
			ErrOptions, r.c.Rank(), o.FirstBucketCap, o.BucketCap, o.MaxInFlight)
	}
	total := 0
	for i, p := range params {
		if p.DType == 0 {
			p.DType = comm.Float32
		}
		p.Shape = append([]int(nil), p.Shape...)
		r.params[i] = p
		if !p.DType.IsFloat() {
			return fmt.Errorf("%w: rank %d: parameter %d (%q) is %s; gradients are float32, float64, half or bfloat16", ErrUnsupported, r.c.Rank(), i, p.Name, p.DType)
		}
		if r.hook.Wire(p.DType) == 0 {
			return fmt.Errorf("%w: rank %d: parameter %d (%q) is %s, which hook %s does not reduce (see package hooks, \"Dtypes\")", ErrUnsupported, r.c.Rank(), i, p.Name, p.DType, r.hook.Name())
		}
		n, size := p.Numel(), p.DType.Size()
		if n < 0 || n > (math.MaxInt-total)/size {
			return fmt.Errorf("%w: rank %d: parameter %d (%q) has shape %v: a negative dimension, or more bytes than an int holds", ErrUnsupported, r.c.Rank(), i, p.Name, p.Shape)
		}
		r.tensors[i] = bucket.Tensor{Numel: n, DType: p.DType}
		total += n * size
	}
	if err := r.checkShard(); err != nil {
		return err
	}

	// Initial layout: buckets over the parameters in reverse registration
	// order, since backward produces the last layers' gradients first.
	rev := make([]int, len(params))
	for i := range rev {
		rev[i] = len(params) - 1 - i
	}
	bs, err := bucket.Assign(r.tensors, []int{o.FirstBucketCap, o.BucketCap}, rev)
	if err != nil {
		return fmt.Errorf("ddp: rank %d: assigning buckets: %w", r.c.Rank(), err)
	}
	if o.CopyGrads {
		r.copies = make([]comm.Buffer, len(params))
		for i, t := range r.tensors {
			// float64 words keep every dtype's elements aligned.
			mem := make([]float64, (t.Bytes()+7)/8)
			r.copies[i] = comm.HostBuffer(unsafe.Pointer(unsafe.SliceData(mem)), t.Numel, t.DType)
		}
	}
	r.byName = make(map[string]int, len(params))
	for i, p := range r.params {
		if _, dup := r.byName[p.Name]; dup {
			r.byName[p.Name] = -1
		} else {
			r.byName[p.Name] = i
		}
	}
	n := len(params)
	r.order = make([]atomic.Int32, n)
	r.isUnused = make([]bool, n)
	r.fresh = make([]atomic.Uint32, n)
	r.out = make([]atomic.Bool, n)
	r.static = make([]bool, n)
	for i := range r.statsBuf {
		s := &r.statsBuf[i]
		s.Buckets = make([]BucketStats, 0, n)
		s.ParamReady = make([]time.Duration, n)
		s.Unused = make([]int, 0, n)
	}
	r.cur, r.last = &r.statsBuf[0], &r.statsBuf[1]
	r.last.Buckets = r.last.Buckets[:0]
	r.last.ParamReady = r.last.ParamReady[:0]
	r.window = o.MaxInFlight
	if r.window == 0 {
		r.window = n // a bucket holds at least one parameter
	}
	if err := r.hook.Setup(r.c, r.kern); err != nil {
		return fmt.Errorf("ddp: rank %d: setting up hook %s: %w", r.c.Rank(), r.hook.Name(), err)
	}
	if u, ok := r.hook.(hooks.PoolUser); ok {
		u.UsePool(r.pool)
	}
	if err := r.checkKernels(); err != nil {
		return err
	}
	if err := r.adopt(bs); err != nil {
		return fmt.Errorf("ddp: rank %d: %w", r.c.Rank(), err)
	}
	if err := r.prepareBuffers(o.Buffers); err != nil {
		return err
	}
	return r.prepareJoin()
}

// checkKernels refuses a parameter whose reduction needs a kernel that
// r.kern does not do for its dtype (comm.Supports): the hook's operations
// (hooks.KernelUser) and JoinActive's rescaling. A device's kernels would
// otherwise panic on the launcher goroutine, or fail where only Sync,
// which the Reducer never calls, would tell. The first parameter of each
// dtype is named.
func (r *Reducer) checkKernels() error {
	where := "host"
	if !r.host {
		where = "device"
	}
	seen := map[comm.DType]bool{}
	for i, p := range r.params {
		if seen[p.DType] {
			continue
		}
		seen[p.DType] = true
		type use struct {
			hooks.KernelUse
			by string
		}
		var uses []use
		if u, ok := r.hook.(hooks.KernelUser); ok {
			for _, k := range u.KernelOps(p.DType) {
				uses = append(uses, use{k, "hook " + r.hook.Name()})
			}
		}
		if r.o.Join == JoinActive && !(p.DType == comm.Float64 && r.host) {
			uses = append(uses, use{hooks.KernelUse{Op: comm.OpScale, DType: p.DType}, "JoinActive's rescaling"})
		}
		for _, u := range uses {
			if !comm.Supports(r.kern, u.Op, u.DType) {
				return fmt.Errorf("%w: rank %d: parameter %d (%q) is %s: %s needs %s of %s, which the %s kernels (backend %q) do not do; keep its gradient in float32, or reduce it without that kernel",
					ErrUnsupported, r.c.Rank(), i, p.Name, p.DType, u.by, u.Op, u.DType, where, comm.CapsOf(r.c).Backend)
			}
		}
	}
	return nil
}

// Rank returns the rank of the Reducer's communicator.
func (r *Reducer) Rank() int { return r.c.Rank() }

// Params returns the parameters the Reducer was built with (do not modify).
func (r *Reducer) Params() []Param { return r.params }

// Index returns the index of the parameter named name. It fails with
// ErrIndex if no parameter has that name, or if several do (naming two of
// them), since either answer could then be the wrong gradient.
func (r *Reducer) Index(name string) (int, error) {
	i, ok := r.byName[name]
	switch {
	case !ok:
		return -1, fmt.Errorf("%w: rank %d: no parameter is named %q", ErrIndex, r.c.Rank(), name)
	case i < 0:
		first := -1
		for j, p := range r.params {
			if p.Name != name {
				continue
			}
			if first >= 0 {
				return -1, fmt.Errorf("%w: rank %d: parameters %d and %d are both named %q", ErrIndex, r.c.Rank(), first, j, name)
			}
			first = j
		}
		return -1, fmt.Errorf("%w: rank %d: several parameters are named %q", ErrIndex, r.c.Rank(), name)
	}
	return i, nil
}

// Generation returns the number of bucket layouts the Reducer has adopted:
// 1 after New, 2 once the Begin of the second synced step has adopted the
// layout rebuilt from the first (unless Options.KeepLayout, or the rebuilt
// layout is the initial one). It changes only in Begin. Every slice or
// Buffer that Grad and GradBuffer returned before the change refers to
// memory that no longer holds a gradient (a write through it fails the
// next Ready with ErrStaleGrad): a model that keeps them fetches them
// again when Generation changes.
func (r *Reducer) Generation() uint64 { return r.layGen }

// Close stops the communication goroutines, closes the hook and returns the
// bucket memory to the pool (closing the pool if the Reducer made it). A
// synced step still running is abandoned and the group aborted; memory
// that a collective still in flight may write is returned only once that
// collective has completed (see Options.DrainTimeout), and Close then
// returns an error wrapping ErrInFlight. It does not close the
// communicator. Close is idempotent.
//
// Close may be called from another goroutine to end a Wait, WaitEach,
// Join or Broadcast blocked there: it aborts the group, so that call
// returns ErrClosed (or the abort), and Close returns only once that call
// has (waiting at most Options.DrainTimeout), so no memory the call uses
// goes back to the pool under it. A WaitEach callback must therefore not
// call Close: Close would wait out DrainTimeout for the WaitEach it runs in.
//
// Gradient slices and Buffers handed out before Close must not be used
// after it: see Grad for what a late use does with each kind of memory.
func (r *Reducer) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		call := r.inCall.Load()
		if !r.failed.Load() {
			switch {
			case r.state.Load() == syncing:
				r.fail(fmt.Errorf("%w: rank %d closed during step %d", ErrClosed, r.c.Rank(), r.stepNo))
			case call != callNone:
				r.fail(fmt.Errorf("%w: rank %d closed during %s, after step %d", ErrClosed, r.c.Rank(), callNames[call], r.stepNo))
			}
		}
		r.awaitCall()
		r.stopWorkers()
		r.closeErr = r.release()
	})
	return r.closeErr
}

// release returns the Reducer's memory: at once if no collective may still
// write it, otherwise once they have completed (see settle).
func (r *Reducer) release() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	keep(r.hook.Close())
	var blocks []allocator.Block
	if L := r.lay.Load(); L != nil {
		blocks = L.take()
	}
	if r.retired != nil {
		blocks = append(blocks, r.retired.take()...)
		r.retired = nil
	}
	blocks = append(blocks, r.bufs.blocks...)
	r.bufs.blocks = nil
	keep(r.settle(r.pendingWorks(), blocks, "bucket collectives in flight"))
	if r.ownPool && r.pool != nil {
		keep(r.reap.closePool())
	}
	return first
}

// Buckets describes the current bucket layout.
func (r *Reducer) Buckets() []BucketInfo {
	L := r.lay.Load()
	out := make([]BucketInfo, len(L.buckets))
	for k, b := range L.buckets {
		out[k] = BucketInfo{Index: k, Params: append([]int(nil), b.Tensors...), Bytes: b.Bytes, Limit: b.Limit}
	}
	return out
}

// BucketInfo describes one bucket of the current layout.
type BucketInfo struct {
	Index  int
	Params []int // parameter indices, in their order inside the bucket
	Bytes  int   // gradient bytes
	Limit  int   // byte limit the bucket was built under
}
