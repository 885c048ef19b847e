package nccl

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// Defaults of Config.
const (
	DefaultTimeout       = comm.DefaultTimeout
	DefaultStallInterval = comm.DefaultStallInterval
	DefaultPollInterval  = 10 * time.Millisecond
	// AbortDrain bounds how long Abort and Close wait for the
	// communicator's stream to drain after ncclCommAbort, before they
	// give up on memory the stream may still write (see Comm.Abort).
	AbortDrain = 10 * time.Second
)

// Config describes one rank's communicator.
type Config struct {
	// Rank and Size: this rank and the number of ranks.
	Rank, Size int
	// Device is the CUDA device ordinal the rank uses.
	Device int
	// ID is the group's unique id, made by rank 0 with NewUniqueID and
	// given to every rank (Connect does that through a Store).
	ID UniqueID
	// Blocking makes a blocking communicator (ncclConfig_t.blocking = 1).
	// The default, non-blocking, lets initialisation and every enqueue be
	// bounded and aborted; a blocking communicator may block in NCCL for
	// as long as a peer is missing.
	Blocking bool
	// Timeout: an operation still incomplete this long after it was issued
	// aborts the communicator, failing every pending operation with
	// comm.ErrTimeout. It also bounds initialisation when the context
	// given to NewComm has no deadline. Zero means DefaultTimeout.
	Timeout time.Duration
	// StallInterval: an operation incomplete this long is reported to
	// OnStall, and again after every further interval. Zero means
	// DefaultStallInterval.
	StallInterval time.Duration
	// OnStall receives stall reports, on the watchdog goroutine; nil logs
	// them. NCCL cannot tell which ranks have not joined an operation, so
	// a report's Missing is nil; its Detail gives the count and dtype.
	// The schedule is comm.Watchdog's, as for every wait in ddpgo.
	OnStall func(comm.Stall)
	// PollInterval is how often the watchdog polls
	// ncclCommGetAsyncError and the deadlines. Zero means
	// DefaultPollInterval.
	PollInterval time.Duration
	// StagingLimit bounds the device memory used to stage host buffers
	// (see the package documentation). Zero means allocator.DefaultLimit.
	StagingLimit int64
}

func (c *Config) validate() error {
	switch {
	case c.Size < 1:
		return fmt.Errorf("%w: nccl: Config.Size %d, want at least 1", comm.ErrInvalid, c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("%w: nccl: Config.Rank %d not in [0, %d)", comm.ErrInvalid, c.Rank, c.Size)
	case c.Device < 0:
		return fmt.Errorf("%w: nccl: rank %d: Config.Device %d is negative", comm.ErrInvalid, c.Rank, c.Device)
	case c.Timeout < 0 || c.StallInterval < 0 || c.PollInterval < 0 || c.StagingLimit < 0:
		return fmt.Errorf("%w: nccl: rank %d: negative Timeout (%v), StallInterval (%v), PollInterval (%v) or StagingLimit (%d)",
			comm.ErrInvalid, c.Rank, c.Timeout, c.StallInterval, c.PollInterval, c.StagingLimit)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.StallInterval == 0 {
		c.StallInterval = DefaultStallInterval
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.StagingLimit == 0 {
		c.StagingLimit = allocator.DefaultLimit
	}
	return nil
}

// Store is what Connect needs of a rendezvous store: rendezvous.Store
// has it, and so can an MPI-backed exchange.
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// Connect makes rank cfg.Rank's communicator, exchanging the unique id
// through store under key: rank 0 creates it and sets it, the others get
// it (waiting for it). Every rank must use the same key, and a key only
// once per group. cfg.ID is ignored.
func (l *Library) Connect(ctx context.Context, store Store, key string, cfg Config) (*Comm, error) {
	if cfg.Rank == 0 {
		id, err := l.NewUniqueID()
		if err != nil {
			return nil, fmt.Errorf("nccl: rank 0: %w", err)
		}
		if err := store.Set(ctx, key, id[:]); err != nil {
			return nil, fmt.Errorf("nccl: rank 0: publishing the unique id under %q: %w", key, err)
		}
		cfg.ID = id
	} else {
		v, err := store.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("nccl: rank %d: waiting for rank 0's unique id under %q: %w", cfg.Rank, key, err)
		}
		if len(v) != len(cfg.ID) {
			return nil, fmt.Errorf("nccl: rank %d: the value under %q has %d bytes, an ncclUniqueId has %d", cfg.Rank, key, len(v), len(cfg.ID))
		}
		copy(cfg.ID[:], v)
	}
	return l.NewComm(ctx, cfg)
}

// NewComm makes rank cfg.Rank's communicator of the group cfg.ID
// (ncclCommInitRankConfig). It is collective: it returns once every rank
// has joined, or fails when ctx ends (or, without a deadline, after
// cfg.Timeout), aborting the half-made communicator.
func (l *Library) NewComm(ctx context.Context, cfg Config) (*Comm, error) {
	cs, err := l.NewComms(ctx, []Config{cfg})
	if err != nil {
		return nil, err
	}
	return cs[0], nil
}

// NewComms makes several ranks' communicators of one group from one
// goroutine, each on its own device, inside one ncclGroupStart/End as NCCL
// requires when one thread initialises several. Every Config must name
// the same ID and Size.
func (l *Library) NewComms(ctx context.Context, cfgs []Config) ([]*Comm, error) {
	if len(cfgs) == 0 {
		return nil, fmt.Errorf("%w: nccl: NewComms of no Config", comm.ErrInvalid)
	}
	ctxs := make([]uintptr, len(cfgs))
	ranks := make([]int, len(cfgs))
	devs := make([]*device, len(cfgs))
	for i := range cfgs {
		if err := cfgs[i].validate(); err != nil {
			return nil, err
		}
		if cfgs[i].ID != cfgs[0].ID || cfgs[i].Size != cfgs[0].Size || cfgs[i].Blocking != cfgs[0].Blocking {
			return nil, fmt.Errorf("%w: nccl: NewComms: Config %d differs from Config 0 in ID, Size or Blocking", comm.ErrInvalid, i)
		}
		d, err := l.device(cfgs[i].Device)
		if err != nil {
			return nil, fmt.Errorf("nccl: rank %d: %w", cfgs[i].Rank, err)
		}
		devs[i], ctxs[i], ranks[i] = d, d.ctx, cfgs[i].Rank
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfgs[0].Timeout)
		defer cancel()
	}
	// The initialising group's job is NCCL's per-thread state until
	// ncclCommGetAsyncError completes it (2.14-2.26): keep this goroutine
	// on one OS thread, and no other goroutine on it, until then.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	handles, res, failed, err := l.d.commInit(ctxs, cfgs[0].Size, cfgs[0].ID, ranks, cfgs[0].Blocking)
	abortAll := func() {
		for i, h := range handles {
			if h != 0 {
				l.d.abort(ctxs[i], h)
			}
		}
	}
	if err != nil {
		abortAll()
		r := cfgs[0].Rank
		if failed >= 0 {
			r = cfgs[failed].Rank
		}
		return nil, fmt.Errorf("nccl: rank %d of %d on device %d: %w", r, cfgs[0].Size, cfgs[max(failed, 0)].Device, err)
	}
	if res == ResultInProgress {
		for i, h := range handles {
			if err := l.awaitReady(ctx, h); err != nil {
				abortAll()
				return nil, fmt.Errorf("nccl: rank %d of %d on device %d: initialising: %w", cfgs[i].Rank, cfgs[i].Size, cfgs[i].Device, err)
			}
		}
	}
	cs := make([]*Comm, len(cfgs))
	for i := range cfgs {
		c, err := l.newComm(cfgs[i], devs[i], handles[i])
		if err != nil {
			for _, made := range cs[:i] {
				made.Close()
			}
			// newComm aborted its own; the rest are aborted here, each
			// with its device's context.
			for j := i + 1; j < len(handles); j++ {
				l.d.abort(devs[j].ctx, handles[j])
			}
			return nil, err
		}
		cs[i] = c
	}
	return cs, nil
}

// awaitReady polls ncclCommGetAsyncError until a non-blocking call on
// comm has finished, backing off from microseconds to a millisecond.
func (l *Library) awaitReady(ctx context.Context, h uintptr) error {
	delay := time.Microsecond
	for {
		st, err := l.d.asyncError(h)
		if err != nil {
			return err
		}
		switch st {
		case ResultSuccess:
			return nil
		case ResultInProgress:
		default:
			return &Error{Call: "ncclCommGetAsyncError", Result: st, Text: st.String(), Last: l.d.lastError(h)}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: still ncclInProgress: %w", comm.ErrTimeout, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, time.Millisecond)
	}
}

// Comm is one rank's NCCL communicator; it implements comm.Communicator,
// comm.Capable, comm.Grouper, comm.KernelSource and comm.DeviceOwner. See
// the package documentation for its model, and calls.go for how it calls
// NCCL.
type Comm struct {
	lib    *Library
	d      driver
	dev    *device
	ctx    uintptr
	handle uintptr
	stream uintptr
	cfg    Config
	rank   int
	size   int
	rules  backend.Rules // what every call is checked against

	// issueMu orders the issuing of operations: one caller at a time takes
	// a sequence number, stages and launches, so that sequence order is
	// launch order. It also guards the group state.
	issueMu sync.Mutex
	depth   int       // GroupStart nesting
	grouped []pending // issued inside the group, launched by GroupEnd

	// callMu is held for every call into NCCL for this communicator and
	// every call that puts work on its stream (calls.go). Fields below it
	// up to mu belong to its holder.
	callMu  callLock
	torn    bool // ncclCommAbort or ncclCommDestroy has been called
	orderEv uintptr
	one     [1]pending
	opsBuf  []cop
	postBuf []cop
	evBuf   []uintptr
	liveBuf []pending

	// ops is the ring of operations (package backend): their slots,
	// results, failure log and parked Waits. The issuer writes a slot and
	// publishes it holding mu; everything else reads slots holding mu.
	ops backend.Ring[slot]
	// wake tells the watchdog that a Wait has parked: it then polls the
	// events often until no Wait is parked (see ringHooks.Parking).
	wake chan struct{}

	mu       sync.Mutex
	done     uint64                // every operation <= done has completed (in order; completed under mu)
	stopping atomic.Pointer[error] // set by Abort or Close: every later operation fails with it
	abortReq error                 // an Abort or Close waiting for the call lock
	closed   bool
	// undrained: the stream did not drain after teardown, and may still
	// write the communicator's memory, which is quarantined (kept, never
	// reused or freed) until the stream is seen idle (streamIdle).
	undrained  bool
	leaked     int64         // bytes quarantined because the stream did not drain
	abortDrain time.Duration // AbortDrain; tests shorten it
	kernEv     uintptr
	scratch    unsafe.Pointer // device: the barrier's element and the overflow counter
	host       allocator.Region
	staging    *allocator.Pool // device memory for host buffers' data
	pinned     *allocator.Pool // pinned host memory for the copies

	kmu     sync.Mutex // the synchronous kernels, one at a time: they share kernEv and the host scratch
	kerrMu  sync.Mutex
	kernErr error // the first error of stream work, for Kernels().Sync

	regMu   sync.Mutex
	regs    map[uintptr]uintptr // registered slab address -> ncclCommRegister handle
	slabs   map[uintptr]slab    // Source's slabs by address
	regDone bool                // the communicator is gone: no more registrations

	// deferred counts the launches that answered ncclInProgress (NCCL
	// enqueued them from its own thread), for tests and diagnostics.
	deferred atomic.Uint64
	settling atomic.Int64 // nanoseconds spent settling them

	stop     chan struct{}
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	closeErr error
}

// slot is the state of one operation, in its ring slot: written by the
// issuer, read until the operation completes. Its event and the capacity
// of its staging lists stay for the slot's next operation.
type slot struct {
	seq      uint64
	event    uintptr
	kind     comm.Kind
	count    int
	dtype    comm.DType
	recorded bool // its event is on the stream
	err      error
	issued   time.Time
	stage    []allocator.Block // device memory staging host buffers
	pins     []allocator.Block // pinned host memory between them and the device
}

// pending is an operation issued but not yet launched: the copies that
// stage its host buffers in, its NCCL call, the copies that bring them
// back.
type pending struct {
	s         *slot
	pre, post []cop
	nccl      cop
}

func (l *Library) newComm(cfg Config, dev *device, h uintptr) (*Comm, error) {
	c := &Comm{lib: l, d: l.d, dev: dev, ctx: dev.ctx, handle: h, cfg: cfg, rank: cfg.Rank, size: cfg.Size,
		rules: backend.Rules{Rank: cfg.Rank, Size: cfg.Size, OneDevice: true, Device: cfg.Device},
		regs:  map[uintptr]uintptr{}, stop: make(chan struct{}), wake: make(chan struct{}, 1),
		callMu: newCallLock(), abortDrain: AbortDrain}
	c.ops.Init(backend.Config{Backend: "nccl", Rank: cfg.Rank, Spin: true, Hooks: (*ringHooks)(c)})
	n, r, dv, err := l.d.commInfo(h)
	if err == nil && (n != cfg.Size || r != cfg.Rank || dv != cfg.Device) {
		err = fmt.Errorf("nccl: the communicator reports rank %d of %d on device %d, want rank %d of %d on device %d", r, n, dv, cfg.Rank, cfg.Size, cfg.Device)
	}
	if err == nil {
		err = c.alloc()
	}
	if err != nil {
		c.release()
		l.d.abort(c.ctx, h)
		return nil, fmt.Errorf("nccl: rank %d of %d on device %d: %w", cfg.Rank, cfg.Size, cfg.Device, err)
	}
	c.wg.Add(1)
	go c.watchdog()
	return c, nil
}

// alloc makes the communicator's streams, events and scratch memory.
func (c *Comm) alloc() error {
	var err error
	if c.stream, err = c.d.streamCreate(c.ctx); err != nil {
		return err
	}
	if c.orderEv, err = c.d.eventCreate(c.ctx); err != nil {
		return err
	}
	if c.kernEv, err = c.d.eventCreate(c.ctx); err != nil {
		return err
	}
	if c.scratch, err = c.d.memAlloc(c.ctx, allocator.Alignment); err != nil {
		return err
	}
	if c.host, err = allocator.HostSource().Alloc(4096); err != nil {
		return err
	}
	c.staging, err = allocator.New(allocator.Options{Source: &stagingSource{c: c}, Limit: c.cfg.StagingLimit, SlabSize: 16 << 20})
	if err != nil {
		return err
	}
	c.pinned, err = allocator.New(allocator.Options{Source: &stagingSource{c: c, pinned: true}, Limit: c.cfg.StagingLimit, SlabSize: 16 << 20})
	if err != nil {
		return err
	}
	return nil
}

// release frees what alloc made, ignoring errors (the device may be
// broken by then).
func (c *Comm) release() {
	if c.staging != nil {
		c.staging.Close()
	}
	if c.pinned != nil {
		c.pinned.Close()
	}
	if c.host.Addr != nil {
		allocator.HostSource().Free(c.host)
	}
	if c.scratch != nil {
		c.d.memFree(c.ctx, c.scratch)
	}
	for i := range uint64(backend.RingSize) {
		if s := c.ops.Op(i); s.event != 0 {
			c.d.eventDestroy(c.ctx, s.event)
		}
	}
	for _, e := range []uintptr{c.orderEv, c.kernEv} {
		if e != 0 {
			c.d.eventDestroy(c.ctx, e)
		}
	}
	if c.stream != 0 {
		c.d.streamDestroy(c.ctx, c.stream)
	}
}

// Rank returns this rank's index.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.size }

// Device returns the CUDA device ordinal.
func (c *Comm) Device() int { return c.dev.ordinal }

// Capabilities: NCCL carries device memory, and host memory through
// staging; ncclAvg is a pre-multiplied sum (NCCL 2.10+). Half-precision
// sums round at every step of NCCL's algorithm, so HalfPrecision is false,
// and NCCL cannot see mismatched calls.
func (c *Comm) Capabilities() comm.Caps {
	return comm.Caps{Backend: "nccl", NativeAvg: true, DeviceMemory: true, HostMemory: true}
}

// Stream is a CUDA stream handle (CUstream) as an integer, as other cgo
// libraries hand them out.
type Stream uintptr

// Stream returns the communicator's stream, on which its collectives and
// kernels run in issue order. Put no work on it yourself (NCCL forbids it
// while it enqueues, which only the communicator knows): order your
// stream against it with WaitStream, WaitEvent and StreamWait.
func (c *Comm) Stream() Stream { return Stream(c.stream) }

// WaitStream makes the communicator's stream wait, without blocking the
// host, for all work issued so far on s: the collectives issued after it
// run only once, say, the kernel that wrote a gradient on s has (as
// PyTorch's reducer orders its NCCL stream after the autograd stream).
func (c *Comm) WaitStream(s Stream) error {
	c.lockCalls()
	defer c.unlockCalls()
	if err := c.stoppingErr(); err != nil {
		return fmt.Errorf("nccl: rank %d: WaitStream: %w", c.rank, err)
	}
	if err := c.d.waitOther(c.ctx, c.stream, uintptr(s), c.orderEv); err != nil {
		return fmt.Errorf("nccl: rank %d: WaitStream: %w", c.rank, err)
	}
	return nil
}

// Event is a CUDA event handle (CUevent) as an integer.
type Event uintptr

// WaitEvent makes the communicator's stream wait, without blocking the
// host, for event e as last recorded by the caller (cuStreamWaitEvent):
// the form for a caller that records its own event after the kernel that
// wrote a bucket, as PyTorch's reducer does.
func (c *Comm) WaitEvent(e Event) error {
	c.lockCalls()
	defer c.unlockCalls()
	if err := c.stoppingErr(); err != nil {
		return fmt.Errorf("nccl: rank %d: WaitEvent: %w", c.rank, err)
	}
	if err := c.d.streamWaitEvent(c.ctx, c.stream, uintptr(e)); err != nil {
		return fmt.Errorf("nccl: rank %d: WaitEvent: %w", c.rank, err)
	}
	return nil
}

// StreamWait makes stream s wait, without blocking the host, until the
// operation of w (a Work of this communicator) has completed on the
// device, so that a kernel issued on s afterwards reads its result. It
// returns w's error if w has already failed. For an operation on host
// buffers the result is in host memory only when w has completed; wait
// for w instead.
func (c *Comm) StreamWait(s Stream, w comm.Work) error {
	id := w.ID()
	if last := c.ops.Issued(); id > last || id == 0 {
		return fmt.Errorf("%w: nccl: rank %d: StreamWait for operation %d, which this communicator has not issued (last %d)", comm.ErrInvalid, c.rank, id, last)
	}
	c.mu.Lock()
	if id <= c.done {
		// Completed: its result is the ring's (Test needs mu itself).
		c.mu.Unlock()
		_, err := c.ops.Test(id)
		return err
	}
	defer c.mu.Unlock()
	if err := c.stoppingErr(); err != nil {
		return fmt.Errorf("nccl: rank %d: StreamWait: %w", c.rank, err)
	}
	// Not completed, so its slot is still its own.
	sl := c.ops.Op(id)
	if !sl.recorded {
		// Launched operations are on the stream when their launch returns;
		// only a group not yet ended is not.
		return fmt.Errorf("%w: nccl: rank %d: StreamWait for operation %d inside a group, before GroupEnd", comm.ErrInvalid, c.rank, id)
	}
	// A wait on the caller's stream, not the communicator's: it may go at
	// any time.
	if err := c.d.streamWaitEvent(c.ctx, uintptr(s), sl.event); err != nil {
		return fmt.Errorf("nccl: rank %d: StreamWait: %w", c.rank, err)
	}
	return nil
}

// opError wraps err with the operation's identity.
func (c *Comm) opError(sl *slot, err error) error {
	return &comm.OpError{Rank: c.rank, Seq: sl.seq, Kind: sl.kind, Count: sl.count, DType: sl.dtype, Err: err}
}
