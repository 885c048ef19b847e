package hooks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/lowrank"
	"github.com/ddpgo/ddpgo/internal/reduce"
)

// PowerSGDOptions are PowerSGD's settings: those of PyTorch's
// PowerSGDState, under Go names. DefaultPowerSGDOptions returns PyTorch's
// defaults.
type PowerSGDOptions struct {
	// Rank is the rank of the approximation (matrix_approximation_rank):
	// a matrix M of n rows and m columns travels as P (n×Rank) and Q
	// (m×Rank). At least 1; a matrix's rank is capped at min(n, m).
	Rank int
	// StartIter is the number of synced steps reduced uncompressed, as Avg
	// reduces them, before compression starts (start_powerSGD_iter).
	// Unlike PyTorch's, it may be 0 or 1 with error feedback or warm
	// start: the hook's state is kept per parameter, so the Reducer's
	// rebuild of the buckets after the first step does not disturb it.
	StartIter int
	// MinCompressionRate (min_compression_rate): a matrix is compressed
	// only if (n + m) · rank · MinCompressionRate < n · m; the others are
	// reduced as they are. Not negative.
	MinCompressionRate float64
	// ErrorFeedback (use_error_feedback) adds to each compressed gradient
	// what compression lost from it in the previous step. It costs one
	// float32 per compressed element, in pool memory.
	ErrorFeedback bool
	// WarmStart (warm_start) starts each step's power iteration from the
	// previous step's Q instead of a fresh random one.
	WarmStart bool
	// OrthogonalizationEpsilon (orthogonalization_epsilon) is added to
	// each column's norm before the column is divided by it. Not negative.
	OrthogonalizationEpsilon float32
	// Seed (random_seed) seeds the random initial Qs, the same on every
	// rank.
	Seed uint64
	// Pool holds the hook's state (errors, Qs). Nil means the Reducer's
	// pool (PoolUser); a hook used without a Reducer needs one.
	Pool *allocator.Pool
}

// DefaultPowerSGDOptions returns PyTorch's defaults: rank 1, compression
// from step 1000, minimum compression rate 2, error feedback and warm start
// on, epsilon 0, seed 0.
func DefaultPowerSGDOptions() PowerSGDOptions {
	return PowerSGDOptions{Rank: 1, StartIter: 1000, MinCompressionRate: 2, ErrorFeedback: true, WarmStart: true}
}

// validate reports the first option out of range.
func (o PowerSGDOptions) validate() error {
	switch {
	case o.Rank < 1:
		return fmt.Errorf("%w: powersgd rank %d: want at least 1", ErrBadOptions, o.Rank)
	case o.StartIter < 0:
		return fmt.Errorf("%w: powersgd start iteration %d: want 0 or more", ErrBadOptions, o.StartIter)
	case !(o.MinCompressionRate >= 0) || math.IsInf(o.MinCompressionRate, 1):
		return fmt.Errorf("%w: powersgd minimum compression rate %v: want a finite rate, 0 or more", ErrBadOptions, o.MinCompressionRate)
	case !(o.OrthogonalizationEpsilon >= 0) || math.IsInf(float64(o.OrthogonalizationEpsilon), 1):
		return fmt.Errorf("%w: powersgd orthogonalization epsilon %v: want a finite value, 0 or more", ErrBadOptions, o.OrthogonalizationEpsilon)
	}
	return nil
}

// String names the options as PyTorch's PowerSGDState does.
func (o PowerSGDOptions) String() string {
	return fmt.Sprintf("matrix_approximation_rank=%d start_powerSGD_iter=%d min_compression_rate=%v use_error_feedback=%v warm_start=%v orthogonalization_epsilon=%v random_seed=%d",
		o.Rank, o.StartIter, o.MinCompressionRate, o.ErrorFeedback, o.WarmStart, o.OrthogonalizationEpsilon, o.Seed)
}

// PowerSGD returns a PowerSGD hook (Vogels et al., NeurIPS 2019), PyTorch's
// powerSGD_hook: see the package documentation, "PowerSGD". Options out of
// range make Setup fail with ErrBadOptions.
func PowerSGD(o PowerSGDOptions) *PowerSGDHook {
	return &PowerSGDHook{base: base{name: "powersgd"}, o: o}
}

// PowerSGDHook is the hook PowerSGD returns.
type PowerSGDHook struct {
	base
	o    PowerSGDOptions
	mu   sync.Mutex // Setup, Close, UsePool, jobs, queue, failure
	pool *allocator.Pool
	n    int
	op   comm.Op // the uncompressed reduction: Avg where native, else Sum after scaling
	w    *issuedWork

	// The launcher goroutine's: the step, the random source, the state.
	step     uint64 // synced steps begun, counted at bucket 0's Launch
	compress bool   // the current step compresses
	pcg      rand.PCG
	rng      *rand.Rand
	params   []*paramState // by parameter index, once compressed
	plans    []*plan       // by bucket index

	jobs  []*job // by bucket index
	queue []*job // launched, not yet issued
	wake  chan struct{}
	quit  chan struct{}
	done  chan struct{}
	err   error // sticky: the group failed, or the options differ

	before, after atomic.Int64 // elements before and after compression
	nonfinite     atomic.Int64 // buckets whose average was not finite
	errorResets   atomic.Int64 // this rank's error elements zeroed as non-finite
}

// paramState is one compressed parameter's state, in one pool block: its
// error (n·m elements, with error feedback) then its Q (m·r).
type paramState struct {
	n, m, r int
	blk     allocator.Block
	err, q  []float32
	warm    bool // q holds the previous step's average
}

// plan is how a bucket's tensors travel: the compressed ones as P and Q,
// the others copied into the scratch ahead of the Ps.
type plan struct {
	key  []Tensor // the tensors the plan was made for (Param, Offset, Shape)
	comp []compTensor
	unc  []span
	nunc int // uncompressed elements: scratch[0:nunc]
	np   int // P elements: scratch[nunc:nunc+np]
	q0   int // Q's first element in scratch
	nq   int
}

type compTensor struct {
	param, off, n, m, r int
	p, q                int         // offsets of its P and Q in the scratch
	st                  *paramState // set by Launch
}

type span struct{ off, n, at int } // bucket elements [off, off+n) at scratch[at]

// job is one bucket's reduction in one step, as the issuer sees it.
type job struct {
	seq       uint64
	b         *Bucket
	pl        *plan // nil: reduced uncompressed
	final     comm.Work
	err       error
	published atomic.Uint64 // seq once final and err are set
	ready     chan struct{} // a token once published
}

// Errors of PowerSGD; test with errors.Is.
var (
	// ErrBadOptions: a hook's options are out of range.
	ErrBadOptions = errors.New("hooks: bad hook options")
	// ErrMismatch: ranks set up the same hook with different options.
	ErrMismatch = errors.New("hooks: hook options differ between ranks")
	// ErrNoPool: a hook that keeps state in pool memory was given none.
	ErrNoPool = errors.New("hooks: no pool for the hook's state")
)

// Name is "powersgd".
func (h *PowerSGDHook) Name() string { return h.name }

// Options returns the hook's options.
func (h *PowerSGDHook) Options() PowerSGDOptions { return h.o }

// Wire is Float32 for float32 buckets; other dtypes are not reduced.
func (h *PowerSGDHook) Wire(dt comm.DType) comm.DType {
	if dt == comm.Float32 {
		return comm.Float32
	}
	return 0
}

// Scratch is 0: a bucket without its tensors' shapes is reduced
// uncompressed. TensorScratch sizes the scratch of a bucket with them.
func (h *PowerSGDHook) Scratch(int, comm.DType) int { return 0 }

// TensorScratch is the bytes of the uncompressed tensors, the Ps and the
// Qs of b's compressed tensors.
func (h *PowerSGDHook) TensorScratch(b *Bucket) int {
	if b.Buf.DType != comm.Float32 || h.o.validate() != nil {
		return 0
	}
	pl := h.makePlan(b.Tensors)
	if pl == nil {
		return 0
	}
	return 4 * (pl.q0 + pl.nq)
}

// KernelOps: the uncompressed reduction scales by 1/N where the backend
// has no native Avg. The matrix products run on the host, in Go.
func (h *PowerSGDHook) KernelOps(dt comm.DType) []KernelUse {
	if dt == comm.Float32 && h.op == comm.Sum && h.n > 1 {
		return []KernelUse{{comm.OpScale, dt}}
	}
	return nil
}

// Setup binds the hook and starts its issuer goroutine. It refuses device
// memory: the matrix products run on the host.
func (h *PowerSGDHook) Setup(c comm.Communicator, k comm.Kernels) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.o.validate(); err != nil {
		return err
	}
	if k != nil && k.Location() != comm.Host {
		return fmt.Errorf("%w: the powersgd hook runs its matrix products on the host, in Go, and has no device kernels: reduce device memory with avg, fp16 or bf16", ErrDType)
	}
	if err := h.setup(c, k); err != nil {
		return err
	}
	h.n = c.Size()
	h.op = comm.Avg
	if !comm.CapsOf(c).NativeAvg {
		h.op = comm.Sum
	}
	if h.pool == nil {
		h.pool = h.o.Pool
	}
	if h.rng == nil {
		h.rng = rand.New(&h.pcg)
		h.w = &issuedWork{h}
	}
	if h.done == nil {
		h.wake, h.quit, h.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go h.issuer(h.quit, h.done)
	}
	return nil
}

// UsePool gives the hook the pool it keeps its state in, unless its
// options named one (PoolUser).
func (h *PowerSGDHook) UsePool(p *allocator.Pool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.o.Pool == nil {
		h.pool = p
	}
}

// Compression returns the elements the hook has been given to reduce in
// compressed steps and the elements it sent for them (uncompressed tensors,
// Ps and Qs), as PyTorch's compression_stats counts them.
func (h *PowerSGDHook) Compression() (before, after int64) {
	return h.before.Load(), h.after.Load()
}

// NonFinite returns the number of compressed buckets whose average came
// out non-finite (a NaN or an Inf in some rank's gradient, or an overflow
// of the products): the same on every rank. Such a bucket's matrices
// kept their error and Q as they were before the step.
func (h *PowerSGDHook) NonFinite() int64 { return h.nonfinite.Load() }

// ErrorResets returns the number of elements of this rank's errors that
// came out non-finite in a step whose average was finite (the gradient
// plus the old error minus P·Qᵀ overflowed) and were set to 0. It is this
// rank's own count: other ranks' may differ.
func (h *PowerSGDHook) ErrorResets() int64 { return h.errorResets.Load() }

// Launch prepares b and hands it to the issuer: in a compressed step, it
// adds the error, computes the Ps and copies the uncompressed tensors into
// the scratch. The issuer all-reduces the uncompressed tensors and the Ps,
// orthogonalizes the Ps, computes the Qs and all-reduces them; the Work
// completes once the Qs have been reduced.
func (h *PowerSGDHook) Launch(b *Bucket) (comm.Work, error) {
	if err := h.check("Launch", b, h.Wire(b.Buf.DType), 0); err != nil {
		return comm.Work{}, err
	}
	if b.Index == 0 {
		h.compress = h.step >= uint64(h.o.StartIter)
		h.step++
	}
	var pl *plan
	if h.compress {
		pl = h.planFor(b)
	}
	if pl != nil {
		if need := 4 * (pl.q0 + pl.nq); b.Scratch.Bytes() < need {
			return comm.Work{}, fmt.Errorf("%w: bucket %d needs %d bytes of powersgd scratch, has %d (TensorScratch)", ErrScratch, b.Index, need, b.Scratch.Bytes())
		}
		if err := h.compressBucket(b, pl); err != nil {
			return comm.Work{}, err
		}
		b.WireBytes = int64(4 * (pl.nunc + pl.np + pl.nq))
	} else {
		if h.op == comm.Sum && h.n > 1 {
			h.k.Scale(b.Buf, 1/float32(h.n))
		}
		b.WireBytes = int64(b.Buf.Bytes())
	}
	return h.enqueue(b, pl)
}

// Finish turns the reduced Qs into the average: each compressed gradient
// becomes P·Qᵀ (and its error what that lost, an element of which that
// overflows being set to 0: ErrorResets), and the uncompressed
// tensors are copied back from the scratch. If any of the bucket's reduced
// values (uncompressed tensors, Ps, Qs) is not finite, the average is not
// either, and every matrix of the bucket keeps its error and Q as they
// were before the step (NonFinite counts it).
func (h *PowerSGDHook) Finish(b *Bucket) error {
	if err := h.check("Finish", b, h.Wire(b.Buf.DType), 0); err != nil {
		return err
	}
	b.Overflows = 0
	h.mu.Lock()
	var j *job
	if b.Index >= 0 && b.Index < len(h.jobs) {
		j = h.jobs[b.Index]
	}
	h.mu.Unlock()
	if j == nil || j.b != b || j.published.Load() != j.seq {
		return fmt.Errorf("hooks: powersgd Finish of bucket %d, which was not launched or has not completed", b.Index)
	}
	if j.err != nil {
		return j.err
	}
	pl := j.pl
	if pl == nil {
		return nil
	}
	g := b.Buf.AsFloat32()
	sc := scratch32(b).AsFloat32()
	for _, u := range pl.unc {
		copy(g[u.off:u.off+u.n], sc[u.at:u.at+u.n])
	}
	inv := 1 / float32(h.n)
	qs := sc[pl.q0 : pl.q0+pl.nq]
	for i, v := range qs {
		qs[i] = v * inv
	}
	// The scratch holds the same bits on every rank, so every rank takes
	// the same branch.
	keep := !finite32(sc[:pl.nunc+pl.np]) || !finite32(qs)
	if keep {
		h.nonfinite.Add(1)
	}
	for _, t := range pl.comp {
		st := t.st
		c := g[t.off : t.off+t.n*t.m] // M plus the error, from Launch
		p, q := sc[t.p:t.p+t.n*t.r], sc[t.q:t.q+t.m*t.r]
		if keep {
			lowrank.Reconstruct(c, nil, p, q, t.n, t.m, t.r)
			continue
		}
		copy(st.q, q)
		st.warm = h.o.WarmStart
		// The new error is c (M plus the old error) minus P·Qᵀ, written
		// in the pass that overwrites c.
		lowrank.Reconstruct(c, st.err, p, st.q, t.n, t.m, t.r)
		// The difference may overflow where the reduced values did not
		// (c near +MaxFloat32, P·Qᵀ far below 0): kept, an Inf would make
		// every later step of the bucket non-finite, and so kept out of
		// the state for good. The error is this rank's alone, and Q comes
		// only from reduced values, so zeroing it here leaves the ranks
		// in agreement. c is finite (else so would not be P), and P's
		// elements are at most 1 (orthonormal columns), so |P·Qᵀ| is at
		// most r·max|Q|, and c − P·Qᵀ rounds to ±Inf only where that
		// reaches 2^103, half an ulp of MaxFloat32: below 2^96, the error
		// is not scanned (a scan costs as much as a quarter of the step).
		if st.err != nil && float32(t.r)*maxAbs32(st.q) >= 0x1p96 {
			if k := zeroNonfinite(st.err); k > 0 {
				h.errorResets.Add(int64(k))
			}
		}
	}
	return nil
}

// Close stops the issuer, once the collective it may be waiting for has
// completed (abort the communicator first if a peer is gone), and returns
// the hook's state to the pool. It is idempotent.
func (h *PowerSGDHook) Close() error {
	h.mu.Lock()
	quit, done := h.quit, h.done
	h.quit, h.done = nil, nil
	h.closed = true
	h.mu.Unlock()
	if quit != nil {
		close(quit)
		<-done
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var first error
	for i, st := range h.params {
		if st != nil {
			if err := h.pool.Put(st.blk); err != nil && first == nil {
				first = err
			}
			h.params[i] = nil
		}
	}
	return first
}

// compressBucket does Launch's share of a compressed bucket.
func (h *PowerSGDHook) compressBucket(b *Bucket, pl *plan) error {
	g := b.Buf.AsFloat32()
	sc := scratch32(b).AsFloat32()
	inv := 1 / float32(h.n)
	for _, u := range pl.unc {
		dst, src := sc[u.at:u.at+u.n], g[u.off:u.off+u.n]
		if h.n == 1 {
			copy(dst, src)
			continue
		}
		for i, v := range src {
			dst[i] = v * inv
		}
	}
	for i := range pl.comp {
		t := &pl.comp[i]
		st, err := h.state(t)
		if err != nil {
			return err
		}
		t.st = st // for the issuer and Finish, which must not read h.params
		// The state changes only in Finish, and only if the bucket's
		// average is finite: Q is orthonormalized in the scratch, where
		// the issuer later puts the new one, and the error is added to
		// the gradient (which Finish overwrites), not the gradient to
		// the error.
		q := sc[t.q : t.q+t.m*t.r]
		if st.warm {
			copy(q, st.q)
		} else {
			h.pcg.Seed(h.o.Seed, uint64(t.param)<<40^h.step)
			for i := range q {
				q[i] = float32(h.rng.NormFloat64())
			}
		}
		lowrank.Orthogonalize(q, t.m, t.r, h.o.OrthogonalizationEpsilon)
		c := g[t.off : t.off+t.n*t.m]
		p := sc[t.p : t.p+t.n*t.r]
		if st.err == nil {
			lowrank.MulQ(p, c, q, t.n, t.m, t.r)
			continue
		}
		// M += e, then P = M·Q, a block of rows at a time, so that the
		// product reads rows the sum has just left in the cache.
		rows := max(2, 32<<10/t.m)
		for i := 0; i < t.n; i += rows {
			k := min(rows, t.n-i)
			mi := c[i*t.m : (i+k)*t.m]
			reduce.SumFloat32(mi, st.err[i*t.m:(i+k)*t.m], mi)
			lowrank.MulQ(p[i*t.r:(i+k)*t.r], mi, q, k, t.m, t.r)
		}
	}
	h.before.Add(int64(b.Buf.Count))
	h.after.Add(int64(pl.nunc + pl.np + pl.nq))
	return nil
}

// state returns parameter t's state, taking it from the pool the first
// time.
func (h *PowerSGDHook) state(t *compTensor) (*paramState, error) {
	if t.param < len(h.params) && h.params[t.param] != nil {
		st := h.params[t.param]
		if st.n == t.n && st.m == t.m && st.r == t.r {
			return st, nil
		}
		return nil, fmt.Errorf("hooks: powersgd: parameter %d was %d×%d at rank %d and is now %d×%d at rank %d", t.param, st.n, st.m, st.r, t.n, t.m, t.r)
	}
	h.mu.Lock()
	pool := h.pool
	h.mu.Unlock()
	if pool == nil {
		return nil, fmt.Errorf("%w: powersgd keeps its errors and Qs in pool memory: set PowerSGDOptions.Pool, or use it through a ddp.Reducer", ErrNoPool)
	}
	ne := 0
	if h.o.ErrorFeedback {
		ne = t.n * t.m
	}
	blk, err := pool.Get(4 * (ne + t.m*t.r))
	if err != nil {
		return nil, fmt.Errorf("hooks: powersgd state of parameter %d (%d×%d, rank %d): %w", t.param, t.n, t.m, t.r, err)
	}
	f := blk.Float32s()[:ne+t.m*t.r]
	clear(f)
	st := &paramState{n: t.n, m: t.m, r: t.r, blk: blk, q: f[ne:]}
	if ne > 0 {
		st.err = f[:ne]
	}
	for len(h.params) <= t.param {
		h.params = append(h.params, nil)
	}
	h.params[t.param] = st
	return st, nil
}

// planFor returns bucket b's plan, made again when its tensors changed
// (a rebuilt layout); nil if nothing in it is compressed.
func (h *PowerSGDHook) planFor(b *Bucket) *plan {
	for len(h.plans) <= b.Index {
		h.plans = append(h.plans, nil)
	}
	if pl := h.plans[b.Index]; pl != nil && sameTensors(pl.key, b.Tensors) {
		if len(pl.comp) == 0 {
			return nil
		}
		return pl
	}
	pl := h.makePlan(b.Tensors)
	if pl == nil {
		pl = &plan{}
	}
	pl.key = append([]Tensor(nil), b.Tensors...)
	h.plans[b.Index] = pl
	if len(pl.comp) == 0 {
		return nil
	}
	return pl
}

func sameTensors(a, b []Tensor) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Param != b[i].Param || a[i].Offset != b[i].Offset || len(a[i].Shape) != len(b[i].Shape) {
			return false
		}
		for j, d := range a[i].Shape {
			if b[i].Shape[j] != d {
				return false
			}
		}
	}
	return true
}

// makePlan decides which of ts are compressed, as PyTorch's
// _should_compress does, and lays out the scratch: the uncompressed
// tensors, then the Ps, then (from a 512-byte boundary) the Qs. It returns
// nil when none is compressed.
func (h *PowerSGDHook) makePlan(ts []Tensor) *plan {
	pl := &plan{}
	var comp []compTensor
	for _, t := range ts {
		numel := 1
		for _, d := range t.Shape {
			numel *= d
		}
		if numel == 0 {
			continue
		}
		if len(t.Shape) >= 2 {
			n := t.Shape[0]
			m := numel / n
			r := min(n, m, h.o.Rank)
			if float64(n+m)*float64(r)*h.o.MinCompressionRate < float64(n)*float64(m) {
				comp = append(comp, compTensor{param: t.Param, off: t.Offset, n: n, m: m, r: r})
				continue
			}
		}
		pl.unc = append(pl.unc, span{off: t.Offset, n: numel, at: pl.nunc})
		pl.nunc += numel
	}
	if len(comp) == 0 {
		return nil
	}
	at := pl.nunc
	for i := range comp {
		comp[i].p = at
		at += comp[i].n * comp[i].r
	}
	pl.np = at - pl.nunc
	pl.q0 = (at + 127) &^ 127
	at = pl.q0
	for i := range comp {
		comp[i].q = at
		at += comp[i].m * comp[i].r
	}
	pl.nq = at - pl.q0
	pl.comp = comp
	return pl
}

// enqueue hands b to the issuer and returns the Work of its reduction.
func (h *PowerSGDHook) enqueue(b *Bucket, pl *plan) (comm.Work, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return comm.Work{}, h.err
	}
	if h.quit == nil {
		return comm.Work{}, fmt.Errorf("%w: powersgd Launch of bucket %d", ErrNotSetup, b.Index)
	}
	for len(h.jobs) <= b.Index {
		h.jobs = append(h.jobs, &job{ready: make(chan struct{}, 1)})
	}
	j := h.jobs[b.Index]
	select { // a token left from the job's previous step
	case <-j.ready:
	default:
	}
	j.seq++
	j.b, j.pl, j.final, j.err = b, pl, comm.Work{}, nil
	h.queue = append(h.queue, j)
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return comm.NewWork(h.w, j.seq<<32|uint64(b.Index)), nil
}

// issuer issues every collective of the hook, one job after the other in
// Launch order, which is the same on every rank: the first time, the
// options check; then, per bucket, its uncompressed all-reduce, or the
// all-reduce of its uncompressed tensors and Ps followed, once that has
// completed, by the all-reduce of its Qs. It stops when quit is closed,
// failing the jobs it has not issued.
func (h *PowerSGDHook) issuer(quit, done chan struct{}) {
	defer close(done)
	checked := false
	for {
		h.mu.Lock()
		var j *job
		if len(h.queue) > 0 {
			j = h.queue[0]
			h.queue = h.queue[:copy(h.queue, h.queue[1:])]
		}
		failed := h.err
		h.mu.Unlock()
		if j == nil {
			select {
			case <-quit:
				h.mu.Lock()
				rest := h.queue
				h.queue = h.queue[:0]
				h.mu.Unlock()
				for _, j := range rest {
					h.publish(j, comm.Work{}, fmt.Errorf("%w: powersgd closed before bucket %d was reduced", ErrNotSetup, j.b.Index))
				}
				return
			case <-h.wake:
			}
			continue
		}
		if failed != nil {
			h.publish(j, comm.Work{}, failed)
			continue
		}
		if !checked {
			checked = true
			if err := h.checkOptions(); err != nil {
				h.fail(err)
				h.publish(j, comm.Work{}, err)
				continue
			}
		}
		w, err := h.issue(j)
		if err != nil {
			h.fail(err)
		}
		h.publish(j, w, err)
	}
}

// issue issues job j's collectives and returns the Work of the last.
func (h *PowerSGDHook) issue(j *job) (comm.Work, error) {
	b, pl := j.b, j.pl
	if pl == nil {
		return h.c.AllReduce(b.Buf, b.Buf, h.op), nil
	}
	s := scratch32(b)
	ps := s
	ps.Count = pl.nunc + pl.np
	if err := h.c.AllReduce(ps, ps, comm.Sum).Wait(context.Background()); err != nil {
		return comm.Work{}, fmt.Errorf("hooks: powersgd: all-reducing bucket %d's Ps: %w", b.Index, err)
	}
	sc := s.AsFloat32()[:pl.q0+pl.nq]
	g := b.Buf.AsFloat32()
	for _, t := range pl.comp {
		p := sc[t.p : t.p+t.n*t.r]
		lowrank.Orthogonalize(p, t.n, t.r, h.o.OrthogonalizationEpsilon)
		c := g[t.off : t.off+t.n*t.m] // with the error added, by Launch
		lowrank.MulTP(sc[t.q:t.q+t.m*t.r], c, p, t.n, t.m, t.r)
	}
	qs := s.Slice(pl.q0, pl.nq)
	return h.c.AllReduce(qs, qs, comm.Sum), nil
}

func (h *PowerSGDHook) publish(j *job, w comm.Work, err error) {
	j.final, j.err = w, err
	j.published.Store(j.seq)
	select {
	case j.ready <- struct{}{}:
	default:
	}
}

func (h *PowerSGDHook) fail(err error) {
	h.mu.Lock()
	if h.err == nil {
		h.err = err
	}
	h.mu.Unlock()
}

// checkOptions gathers every rank's options and fails with ErrMismatch,
// naming the first option and rank that differ from rank 0, unless they
// all agree.
func (h *PowerSGDHook) checkOptions() error {
	h.mu.Lock()
	pool := h.pool
	h.mu.Unlock()
	if pool == nil {
		return fmt.Errorf("%w: powersgd checks its options across ranks in pool memory: set PowerSGDOptions.Pool, or use it through a ddp.Reducer", ErrNoPool)
	}
	o := h.o
	b2i := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	mine := [...]int64{int64(o.Rank), int64(o.StartIter), int64(math.Float64bits(o.MinCompressionRate)),
		b2i(o.ErrorFeedback), b2i(o.WarmStart), int64(math.Float32bits(o.OrthogonalizationEpsilon)), int64(o.Seed)}
	const words = len(mine)
	n := h.c.Size()
	blk, err := pool.Get(8 * words * (n + 1))
	if err != nil {
		return fmt.Errorf("hooks: powersgd: memory for the options check: %w", err)
	}
	defer pool.Put(blk)
	all := unsafe.Slice((*int64)(blk.Addr()), words*(n+1))
	copy(all[words*n:], mine[:])
	send := comm.HostBuffer(unsafe.Pointer(&all[words*n]), words, comm.Int64)
	recv := comm.HostBuffer(blk.Addr(), words*n, comm.Int64)
	if err := h.c.AllGather(send, recv).Wait(context.Background()); err != nil {
		return fmt.Errorf("hooks: powersgd: rank %d checking its options across ranks: %w", h.c.Rank(), err)
	}
	show := func(r int) PowerSGDOptions {
		a := all[words*r:]
		return PowerSGDOptions{Rank: int(a[0]), StartIter: int(a[1]), MinCompressionRate: math.Float64frombits(uint64(a[2])),
			ErrorFeedback: a[3] != 0, WarmStart: a[4] != 0, OrthogonalizationEpsilon: math.Float32frombits(uint32(a[5])), Seed: uint64(a[6])}
	}
	for r := 1; r < n; r++ {
		for i := range words {
			if all[words*r+i] != all[i] {
				return fmt.Errorf("%w: rank 0 has powersgd %v; rank %d has %v", ErrMismatch, show(0), r, show(r))
			}
		}
	}
	return nil
}

// finite32 reports whether every element of x is finite.
func finite32(x []float32) bool {
	for _, v := range x {
		if nonfinite32(v) {
			return false
		}
	}
	return true
}

// zeroNonfinite sets x's infinities and NaNs to 0 and returns how many
// there were.
func zeroNonfinite(x []float32) int {
	k := 0
	for i, v := range x {
		if nonfinite32(v) {
			x[i] = 0
			k++
		}
	}
	return k
}

// maxAbs32 returns the largest |v| of x's elements, which are finite.
func maxAbs32(x []float32) float32 {
	var m float32
	for _, v := range x {
		m = max(m, v, -v)
	}
	return m
}

// nonfinite32 reports whether v is an infinity or a NaN.
func nonfinite32(v float32) bool { return math.Float32bits(v)&0x7f800000 == 0x7f800000 }

// scratch32 is b's scratch seen as float32 elements.
func scratch32(b *Bucket) comm.Buffer {
	s := b.Scratch
	s.DType, s.Count = comm.Float32, s.Bytes()/4
	return s
}

// issuedWork is the comm.Waiter of the Works Launch returns: operation id
// is job seq<<32 | bucket index.
type issuedWork struct{ h *PowerSGDHook }

func (w *issuedWork) job(id uint64) (*job, uint64, error) {
	h := w.h
	k, seq := int(id&(1<<32-1)), id>>32
	h.mu.Lock()
	defer h.mu.Unlock()
	if k >= len(h.jobs) {
		return nil, 0, fmt.Errorf("%w: powersgd has launched no bucket %d", comm.ErrInvalid, k)
	}
	j := h.jobs[k]
	if j.seq != seq {
		// An earlier step's: the Reducer launches a bucket again only
		// once its previous reduction has completed.
		return nil, 0, h.err
	}
	return j, seq, nil
}

func (w *issuedWork) WaitOp(ctx context.Context, id uint64) error {
	j, seq, err := w.job(id)
	if j == nil {
		return err
	}
	for j.published.Load() != seq {
		select {
		case <-j.ready:
			select { // leave the token for other waiters
			case j.ready <- struct{}{}:
			default:
			}
		case <-ctx.Done():
			return fmt.Errorf("hooks: powersgd: waiting for bucket %d: %w", id&(1<<32-1), context.Cause(ctx))
		}
	}
	if j.err != nil {
		return j.err
	}
	return j.final.Wait(ctx)
}

func (w *issuedWork) TestOp(id uint64) (bool, error) {
	j, seq, err := w.job(id)
	if j == nil {
		return true, err
	}
	if j.published.Load() != seq {
		return false, nil
	}
	if j.err != nil {
		return true, j.err
	}
	return j.final.Test()
}
