package ddp

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bucket"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
)

// Param describes one parameter whose gradient the Reducer averages.
type Param struct {
	Name  string
	Shape []int
	DType comm.DType // 0 means Float32, the only dtype reduced today
}

// Numel returns the number of elements of p (1 for a scalar).
func (p Param) Numel() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// Defaults of Options.
const (
	DefaultBucketCap      = 25 << 20
	DefaultFirstBucketCap = 1 << 20
	DefaultTimeout        = 10 * time.Minute
	DefaultStallInterval  = 60 * time.Second
)

// Options configures a Reducer. The zero value gives PyTorch DDP's
// bucket sizes (25 MiB, 1 MiB for the first), averaging with hooks.Avg,
// and gradients as bucket views (PyTorch's gradient_as_bucket_view=True,
// which is not PyTorch's default).
type Options struct {
	// BucketCap and FirstBucketCap are byte limits of the buckets; 0 means
	// DefaultBucketCap and DefaultFirstBucketCap.
	BucketCap, FirstBucketCap int
	// Hook reduces each bucket; nil means hooks.Avg(), which averages
	// inside the backend's reduction pass. The Reducer owns the hook and
	// closes it. Each rank needs its own Hook value.
	Hook hooks.Hook
	// Pool provides bucket and scratch memory; nil means a pool owned (and
	// closed) by the Reducer.
	Pool *allocator.Pool
	// CopyGrads keeps each gradient in its own Go slice, copied into the
	// bucket when marked ready and back once reduced. The default (false)
	// makes Grad(i) a view of the bucket memory itself: no copies.
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
	// zero_grad(set_to_none=True) instead of zero_grad()): after a synced
	// step every gradient still holds the last average, so the first
	// step of each accumulation window must overwrite (=) every gradient it
	// marks ready, or use SetGrad or AddGrad (which know); later no-sync
	// steps add (+=) as usual.
	// It saves the zeroing Grad does the first time it hands out a
	// gradient in a window (one pass over each gradient written, close
	// to where the caller writes it, not a pass at Begin). A parameter
	// the Reducer marks unused (FindUnusedParameters, StaticGraph) that the
	// caller has not marked since the last synced step is zeroed before it
	// is reduced, so a stale average is never reduced again. Without
	// CopyGrads, the Begin that adopts a rebuilt layout (the second synced
	// step) hands out fresh, zeroed bucket memory.
	NoZeroGrad bool
	// KeepLayout disables the rebuild of buckets after the first synced
	// step: the initial layout stays.
	KeepLayout bool
	// Timeout bounds how long Wait waits for the step's collectives; 0
	// means DefaultTimeout. On expiry the step fails and the group is
	// aborted.
	Timeout time.Duration
	// StallInterval is how long Wait waits before reporting a stall (and
	// again after each further interval); 0 means DefaultStallInterval.
	StallInterval time.Duration
	// OnStall receives stall reports; nil logs them with the log package.
	OnStall func(Stall)
}

// Stall reports a step that has waited StallInterval (or a multiple) for a
// bucket.
type Stall struct {
	Rank    int
	Step    uint64
	Waited  time.Duration
	Bucket  int      // the oldest bucket not yet reduced
	OnWire  bool     // its collective is issued; a peer is behind or stuck
	Missing []string // parameters of the bucket not marked ready (when !OnWire)
}

func (s Stall) String() string {
	if s.OnWire {
		return fmt.Sprintf("ddp: rank %d step %d: bucket %d still being reduced after %v (a peer has not joined the collective)", s.Rank, s.Step, s.Bucket, s.Waited)
	}
	return fmt.Sprintf("ddp: rank %d step %d: bucket %d waiting %v for gradients of %v", s.Rank, s.Step, s.Bucket, s.Waited, s.Missing)
}

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
	hook    hooks.Hook

	lay     atomic.Pointer[layout] // current layout (read by the comm goroutine)
	next    []bucket.Bucket        // layout to adopt at the next Begin
	copies  [][]float32            // CopyGrads: per-parameter gradients
	rebuilt bool                   // the rebuild (or the decision not to) is done

	state    atomic.Int32
	prevSync bool // the last step was synced (or there was none): Begin zeroes
	stepNo   uint64
	start    time.Time
	order    []atomic.Int32 // ready order of the current step
	nready   atomic.Int32
	isUnused []bool // marked by the Reducer (unused) in this step
	// Lazy zeroing. gen is the zeroing generation: every Begin after a
	// synced step increments it, which makes every gradient stale at
	// once. fresh[i] == gen says parameter i's gradient holds this
	// accumulation window's value; otherwise it still holds the last
	// synced step's average and reads, logically, as zero (as the last
	// average with NoZeroGrad). Grad zeroes a stale gradient as it hands
	// it out, SetGrad and AddGrad overwrite it, and the communication
	// goroutine zeroes those of a complete bucket that are still stale
	// just before reducing it. The words are atomic because the
	// communication goroutine reads and writes them; each parameter's
	// word is touched by one goroutine at a time (its owner until Ready,
	// the communication goroutine after). A synced step leaves every
	// parameter fresh, so only gen and gen-1 ever meet: the counter may
	// wrap.
	gen      atomic.Uint32
	fresh    []atomic.Uint32
	static   []bool // StaticGraph: unused in the first synced step
	staticOK bool   // static set known
	reduced  atomic.Int32

	cur, last *StepStats
	statsBuf  [2]StepStats

	poke   chan struct{}
	done   chan struct{}
	quit   chan struct{}
	exited chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	timer  *time.Timer

	mu        sync.Mutex
	err       error
	failed    atomic.Bool
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
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
	if o.Hook == nil {
		o.Hook = hooks.Avg()
	}
	r := &Reducer{c: c, o: o, hook: o.Hook, prevSync: true}
	local := r.prepare(params)
	cctx, cancel, explain := bounded(ctx, o.Timeout)
	err := explain(checkParams(cctx, c, r.params, &o, local != nil))
	cancel()
	if err != nil && local == nil && !errors.Is(err, ErrParamMismatch) {
		// The check's collective failed here (a cancelled context, a
		// timeout) but may have completed on the peers, which would go on
		// to wait for this rank's buckets: abort the group, as a failed
		// step does.
		c.Abort(err)
	}
	if err != nil || local != nil {
		r.release()
		if local != nil {
			return nil, local
		}
		return nil, err
	}
	r.poke = make(chan struct{}, 1)
	r.done = make(chan struct{}, 1)
	r.quit = make(chan struct{})
	r.exited = make(chan struct{})
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	go r.loop()
	return r, nil
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
	if o.BucketCap < 0 || o.FirstBucketCap < 0 {
		return fmt.Errorf("%w: rank %d: bucket caps %d (first) and %d: want positive byte counts", ErrOptions, r.c.Rank(), o.FirstBucketCap, o.BucketCap)
	}
	total := 0
	for i, p := range params {
		if p.DType == 0 {
			p.DType = comm.Float32
		}
		p.Shape = append([]int(nil), p.Shape...)
		r.params[i] = p
		if p.DType != comm.Float32 {
			return fmt.Errorf("%w: rank %d: parameter %d (%q) is %s; only float gradients (float32) are reduced", ErrUnsupported, r.c.Rank(), i, p.Name, p.DType)
		}
		for _, d := range p.Shape {
			if d < 0 {
				return fmt.Errorf("%w: rank %d: parameter %d (%q) has shape %v", ErrUnsupported, r.c.Rank(), i, p.Name, p.Shape)
			}
		}
		r.tensors[i] = bucket.Tensor{Numel: p.Numel(), DType: p.DType}
		total += p.Numel() * 4
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

	r.pool = o.Pool
	if r.pool != nil && !r.pool.Host() {
		// The Reducer zeroes, copies and hands out gradients as Go slices;
		// device memory needs a device backend, which this release lacks.
		return fmt.Errorf("%w: rank %d: Options.Pool holds device memory; the Reducer needs a host pool", ErrOptions, r.c.Rank())
	}
	if r.pool == nil {
		limit := max(allocator.DefaultLimit, 3*int64(total)+64<<20)
		if r.pool, err = allocator.New(allocator.Options{Limit: limit}); err != nil {
			return fmt.Errorf("ddp: rank %d: creating the pool: %w", r.c.Rank(), err)
		}
		r.ownPool = true
	}
	if o.CopyGrads {
		r.copies = make([][]float32, len(params))
		for i := range params {
			r.copies[i] = make([]float32, r.tensors[i].Numel)
		}
	}
	n := len(params)
	r.order = make([]atomic.Int32, n)
	r.isUnused = make([]bool, n)
	r.fresh = make([]atomic.Uint32, n)
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
	if err := r.adopt(bs); err != nil {
		return fmt.Errorf("ddp: rank %d: %w", r.c.Rank(), err)
	}
	return nil
}

// Rank returns the rank of the Reducer's communicator.
func (r *Reducer) Rank() int { return r.c.Rank() }

// Params returns the parameters the Reducer was built with (do not modify).
func (r *Reducer) Params() []Param { return r.params }

// Begin starts a step. With sync, the step's gradients are averaged across
// ranks once marked ready, and Wait must be called before the next Begin.
// Without sync (PyTorch's no_sync), nothing is communicated: gradients
// accumulate locally, and the next synced step reduces the accumulated sum;
// Wait is optional.
//
// Begin zeroes every gradient unless the previous step was a no-sync step
// (so a no-sync step followed by a synced one accumulates) or
// Options.NoZeroGrad is set, adopts a rebuilt bucket layout if one is
// pending, and invalidates every slice Grad returned before it. The
// zeroing is lazy: Begin marks every gradient stale in O(1), and each is
// zeroed when first handed out by Grad, overwritten by SetGrad or AddGrad,
// or, if marked ready untouched, zeroed on the communication goroutine
// just before its bucket is reduced. A caller sees no difference: every
// gradient reads as zero the first time it looks.
func (r *Reducer) Begin(sync bool) error {
	if err := r.usable(); err != nil {
		return err
	}
	switch r.state.Load() {
	case syncing:
		return fmt.Errorf("%w: rank %d: Begin(%v) while synced step %d is running: call Wait first", ErrStepInProgress, r.c.Rank(), sync, r.stepNo)
	case local:
		r.finish()
	}
	if r.next != nil {
		bs := r.next
		r.next = nil
		if err := r.adopt(bs); err != nil {
			return r.fail(fmt.Errorf("ddp: rank %d: adopting the rebuilt layout at step %d: %w", r.c.Rank(), r.stepNo+1, err))
		}
	}
	L := r.lay.Load()
	z0 := time.Now()
	if r.prevSync {
		// zero_grad, lazily: every gradient becomes stale in O(1).
		r.gen.Add(1)
	}
	r.stepNo++
	L.sched.reset()
	r.nready.Store(0)
	r.reduced.Store(0)
	clear(r.isUnused)
	s := r.cur
	s.reset(r.stepNo, sync, len(r.params))
	s.Zero = time.Since(z0)
	s.Buckets = s.Buckets[:len(L.buckets)]
	for k := range s.Buckets {
		s.Buckets[k] = BucketStats{Index: k, Params: len(L.buckets[k].Tensors), Bytes: int64(L.buckets[k].Bytes)}
	}
	r.start = time.Now()
	s.Start = r.start
	for k := range L.hb {
		L.hb[k].Start = r.start
	}
	r.prevSync = sync
	if sync {
		r.state.Store(syncing)
		if r.staticOK {
			for i, u := range r.static {
				if u {
					r.markUnused(L, i)
				}
			}
		}
	} else {
		r.state.Store(local)
	}
	return nil
}

// Grad returns parameter i's gradient: by default a view of its slot in the
// bucket memory (with CopyGrads, a Go slice of its own). Write or add the
// gradient into it, then call Ready(i). After a synced step's Wait it holds
// the average over ranks. The slice is valid until the next Begin; keep no
// slice across steps. Grad panics if i is out of range, like indexing a
// slice, and returns nil after Close.
//
// The first Grad(i) of an accumulation window zeroes the gradient (unless
// Options.NoZeroGrad): Begin only marks the gradients stale, so the cost
// of zeroing is paid here, parameter by parameter, just before the caller
// writes into the same memory. Grad(i) may run concurrently with Grad and
// Ready of other parameters; it must not be called for a parameter
// already marked ready in a synced step until Wait returns.
func (r *Reducer) Grad(i int) []float32 {
	if r.closed.Load() {
		return nil
	}
	g := r.grad(i)
	if !r.o.NoZeroGrad {
		if gen := r.gen.Load(); r.fresh[i].Load() != gen {
			clear(g)
			r.fresh[i].Store(gen)
		}
	}
	return g
}

// grad returns parameter i's gradient memory as it is, stale or not.
func (r *Reducer) grad(i int) []float32 {
	if r.copies != nil {
		return r.copies[i]
	}
	return r.lay.Load().views[i]
}

// isStale reports whether parameter i's gradient still holds the last
// synced step's average (see Reducer.gen).
func (r *Reducer) isStale(i int) bool { return r.fresh[i].Load() != r.gen.Load() }

// Ready marks parameter i's gradient as complete for this step. It may be
// called from any goroutine, in any order, and never waits for the
// network: when i completes a bucket and every earlier bucket has launched,
// the bucket's reduction starts on the rank's communication goroutine.
// Marking a parameter twice in a step, an index out of range, or Ready
// outside a step are errors naming the parameter. Every Ready of a step
// must return before Wait is called.
func (r *Reducer) Ready(i int) error {
	if i < 0 || i >= len(r.params) {
		return fmt.Errorf("%w: rank %d: Ready(%d): the reducer has %d parameters", ErrIndex, r.c.Rank(), i, len(r.params))
	}
	if err := r.usable(); err != nil {
		return err
	}
	st := r.state.Load()
	if st == idle {
		return fmt.Errorf("%w: rank %d: Ready of parameter %d (%q) outside a step: call Begin first", ErrNoStep, r.c.Rank(), i, r.params[i].Name)
	}
	L := r.lay.Load()
	if err := L.sched.claim(i); err != nil {
		return r.markedErr("Ready", i)
	}
	if r.o.NoZeroGrad {
		// The caller vouches for the gradient as it stands (it
		// overwrote the last average): nothing will zero it.
		r.fresh[i].Store(r.gen.Load())
	}
	r.arrive(L, i, st == syncing)
	return nil
}

// SetGrad copies g into parameter i's gradient (replacing it) and marks it
// ready.
func (r *Reducer) SetGrad(i int, g []float32) error {
	dst, err := r.gradFor("SetGrad", i, g)
	if err != nil {
		return err
	}
	copy(dst, g)
	r.fresh[i].Store(r.gen.Load())
	return r.Ready(i)
}

// AddGrad adds g into parameter i's gradient and marks it ready. A
// gradient not yet written in this accumulation window (logically zero,
// not zeroed yet, or with Options.NoZeroGrad still holding the last
// average) is overwritten instead, so AddGrad accumulates correctly in
// every step of a window and never pays for zeroing.
func (r *Reducer) AddGrad(i int, g []float32) error {
	dst, err := r.gradFor("AddGrad", i, g)
	if err != nil {
		return err
	}
	if gen := r.gen.Load(); r.fresh[i].Load() != gen {
		copy(dst, g)
		r.fresh[i].Store(gen)
	} else {
		for j, v := range g {
			dst[j] += v
		}
	}
	return r.Ready(i)
}

func (r *Reducer) gradFor(op string, i int, g []float32) ([]float32, error) {
	if i < 0 || i >= len(r.params) {
		return nil, fmt.Errorf("%w: rank %d: %s(%d): the reducer has %d parameters", ErrIndex, r.c.Rank(), op, i, len(r.params))
	}
	if err := r.usable(); err != nil {
		return nil, err
	}
	if r.state.Load() == idle {
		return nil, fmt.Errorf("%w: rank %d: %s of parameter %d (%q) outside a step: call Begin first", ErrNoStep, r.c.Rank(), op, i, r.params[i].Name)
	}
	if n := r.tensors[i].Numel; len(g) != n {
		return nil, fmt.Errorf("%w: rank %d: %s: parameter %d (%q, shape %v) has %d elements, got %d", ErrGradSize, r.c.Rank(), op, i, r.params[i].Name, r.params[i].Shape, n, len(g))
	}
	if r.lay.Load().sched.isMarked(i) {
		return nil, r.markedErr(op, i)
	}
	return r.grad(i), nil
}

// markedErr explains why parameter i, already marked in this step, cannot
// be marked by op.
func (r *Reducer) markedErr(op string, i int) error {
	if r.static[i] && r.staticOK && r.state.Load() == syncing {
		return fmt.Errorf("%w: %s: rank %d step %d: parameter %d (%q) got no gradient in the first synced step, so the Reducer marks it; "+
			"drop StaticGraph or keep the set of unused parameters fixed", ErrStaticGraph, op, r.c.Rank(), r.stepNo, i, r.params[i].Name)
	}
	return fmt.Errorf("%w: %s: rank %d step %d: parameter %d (%q) is already marked ready", ErrMarkedTwice, op, r.c.Rank(), r.stepNo, i, r.params[i].Name)
}

// arrive records claimed parameter i and counts it towards its bucket.
func (r *Reducer) arrive(L *layout, i int, sync bool) {
	r.cur.ParamReady[i] = time.Since(r.start)
	r.order[r.nready.Add(1)-1].Store(int32(i))
	if !sync {
		return
	}
	if r.copies != nil && !r.isStale(i) {
		// A stale gradient is not copied: the communication goroutine
		// zeroes its bucket slot instead.
		copy(L.views[i], r.copies[i])
	}
	if L.sched.arrive(i) >= 0 {
		select {
		case r.poke <- struct{}{}:
		default:
		}
	}
}

// markUnused marks parameter i ready on its owner's behalf.
func (r *Reducer) markUnused(L *layout, i int) {
	if L.sched.claim(i) != nil {
		return
	}
	// A stale gradient (the caller wrote nothing in this window) is
	// zeroed by the communication goroutine before the bucket is reduced.
	r.isUnused[i] = true
	r.cur.Unused = append(r.cur.Unused, i)
	r.arrive(L, i, true)
}

// Wait returns when every bucket of the synced step is reduced: each
// gradient then holds the average over ranks. In a no-sync step it only
// ends the step. It fails with ErrUnready (naming the parameters) if some
// parameters were never marked ready and FindUnusedParameters is off; the
// step then stays open, so the caller may mark them and call Wait again.
// Wait honours ctx and Options.Timeout (a step already finished when ctx
// ends stands); on expiry, or when a collective fails, the Reducer aborts
// the group, and it and every later call return that error until Close.
// A Close from another goroutine ends a blocked Wait with ErrClosed.
func (r *Reducer) Wait(ctx context.Context) error {
	if err := r.usable(); err != nil {
		return err
	}
	switch r.state.Load() {
	case idle:
		return fmt.Errorf("%w: rank %d: Wait without a step (the last was step %d): call Begin first", ErrNoStep, r.c.Rank(), r.stepNo)
	case local:
		r.finish()
		return nil
	}
	L := r.lay.Load()
	if int(L.sched.nmarked.Load()) < len(r.params) {
		if err := r.handleUnready(L); err != nil {
			return err
		}
	}
	if err := r.waitDone(ctx, L); err != nil {
		return err
	}
	if err := r.usable(); err != nil {
		return err
	}
	if r.o.StaticGraph && !r.staticOK {
		copy(r.static, r.isUnused)
		r.staticOK = true
	}
	first := !r.rebuilt
	r.finish()
	if first {
		r.rebuilt = true
		if !r.o.KeepLayout {
			if err := r.rebuild(ctx); err != nil {
				return r.fail(err)
			}
		}
	}
	return nil
}

// handleUnready deals with parameters not marked ready when Wait starts.
func (r *Reducer) handleUnready(L *layout) error {
	if r.o.FindUnusedParameters || (r.o.StaticGraph && !r.staticOK) {
		for i := range r.params {
			if !L.sched.isMarked(i) {
				r.markUnused(L, i)
			}
		}
		return nil
	}
	var names []string
	for i, p := range r.params {
		if !L.sched.isMarked(i) && len(names) < 10 {
			names = append(names, fmt.Sprintf("%d %q (bucket %d)", i, p.Name, L.bucketOf[i]))
		}
	}
	missing := len(r.params) - int(L.sched.nmarked.Load())
	list := strings.Join(names, ", ")
	if missing > len(names) {
		list += fmt.Sprintf(" and %d more", missing-len(names))
	}
	return fmt.Errorf("%w: rank %d step %d: %d of %d parameters got no Ready before Wait: %s; "+
		"buckets are reduced only once all their parameters are ready, so this step cannot finish. "+
		"Call Ready (or SetGrad) for every parameter, including those with a zero gradient, or, if these "+
		"parameters really take no part in this step's loss, set Options.FindUnusedParameters "+
		"(or Options.StaticGraph when the set never changes). The step stays open: mark them and call Wait again",
		ErrUnready, r.c.Rank(), r.stepNo, missing, len(r.params), list)
}

// waitDone blocks until the comm goroutine has reduced the last bucket.
func (r *Reducer) waitDone(ctx context.Context, L *layout) error {
	began := time.Now()
	stallAt := r.o.StallInterval
	for {
		waited := time.Since(began)
		d := min(stallAt, r.o.Timeout) - waited
		if d <= 0 {
			d = time.Nanosecond
		}
		r.timer.Reset(d)
		select {
		case <-r.done:
			r.timer.Stop()
			return nil
		case <-ctx.Done():
			r.timer.Stop()
			select {
			case <-r.done: // the step finished as ctx ended: it stands
				return nil
			default:
			}
			k := int(r.reduced.Load())
			return r.fail(fmt.Errorf("ddp: rank %d step %d: waiting for bucket %d of %d (%s): %w", r.c.Rank(), r.stepNo, k, len(L.buckets), L.describe(k, r.params), ctx.Err()))
		case <-r.timer.C:
			waited = time.Since(began)
			k := int(r.reduced.Load())
			if waited >= r.o.Timeout {
				select {
				case <-r.done:
					return nil
				default:
				}
				return r.fail(fmt.Errorf("%w: ddp: rank %d step %d: bucket %d of %d (%s) not reduced after %v",
					comm.ErrTimeout, r.c.Rank(), r.stepNo, k, len(L.buckets), L.describe(k, r.params), r.o.Timeout))
			}
			if waited >= stallAt {
				r.reportStall(L, k, waited)
				stallAt += r.o.StallInterval
			}
		}
	}
}

func (r *Reducer) reportStall(L *layout, k int, waited time.Duration) {
	s := Stall{Rank: r.c.Rank(), Step: r.stepNo, Waited: waited, Bucket: k, OnWire: k < L.sched.launched()}
	if !s.OnWire && k < len(L.buckets) {
		for _, p := range L.buckets[k].Tensors {
			if !L.sched.isMarked(p) {
				s.Missing = append(s.Missing, r.params[p].Name)
			}
		}
	}
	if r.o.OnStall != nil {
		r.o.OnStall(s)
		return
	}
	log.Print(s.String())
}

// finish ends the running step: statistics become final and visible
// through Stats.
func (r *Reducer) finish() {
	s := r.cur
	if invariants && s.Sync && !r.failed.Load() {
		L := r.lay.Load()
		if n := len(L.buckets); L.sched.launched() != n || int(r.reduced.Load()) != n || int(L.sched.nmarked.Load()) != len(r.params) {
			panic(fmt.Sprintf("ddp: invariant: step %d finished with %d of %d buckets launched, %d reduced, %d of %d parameters marked",
				r.stepNo, L.sched.launched(), n, r.reduced.Load(), L.sched.nmarked.Load(), len(r.params)))
		}
		for i := range r.fresh {
			if r.isStale(i) {
				panic(fmt.Sprintf("ddp: invariant: step %d finished with parameter %d (%q) stale (generation %d, current %d)",
					r.stepNo, i, r.params[i].Name, r.fresh[i].Load(), r.gen.Load()))
			}
		}
	}
	s.Wall = time.Since(r.start)
	s.finalize(r.lay.Load(), r.isUnused)
	r.cur, r.last = r.last, r.cur
	r.state.Store(idle)
}

// Stats returns the statistics of the last completed step. It allocates
// nothing: the slices in the result are the Reducer's own and stay valid
// until the next Wait returns (or the next Begin after a no-sync step);
// use StatsInto to keep a copy. Like StatsInto, it must not run
// concurrently with Wait or Begin: call it from the training goroutine
// (a metrics exporter on another goroutine takes the copy it is handed).
func (r *Reducer) Stats() StepStats { return *r.last }

// StatsInto copies the statistics of the last completed step into dst,
// reusing dst's slices.
func (r *Reducer) StatsInto(dst *StepStats) {
	b, p, u := dst.Buckets, dst.ParamReady, dst.Unused
	*dst = *r.last
	dst.Buckets = append(b[:0], r.last.Buckets...)
	dst.ParamReady = append(p[:0], r.last.ParamReady...)
	dst.Unused = append(u[:0], r.last.Unused...)
}

// loop is the rank's communication goroutine.
func (r *Reducer) loop() {
	defer close(r.exited)
	for {
		select {
		case <-r.quit:
			return
		case <-r.poke:
		}
		r.drain()
	}
}

// drain launches, in index order, every bucket that may launch, and runs
// its hook.
func (r *Reducer) drain() {
	L := r.lay.Load()
	for !r.failed.Load() {
		k := L.sched.launch()
		if k < 0 {
			return
		}
		s := &r.cur.Buckets[k]
		hb := &L.hb[k]
		s.Launch = time.Since(hb.Start)
		r.zeroStale(L, k, s)
		err := r.hook.Reduce(r.ctx, r.c, hb)
		s.Done = time.Since(hb.Start)
		t := hb.Times
		s.CompressStart, s.CompressEnd = t.CompressStart, t.CompressEnd
		s.CollectiveStart, s.CollectiveEnd = t.CollectiveStart, t.CollectiveEnd
		s.DecompressEnd = t.DecompressEnd
		s.WireBytes, s.Overflows = t.WireBytes, t.Overflows
		if err != nil {
			r.fail(fmt.Errorf("ddp: rank %d step %d: bucket %d (%s): %w", r.c.Rank(), r.stepNo, k, L.describe(k, r.params), err))
			r.signal()
			return
		}
		if r.copies != nil {
			for _, p := range L.buckets[k].Tensors {
				copy(r.copies[p], L.views[p])
			}
		}
		if int(r.reduced.Add(1)) == len(L.buckets) {
			r.signal()
		}
	}
}

// zeroStale zeroes the bucket slots of bucket k's parameters that are
// still stale: marked ready (by the caller or as unused) without a Grad,
// SetGrad or AddGrad in this accumulation window, so their gradient is
// zero. It runs on the communication goroutine after every Ready of the
// bucket (the bucket's pending count orders them), so that Ready stays
// O(1) on the caller's goroutine.
func (r *Reducer) zeroStale(L *layout, k int, s *BucketStats) {
	gen := r.gen.Load()
	var t0 time.Time
	for _, p := range L.buckets[k].Tensors {
		if r.fresh[p].Load() == gen {
			continue
		}
		if t0.IsZero() {
			t0 = time.Now()
		}
		clear(L.views[p])
		r.fresh[p].Store(gen) // with CopyGrads, the copy back after the hook follows
	}
	if !t0.IsZero() {
		s.Zero = time.Since(t0)
	}
}

func (r *Reducer) signal() {
	select {
	case r.done <- struct{}{}:
	default:
	}
}

// fail makes err the Reducer's sticky error, stops the communication
// goroutine's collective, and aborts the group so that peers fail fast
// instead of waiting for a collective this rank will never issue. It
// returns the sticky error.
func (r *Reducer) fail(err error) error {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
		r.failed.Store(true)
		r.mu.Unlock()
		if r.cancel != nil {
			r.cancel()
		}
		r.c.Abort(err)
		return err
	}
	err = r.err
	r.mu.Unlock()
	return err
}

// Err returns the sticky error that made the Reducer unusable, or nil.
func (r *Reducer) Err() error {
	if !r.failed.Load() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// bounded returns parent limited to Options.Timeout, for the collectives
// the Reducer waits for outside Wait's own loop (New's check, the
// rebuild, BroadcastParameters), and a function that marks an expiry of
// that limit (not of parent) as comm.ErrTimeout.
func bounded(parent context.Context, d time.Duration) (context.Context, context.CancelFunc, func(error) error) {
	ctx, cancel := context.WithTimeout(parent, d)
	explain := func(err error) error {
		if err != nil && parent.Err() == nil && ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w after Options.Timeout %v: %w", comm.ErrTimeout, d, err)
		}
		return err
	}
	return ctx, cancel, explain
}

func (r *Reducer) usable() error {
	if r.closed.Load() {
		return ErrClosed
	}
	if r.failed.Load() {
		return r.Err()
	}
	return nil
}

// Close stops the communication goroutine, closes the hook and returns the
// bucket memory to the pool (closing the pool if the Reducer made it). A
// synced step still running is abandoned and the group aborted. It does
// not close the communicator. Close is idempotent.
func (r *Reducer) Close() error {
	r.closeOnce.Do(func() {
		if r.state.Load() == syncing && !r.failed.Load() {
			r.fail(fmt.Errorf("%w: rank %d closed during step %d", ErrClosed, r.c.Rank(), r.stepNo))
		}
		r.closed.Store(true)
		r.cancel()
		close(r.quit)
		<-r.exited
		r.closeErr = r.release()
	})
	return r.closeErr
}

// release returns the Reducer's memory.
func (r *Reducer) release() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	keep(r.hook.Close())
	if L := r.lay.Load(); L != nil {
		keep(L.free(r.pool))
	}
	if r.ownPool && r.pool != nil {
		keep(r.pool.Close())
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
