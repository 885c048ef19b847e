package ddp

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bucket"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
)

// Sharded optimizer state (ZeRO stage 1): what callers see is in the
// package documentation, "Sharded optimizer state"; this is how.
//
// Each bucket of N ranks is laid out as N equal blocks of per elements
// (padded with zeros at the end, or between the ranks' parameters with
// ShardParams), and the hook reduce-scatters it in place: block r of rank
// r's bucket receives the average. The padding is zero on every rank and
// nothing writes it, so it reduces and gathers to zero. Once the caller
// has stepped its part of bucket k, Gather copies the updated values of
// that part into block r (the averaged gradients there are spent) and
// publishes the bucket; the launcher all-gathers published buckets in
// place, in index order, after the step's last reduce-scatter, which
// keeps the order of collectives the same on every rank whatever the
// timing of each rank's optimizer; the finisher waits for them as for
// the buckets; WaitGather copies every other rank's part out of the
// bucket into the caller's values.
//
// Those two copies move, together, as many bytes as the all-gather
// itself, which in shared memory is a copy too. Values removes both: it
// lays the parameters out in memory of the Reducer's own, one block per
// bucket shaped as the bucket, and when every value slice Gather is
// given for bucket k is that memory, the all-gather runs in place there
// (direct) and nothing is copied.

// ShardMode selects whether and how Options.Shard partitions the
// optimizer's work across ranks.
type ShardMode uint8

const (
	// ShardOff: every rank receives every averaged gradient (an
	// all-reduce per bucket) and steps every parameter.
	ShardOff ShardMode = iota
	// ShardElements partitions each bucket by elements, as DeepSpeed's
	// ZeRO does: rank r owns elements [r·c, (r+1)·c) of the bucket, c
	// the bucket's element count divided by N and rounded up, so a
	// parameter may be split between ranks. For elementwise optimizers
	// (SGD, momentum, Adam, AdamW). A rank's share of each bucket is at
	// most one element above 1/N of it.
	ShardElements
	// ShardParams partitions each bucket by whole parameters, as
	// PyTorch's ZeroRedundancyOptimizer does (greedily, largest first,
	// to the least loaded rank): for optimizers that need a whole tensor
	// (LAMB's and LARS's norms, Shampoo). A rank's share of each bucket
	// is at most 1/N of it plus its largest parameter; the bucket's
	// memory is N times the largest share. Among ranks equally loaded in
	// a bucket, the parameter goes to the one that owns least of the
	// model so far, so that no rank collects the largest parameter of
	// every bucket.
	ShardParams
)

func (m ShardMode) String() string {
	switch m {
	case ShardOff:
		return "ShardOff"
	case ShardElements:
		return "ShardElements"
	case ShardParams:
		return "ShardParams"
	}
	return fmt.Sprintf("ShardMode(%d)", uint8(m))
}

// Part is the elements [Lo, Hi) of parameter Param that this rank owns
// under Options.Shard: once its bucket is reduced, the gradient holds
// the average there (Grad(Param)[Lo:Hi]), and this rank alone steps
// those elements of the parameter and keeps their optimizer state.
type Part struct {
	Param  int
	Lo, Hi int
}

// Owned returns the parts of bucket k that this rank owns under
// Options.Shard, in the bucket's order: the Reducer's own slice, the same
// in every step (Shard keeps the layout); do not modify it. It returns
// nil without Options.Shard or for a bucket index out of range. Every
// element of every parameter is owned by exactly one rank.
func (r *Reducer) Owned(k int) []Part {
	L := r.lay.Load()
	if L == nil || L.shard == nil || k < 0 || k >= len(L.buckets) {
		return nil
	}
	return L.shard.owned[k]
}

// Values returns parameter i's values in memory of the Reducer's own,
// under Options.Shard: a slice of the parameter's length, laid out with
// the others as the buckets are. Give the slices to Gather as its
// values (values[i] = Values(i) for every parameter of the bucket) and
// the all-gather runs in place there: Gather copies nothing into the
// bucket and WaitGather nothing out of it. With any other slices Gather
// copies, as its documentation says; both give the same bits.
//
// The memory is taken from the pool at the first call (one block per
// bucket, as large as the bucket) and zeroed; the same slice comes back
// at every call. Copy the parameters' initial values in before the first
// step, and read the model's parameters from these slices. Gather's rules
// hold for them: untouched from Gather to the return of WaitGather, since
// the all-gather writes the other ranks' parts. After a failed step the
// parts not gathered are undefined, and a collective still in flight may
// write them until Close returns; after Close the memory is the pool's
// again: copy the values out before Close (as for Grad's slices).
//
// Values fails with ErrOptions without Options.Shard, ErrIndex for an
// index out of range, ErrClosed after Close, and with the pool's error
// when it cannot hold the memory. It may be called from any goroutine.
func (r *Reducer) Values(i int) ([]float32, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	L := r.lay.Load()
	rank := r.c.Rank()
	switch {
	case L.shard == nil:
		return nil, fmt.Errorf("%w: rank %d: Values(%d) needs Options.Shard", ErrOptions, rank, i)
	case i < 0 || i >= len(r.params):
		return nil, fmt.Errorf("%w: rank %d: Values(%d) with %d parameters", ErrIndex, rank, i, len(r.params))
	}
	m := L.shard.mem.Load()
	if m == nil {
		var err error
		if m, err = r.makeValues(L); err != nil {
			return nil, err
		}
	}
	return m.views[i], nil
}

// Gather publishes this rank's part of bucket k's parameters: it copies
// the owned elements (Owned(k)) of values, the parameters this rank has
// just stepped, into the bucket, whose averaged gradients there are then
// spent, and has the bucket all-gathered, so that every rank receives
// every rank's part. values[i] holds parameter i (as in
// BroadcastParameters); Gather reads only the owned elements of bucket
// k's parameters, and WaitGather writes the others. Where values[i] is
// Values(i) for every parameter i of the bucket, nothing is copied: the
// all-gather runs in place in that memory, and writes the others. It
// never waits for the network: the launcher issues the all-gathers, in
// bucket order, once the step's last bucket has been launched for
// reduction.
//
// Gather may be called, for each bucket of a synced step, once the
// bucket is reduced: inside WaitEach's each (the gather of bucket k then
// overlaps the reduction and the optimizer of later buckets) or after
// Wait, from any goroutine, and must return before WaitGather is called.
// values must stay untouched, and the bucket's gradients unread, until
// WaitGather returns (Grad fails with ErrBusy meanwhile). It fails with
// ErrOptions without Options.Shard, ErrNoStep outside a synced step,
// ErrIndex for a bucket out of range, ErrBusy before the bucket is
// reduced, ErrGather for a bucket already gathered in this step, and
// ErrGradSize for values of the wrong length.
func (r *Reducer) Gather(k int, values [][]float32) error {
	if err := r.usable(); err != nil {
		return err
	}
	L := r.lay.Load()
	rank := r.c.Rank()
	switch {
	case L.shard == nil:
		return fmt.Errorf("%w: rank %d: Gather(%d) needs Options.Shard", ErrOptions, rank, k)
	case r.state.Load() != syncing:
		return fmt.Errorf("%w: rank %d: Gather(%d) outside a synced step (the last was step %d)", ErrNoStep, rank, k, r.stepNo)
	case k < 0 || k >= len(L.buckets):
		return fmt.Errorf("%w: rank %d: Gather(%d): the layout has %d buckets", ErrIndex, rank, k, len(L.buckets))
	case k >= int(r.reduced.Load()):
		return fmt.Errorf("%w: rank %d step %d: Gather(%d): bucket %d (%s) is not reduced yet; gather it once WaitEach reports it, or after Wait",
			ErrBusy, rank, r.stepNo, k, k, L.describe(k, r.params))
	case L.sched.isPublished(k):
		return fmt.Errorf("%w: rank %d step %d: Gather(%d): bucket %d (%s) is gathered already in this step", ErrGather, rank, r.stepNo, k, k, L.describe(k, r.params))
	case len(values) != len(r.params):
		return fmt.Errorf("%w: rank %d: Gather(%d): %d value slices for %d parameters", ErrGradSize, rank, k, len(values), len(r.params))
	}
	for _, p := range L.buckets[k].Tensors {
		if n := r.tensors[p].Numel; len(values[p]) != n {
			return fmt.Errorf("%w: rank %d: Gather(%d): parameter %d (%q, shape %v) has %d elements, its value slice %d",
				ErrGradSize, rank, k, p, r.params[p].Name, r.params[p].Shape, n, len(values[p]))
		}
	}
	direct := L.shard.isValues(k, values)
	if !direct {
		for _, pt := range L.shard.owned[k] {
			copy(L.views[pt.Param][pt.Lo:pt.Hi], values[pt.Param][pt.Lo:pt.Hi])
		}
		L.shard.values[k] = values
	}
	L.shard.direct[k] = direct
	if L.sched.publish(k) != nil {
		// Gather ran concurrently with itself for bucket k: both copied
		// the same elements, one publishes.
		return fmt.Errorf("%w: rank %d step %d: Gather(%d) called twice at once", ErrGather, rank, r.stepNo, k)
	}
	r.wakeLauncher()
	return nil
}

// WaitGather ends a synced step under Options.Shard: it waits for the
// all-gathers that Gather published and copies every other rank's part
// of the parameters into the values given to Gather, bucket by bucket as
// each gather completes, on the calling goroutine (nothing for a bucket
// gathered in place into Values' memory). On return every rank holds the
// same values, and the next Begin may follow. The bucket memory then
// holds parameter values (or, gathered into Values' memory, this rank's
// averages in its part and undefined values elsewhere): a gradient slice
// read before the next Begin shows them, not gradients.
//
// WaitGather must follow Wait (or WaitEach) and a Gather of every
// bucket. If some bucket was not gathered, it fails with ErrGather
// naming them, and the step stays open: gather them and call WaitGather
// again. It honours ctx and Options.Timeout and fails, aborting the
// group, as Wait does. In a no-sync step it only ends the step, as Wait
// does.
func (r *Reducer) WaitGather(ctx context.Context) error {
	if err := r.enter(callWaitGather); err != nil {
		return err
	}
	defer r.leave()
	L := r.lay.Load()
	rank := r.c.Rank()
	if L.shard == nil {
		return fmt.Errorf("%w: rank %d: WaitGather needs Options.Shard", ErrOptions, rank)
	}
	switch r.state.Load() {
	case idle:
		return fmt.Errorf("%w: rank %d: WaitGather without a step (the last was step %d): call Begin first", ErrNoStep, rank, r.stepNo)
	case local:
		r.finish()
		return nil
	}
	if !r.gathering.Load() {
		return fmt.Errorf("%w: rank %d: WaitGather in step %d before its reduction: call Wait (or WaitEach) first", ErrStepInProgress, rank, r.stepNo)
	}
	if err := r.notGathered(L); err != nil {
		return fmt.Errorf("%w (the step stays open)", err)
	}
	return r.endGathers(ctx, L)
}

// notGathered returns the ErrGather naming the buckets of the step that
// Gather has not published, or nil.
func (r *Reducer) notGathered(L *layout) error {
	var missing []string
	for k := range L.buckets {
		if !L.sched.isPublished(k) {
			missing = append(missing, fmt.Sprint(k))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: rank %d step %d: %d of %d buckets not gathered: %s; call Gather for each",
		ErrGather, r.c.Rank(), r.stepNo, len(missing), len(L.buckets), strings.Join(missing, ", "))
}

// endGathers waits for the step's gathers, every bucket published, and
// ends the step.
func (r *Reducer) endGathers(ctx context.Context, L *layout) error {
	if err := r.waitGathers(ctx, L); err != nil {
		return err
	}
	if err := r.usable(); err != nil {
		return err
	}
	r.gathering.Store(false)
	r.finish()
	return nil
}

// waitGathers waits until every bucket's all-gather has completed,
// copying each out as it does.
func (r *Reducer) waitGathers(ctx context.Context, L *layout) error {
	watch := r.dog.Start(time.Now())
	nb := len(L.buckets)
	next := 0
	r.watch.Store(true) // the finisher pokes progress per gather
	defer r.watch.Store(false)
	for {
		for n := int(r.gathered.Load()); next < n; next++ {
			r.copyOut(L, next)
		}
		if next == nb || r.failed.Load() {
			return nil
		}
		r.timer.Reset(max(watch.Next(time.Now()), time.Nanosecond))
		select {
		case <-r.progress:
			r.timer.Stop()
		case <-r.done: // a failure
			r.timer.Stop()
		case <-ctx.Done():
			r.timer.Stop()
			if int(r.gathered.Load()) == nb {
				continue // finished as ctx ended: it stands
			}
			k := int(r.gathered.Load())
			return r.fail(fmt.Errorf("ddp: rank %d step %d: waiting for the gather of bucket %d of %d (%s): %w", r.c.Rank(), r.stepNo, k, nb, L.describe(k, r.params), ctxErr(ctx)))
		case <-r.timer.C:
			now := time.Now()
			report, expired := watch.Check(now)
			if !report && !expired {
				continue
			}
			s := r.gatherStall(L, int(r.gathered.Load()), watch.Waited(now))
			if report {
				r.dog.Report(s)
			}
			if expired && int(r.gathered.Load()) < nb {
				return r.fail(fmt.Errorf("ddp: %w", s.TimeoutError()))
			}
		}
	}
}

// gatherStall describes the wait for bucket k's all-gather.
func (r *Reducer) gatherStall(L *layout, k int, waited time.Duration) comm.Stall {
	s := comm.Stall{Rank: r.c.Rank(), Waited: waited}
	where := fmt.Sprintf("ddp step %d, gather of bucket %d of %d (%s)", r.stepNo, k, len(L.buckets), L.describe(k, r.params))
	if int(L.shard.issued.Load()) > k {
		w := L.shard.works[k]
		s.Seq = w.ID()
		s.Missing = comm.MissingRanks(r.c, w)
		s.Detail = where + ": its collective is on the wire"
		return s
	}
	s.Missing = []int{r.c.Rank()}
	s.Detail = where + ": waiting for the launcher"
	return s
}

// copyOut copies the parts of bucket k that other ranks own, now
// gathered, into the values Gather was given.
func (r *Reducer) copyOut(L *layout, k int) {
	vals := L.shard.values[k]
	if vals == nil {
		return // gathered in place into Values' memory
	}
	for _, p := range L.buckets[k].Tensors {
		lo, hi := L.shard.lo[p], L.shard.hi[p]
		copy(vals[p][:lo], L.views[p][:lo])
		copy(vals[p][hi:], L.views[p][hi:])
	}
	L.shard.values[k] = nil
}

// launchGathers issues the all-gathers that may go: published, in index
// order, once the step's last bucket is launched. It runs on the launcher.
func (r *Reducer) launchGathers(L *layout) {
	n := L.sched.gatherReady()
	if n == 0 {
		return
	}
	if n > 1 {
		comm.GroupStart(r.c)
	}
	for range n {
		k := L.sched.launchGather()
		hb := &L.hb[k]
		s := &r.cur.Buckets[k]
		s.GatherStart = time.Since(r.start)
		buf := hb.Buf
		if L.shard.direct[k] {
			buf = L.shard.mem.Load().bufs[k]
		}
		own := buf.Slice(r.c.Rank()*(buf.Count/r.c.Size()), buf.Count/r.c.Size())
		w := r.c.AllGather(own, buf)
		s.GatherBytes = int64(own.Bytes())
		L.shard.works[k] = w
		L.shard.issued.Store(int32(k + 1))
		r.fifo <- inflight{k: k, w: w, kind: kindGather}
	}
	if n > 1 {
		if err := comm.GroupEnd(r.c); err != nil {
			r.fail(fmt.Errorf("ddp: rank %d step %d: launching %d gathers as a group: %w", r.c.Rank(), r.stepNo, n, err))
			r.signal()
		}
	}
}

// finishGather records bucket k's all-gather, complete with err. It runs
// on the finisher.
func (r *Reducer) finishGather(k int, err error) {
	if err != nil {
		L := r.lay.Load()
		r.fail(fmt.Errorf("ddp: rank %d step %d: gathering the parameters of bucket %d (%s): %w", r.c.Rank(), r.stepNo, k, L.describe(k, r.params), err))
		r.signal()
		return
	}
	r.cur.Buckets[k].GatherEnd = time.Since(r.start)
	r.gathered.Add(1)
	if r.watch.Load() {
		select {
		case r.progress <- struct{}{}:
		default:
		}
	}
}

// shardLayout is a layout's partition under Options.Shard.
type shardLayout struct {
	owned  [][]Part      // per bucket: this rank's parts
	lo, hi []int         // per parameter: its owned elements (lo == hi: none)
	values [][][]float32 // per bucket: what Gather was given, until copied out (nil: direct)
	direct []bool        // per bucket: this step's Gather was given Values' memory
	works  []comm.Work   // per bucket: its all-gather in this step
	issued atomic.Int32  // all-gathers issued in this step

	// mem is Values' memory once asked for; mu orders its making with
	// its return to the pool (taken).
	mem   atomic.Pointer[valueMem]
	mu    sync.Mutex
	taken bool
}

// valueMem is the parameter memory Values hands out: a pool block per
// bucket, laid out as the bucket.
type valueMem struct {
	blocks []allocator.Block
	bufs   []comm.Buffer // per bucket: its block
	views  [][]float32   // per parameter: its slot, at its bucket offset
	params [][]int       // per bucket: its parameters
}

// isValues reports whether values holds, for every parameter of bucket
// k, the slice Values returned for it (the same first element: the
// lengths are checked already).
func (s *shardLayout) isValues(k int, values [][]float32) bool {
	m := s.mem.Load()
	if m == nil {
		return false
	}
	for _, p := range m.params[k] {
		if unsafe.SliceData(values[p]) != unsafe.SliceData(m.views[p]) {
			return false
		}
	}
	return true
}

// takeValues returns Values' blocks, for the pool, and makes later calls
// of Values fail.
func (s *shardLayout) takeValues() []allocator.Block {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taken = true
	if m := s.mem.Load(); m != nil {
		b := m.blocks
		m.blocks = nil
		return b
	}
	return nil
}

// makeValues takes Values' memory from the pool, once.
func (r *Reducer) makeValues(L *layout) (*valueMem, error) {
	s := L.shard
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.mem.Load(); m != nil {
		return m, nil
	}
	if s.taken {
		return nil, ErrClosed
	}
	m := &valueMem{bufs: make([]comm.Buffer, len(L.buckets)), views: make([][]float32, len(r.params)), params: make([][]int, len(L.buckets))}
	for k := range L.buckets {
		hb := &L.hb[k]
		blk, err := r.pool.Get(max(hb.Buf.Bytes(), 4))
		if err != nil {
			for _, b := range m.blocks {
				r.pool.Put(b)
			}
			return nil, fmt.Errorf("ddp: rank %d: memory for the values of bucket %d (%d bytes): %w", r.c.Rank(), k, hb.Buf.Bytes(), err)
		}
		m.blocks = append(m.blocks, blk)
		m.bufs[k] = r.region(blk, 0, hb.Buf.Count, comm.Float32)
		r.kern.Zero(m.bufs[k])
		for _, t := range hb.Tensors {
			m.views[t.Param] = m.bufs[k].Slice(t.Offset, r.tensors[t.Param].Numel).AsFloat32()
		}
		m.params[k] = L.buckets[k].Tensors
	}
	s.mem.Store(m)
	return m, nil
}

// place lays bucket b out for a group of n ranks under mode: the
// element offset of each of its tensors (in b.Tensors' order) and the
// elements per rank, per. The bucket then holds n·per elements, rank r's
// block being [r·per, (r+1)·per). Under ShardParams, owned[r] is what
// rank r owns of the buckets placed before b, in the layout's order, and
// place adds what it gives r of b.
func place(b bucket.Bucket, tensors []bucket.Tensor, n int, mode ShardMode, owned []int) (offs []int, per int) {
	size := b.DType.Size()
	offs = make([]int, len(b.Tensors))
	if mode == ShardElements {
		for j, o := range b.Offsets {
			offs[j] = o / size
		}
		return offs, max(1, (b.Bytes/size+n-1)/n)
	}
	// ShardParams: largest first, each to the rank least loaded in this
	// bucket, which bounds the block (the bytes each rank sends and
	// receives) by 1/N of the bucket plus its largest tensor; of those,
	// to the one that owns least of the buckets before (then the lowest),
	// which balances the optimizer's state over the whole model. Then
	// each rank's in bucket order.
	order := make([]int, len(b.Tensors))
	for j := range order {
		order[j] = j
	}
	slices.SortStableFunc(order, func(a, c int) int {
		return cmp.Compare(tensors[b.Tensors[c]].Numel, tensors[b.Tensors[a]].Numel)
	})
	owner := make([]int, len(b.Tensors))
	load := make([]int, n)
	for _, j := range order {
		r := 0
		for q := range load {
			if load[q] < load[r] || load[q] == load[r] && owned[q] < owned[r] {
				r = q
			}
		}
		owner[j] = r
		load[r] += tensors[b.Tensors[j]].Numel
		owned[r] += tensors[b.Tensors[j]].Numel
	}
	per = max(1, slices.Max(load))
	at := make([]int, n)
	for j, t := range b.Tensors {
		r := owner[j]
		offs[j] = r*per + at[r]
		at[r] += tensors[t].Numel
	}
	return offs, per
}

// ownedParts returns rank's parts of a bucket whose tensors (b.Tensors)
// start at element offsets offs, rank's block being [rank·per,
// (rank+1)·per), and records each parameter's range in lo and hi.
func ownedParts(b bucket.Bucket, tensors []bucket.Tensor, offs []int, rank, per int, lo, hi []int) []Part {
	var parts []Part
	blo, bhi := rank*per, (rank+1)*per
	for j, p := range b.Tensors {
		from, to := max(offs[j], blo), min(offs[j]+tensors[p].Numel, bhi)
		if from >= to {
			lo[p], hi[p] = 0, 0
			continue
		}
		lo[p], hi[p] = from-offs[j], to-offs[j]
		parts = append(parts, Part{Param: p, Lo: lo[p], Hi: hi[p]})
	}
	if parts == nil {
		parts = []Part{}
	}
	return parts
}

// checkShard refuses what Options.Shard cannot do yet or at all. It runs
// in prepare, once the parameters are known.
func (r *Reducer) checkShard() error {
	o, rank := &r.o, r.c.Rank()
	switch {
	case o.Shard == ShardOff:
		return nil
	case o.Shard > ShardParams:
		return fmt.Errorf("%w: rank %d: Options.Shard %v", ErrOptions, rank, o.Shard)
	case !scatters(r.hook):
		return fmt.Errorf("%w: rank %d: Options.Shard reduce-scatters each bucket, which hook %s cannot do (it is no hooks.Scatterer); use avg, allreduce, fp16 or bf16, or drop Options.Shard",
			ErrOptions, rank, r.hook.Name())
	case !r.host:
		return fmt.Errorf("%w: rank %d: Options.Shard gathers parameters through Go slices, so it needs a host pool", ErrOptions, rank)
	}
	for i, p := range r.params {
		if p.DType != comm.Float32 {
			return fmt.Errorf("%w: rank %d: parameter %d (%q) is %s: Options.Shard gathers float32 parameters only", ErrUnsupported, rank, i, p.Name, p.DType)
		}
	}
	return nil
}

// scatters reports whether h honours hooks.Bucket.Scatter.
func scatters(h hooks.Hook) bool {
	s, ok := h.(hooks.Scatterer)
	return ok && s.Scatters()
}

// stepEnd names the call that ends the synced step running: Wait, or
// under Options.Shard once the buckets are reduced, WaitGather.
func (r *Reducer) stepEnd() string {
	if r.gathering.Load() {
		return "WaitGather"
	}
	return "Wait"
}
