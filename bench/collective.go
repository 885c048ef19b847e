package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// Collective names a collective operation of a sweep.
type Collective uint8

// The collectives a sweep can time, named as nccl-tests' binaries are
// (all_reduce_perf, ...).
const (
	AllReduce Collective = iota + 1
	Broadcast
	Reduce
	AllGather
	ReduceScatter
	SendRecv
)

var collectiveNames = []string{AllReduce: "allreduce", Broadcast: "broadcast", Reduce: "reduce",
	AllGather: "allgather", ReduceScatter: "reducescatter", SendRecv: "sendrecv"}

// Collectives lists every Collective.
var Collectives = []Collective{AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, SendRecv}

// String returns the name ParseCollective accepts ("allreduce", ...).
func (c Collective) String() string {
	if int(c) < len(collectiveNames) && c > 0 {
		return collectiveNames[c]
	}
	return fmt.Sprintf("Collective(%d)", uint8(c))
}

// Kind returns the comm.Kind whose bus-bandwidth factor applies.
func (c Collective) Kind() comm.Kind {
	switch c {
	case AllReduce:
		return comm.KindAllReduce
	case Broadcast:
		return comm.KindBroadcast
	case Reduce:
		return comm.KindReduce
	case AllGather:
		return comm.KindAllGather
	case ReduceScatter:
		return comm.KindReduceScatter
	case SendRecv:
		return comm.KindSend
	}
	return 0
}

// Reduces reports whether the collective applies a reduction operation.
func (c Collective) Reduces() bool { return c == AllReduce || c == Reduce || c == ReduceScatter }

// Rooted reports whether the collective has a root rank.
func (c Collective) Rooted() bool { return c == Broadcast || c == Reduce }

// ParseCollective accepts "allreduce", "broadcast", "reduce", "allgather",
// "reducescatter" and "sendrecv", with or without underscores.
func ParseCollective(s string) (Collective, error) {
	t := strings.ReplaceAll(strings.ToLower(s), "_", "")
	for _, c := range Collectives {
		if c.String() == t {
			return c, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown collective %q (want one of %s)", ErrConfig, s, strings.Join(collectiveNames[1:], ", "))
}

// ErrConfig reports an invalid benchmark configuration.
var ErrConfig = errors.New("bench: invalid configuration")

// ErrWrong reports that a checked collective produced wrong elements.
var ErrWrong = errors.New("bench: wrong results")

// CollectiveConfig configures an nccl-tests style sweep.
type CollectiveConfig struct {
	Op       Collective
	DType    comm.DType // 0 -> Float32
	RedOp    comm.Op    // 0 -> Sum
	Root     int
	MinBytes int64 // first size
	MaxBytes int64 // last size (inclusive)
	Factor   int   // size multiplier between rows, >= 2 (or 1 with Step)
	Step     int64 // additive increment when Factor is 1
	Iters    int   // timed iterations per size and placement
	Warmup   int   // untimed iterations before them
	Check    bool  // fill inputs with a pattern and count wrong elements
	// Timeout bounds each size's placement (warmup, timed loop and check)
	// on every rank; 0 means no bound beyond the caller's context.
	Timeout time.Duration
	// Average is how the ranks' times make a row's time (nccl-tests' -a);
	// the zero value is the mean, nccl-tests' default.
	Average Average
	// Device puts each rank's buffers in its device's memory, from a
	// CommPool over its communicator's own Source (DeviceMemory, as
	// nccl.Comm has), filled and read back through its kernels, as
	// nccl-tests' buffers are cudaMalloc'd. Without it the buffers are
	// host memory, which a device backend would stage: a device figure
	// must not include that.
	Device bool
}

// DeviceMemory is what a communicator offers for its collectives to run
// on device memory: a Source of that memory for a CommPool, and the
// kernels (comm.KernelSource) that reach it. nccl.Comm has both.
type DeviceMemory interface {
	comm.KernelSource
	Source() allocator.Source
}

// Average says how the ranks' times of one placement combine into its
// reported time, as nccl-tests' -a option does.
type Average uint8

// The ways of combining ranks' times. nccl-tests numbers them 0 (rank 0),
// 1 (mean), 2 (min) and 3 (max); see ParseAverage.
const (
	AverageMean Average = iota
	AverageRank0
	AverageMin
	AverageMax
)

// ParseAverage maps nccl-tests' -a values (0 rank 0, 1 mean, 2 min, 3 max)
// to an Average.
func ParseAverage(a int) (Average, error) {
	switch a {
	case 0:
		return AverageRank0, nil
	case 1:
		return AverageMean, nil
	case 2:
		return AverageMin, nil
	case 3:
		return AverageMax, nil
	}
	return 0, fmt.Errorf("%w: average %d: want 0 (rank 0), 1 (mean), 2 (min) or 3 (max)", ErrConfig, a)
}

// NCCLTests returns the -a value nccl-tests uses for a.
func (a Average) NCCLTests() int {
	return [...]int{AverageMean: 1, AverageRank0: 0, AverageMin: 2, AverageMax: 3}[a]
}

// Timing is one placement (out-of-place or in-place) of one size.
type Timing struct {
	Valid   bool          // false: the placement does not exist for this collective
	Time    time.Duration // per iteration, combined over ranks as CollectiveConfig.Average says
	AlgBW   float64       // GB/s
	BusBW   float64       // GB/s
	Wrong   int64         // wrong elements summed over ranks (when checked)
	Checked bool
}

// CollectiveRow is one size of a sweep.
type CollectiveRow struct {
	Bytes      int64 // nccl-tests' size: the larger of the send and receive buffers
	Count      int   // nccl-tests' count: the collective's count argument (per rank for all_gather and reduce_scatter)
	DType      comm.DType
	RedOp      string // "sum", ... or "none" (as nccl-tests prints it)
	Root       int    // -1 when the collective has no root
	OutOfPlace Timing
	InPlace    Timing
}

// EmulatedOutOfPlace reports whether op's out-of-place column is timed as
// a copy into the result buffer followed by the in-place collective,
// because the comm contract has only the in-place form (Broadcast; every
// other collective, AllReduce included, has a real out-of-place form).
func EmulatedOutOfPlace(op Collective) bool { return op == Broadcast }

// Sizes returns the byte sizes of a sweep, as nccl-tests walks them.
func (cfg *CollectiveConfig) Sizes() []int64 {
	var out []int64
	for s := cfg.MinBytes; s <= cfg.MaxBytes && s > 0; {
		out = append(out, s)
		// Stop before the next size would pass MaxBytes, so that a huge
		// factor or step cannot wrap around int64 into a small size again.
		if cfg.Factor > 1 {
			if s > cfg.MaxBytes/int64(cfg.Factor) {
				break
			}
			s *= int64(cfg.Factor)
		} else {
			if cfg.Step <= 0 || s > cfg.MaxBytes-cfg.Step {
				break
			}
			s += cfg.Step
		}
	}
	return out
}

func (cfg *CollectiveConfig) validate(n int) error {
	if cfg.DType == 0 {
		cfg.DType = comm.Float32
	}
	if cfg.RedOp == 0 {
		cfg.RedOp = comm.Sum
	}
	switch {
	case cfg.Op.Kind() == 0:
		return fmt.Errorf("%w: unknown collective %d", ErrConfig, cfg.Op)
	case !cfg.DType.Valid():
		return fmt.Errorf("%w: invalid dtype %d", ErrConfig, cfg.DType)
	case !cfg.RedOp.Valid():
		return fmt.Errorf("%w: invalid reduction op %d", ErrConfig, cfg.RedOp)
	case cfg.MinBytes <= 0 || cfg.MaxBytes < cfg.MinBytes:
		return fmt.Errorf("%w: sizes %d..%d: want 0 < min <= max", ErrConfig, cfg.MinBytes, cfg.MaxBytes)
	case cfg.Factor < 1 || (cfg.Factor == 1 && cfg.Step <= 0):
		return fmt.Errorf("%w: step factor %d (increment %d): want a factor >= 2, or 1 with a positive increment", ErrConfig, cfg.Factor, cfg.Step)
	case cfg.Iters < 1:
		return fmt.Errorf("%w: %d iterations, want >= 1", ErrConfig, cfg.Iters)
	case cfg.Warmup < 0:
		return fmt.Errorf("%w: %d warmup iterations, want >= 0", ErrConfig, cfg.Warmup)
	case cfg.Op.Rooted() && (cfg.Root < 0 || cfg.Root >= n):
		return fmt.Errorf("%w: root %d outside 0..%d", ErrConfig, cfg.Root, n-1)
	case n < 1:
		return fmt.Errorf("%w: no ranks", ErrConfig)
	case cfg.Op == SendRecv && n < 2:
		return fmt.Errorf("%w: sendrecv needs at least 2 ranks", ErrConfig)
	case cfg.MaxBytes/int64(cfg.DType.Size()) > math.MaxInt32:
		// Element counts are ints in the comm contract and int32 in NCCL
		// and MPI (nccl-tests' own limit): refuse what would not fit.
		return fmt.Errorf("%w: %d bytes of %s are %d elements, more than a count can hold (%d)",
			ErrConfig, cfg.MaxBytes, cfg.DType, cfg.MaxBytes/int64(cfg.DType.Size()), math.MaxInt32)
	}
	if k := cfg.NumSizes(); k > MaxSizes {
		return fmt.Errorf("%w: %d sizes from %d to %d bytes, want at most %d", ErrConfig, k, cfg.MinBytes, cfg.MaxBytes, MaxSizes)
	}
	return nil
}

// MaxSizes bounds the number of sizes of one sweep: its rows are kept
// for the footer, so their number bounds the memory of the sweep.
const MaxSizes = 1 << 16

// NumSizes returns the number of sizes the sweep walks (len(Sizes())),
// without building the list: at most MaxSizes+1, so that a step of one
// byte up to a terabyte is counted in constant time and refused.
func (cfg *CollectiveConfig) NumSizes() int {
	if cfg.MinBytes <= 0 || cfg.MaxBytes < cfg.MinBytes {
		return 0
	}
	if cfg.Factor <= 1 {
		if cfg.Step <= 0 {
			return 1
		}
		k := (cfg.MaxBytes-cfg.MinBytes)/cfg.Step + 1
		return int(min(k, MaxSizes+1))
	}
	k := 0
	for s := cfg.MinBytes; ; s *= int64(cfg.Factor) {
		k++
		if s > cfg.MaxBytes/int64(cfg.Factor) {
			return k
		}
	}
}

// geometry returns, for a requested size, the element counts nccl-tests
// uses: count is the element count of the larger buffer and per the count
// each rank contributes to (all_gather) or receives from (reduce_scatter)
// the gather and scatter collectives, which nccl-tests rounds down to a
// multiple of 16 bytes ((count/nranks) & -(16/eltSize)); for the other
// collectives per is count.
func geometry(op Collective, dt comm.DType, size int64, n int) (count, per int) {
	count = int(size / int64(dt.Size()))
	if op == AllGather || op == ReduceScatter {
		align := max(1, 16/dt.Size())
		per = count / n
		per -= per % align
		return per * n, per
	}
	return count, count
}

// corruptHook, when set by a test, damages a rank's result buffer after a
// checked collective, before it is verified.
var corruptHook func(rank int, inPlace bool, out comm.Buffer)

// RunCollective runs the sweep on the group comms (one Communicator per
// rank, all of one group, each driven from its own goroutine) and calls
// row, if not nil, as each size completes. Every rank issues the same
// sequence. Each iteration is issued and waited before the next (a CPU
// backend has no stream to queue work on); a placement's time is the
// timed loop divided by Iters, combined over the ranks as cfg.Average
// says (the mean by default, as nccl-tests).
//
// comms may also be the one rank this process runs of a job with a
// process per rank (mpirun): every process then calls RunCollective, and
// after each placement the ranks' times and wrong counts are gathered
// with a small AllGather over the communicator, so every process returns
// the rows of the whole group.
func RunCollective(ctx context.Context, comms []comm.Communicator, cfg CollectiveConfig, row func(CollectiveRow)) ([]CollectiveRow, error) {
	n, launched, err := worldOf(comms)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(n); err != nil {
		return nil, err
	}
	sizes := cfg.Sizes()
	maxCount, _ := geometry(cfg.Op, cfg.DType, sizes[len(sizes)-1], n)
	es := cfg.DType.Size()
	var ranks []*rankBufs
	var release func()
	if cfg.Device {
		ranks, release, err = newDeviceBufs(comms, maxCount*es)
	} else {
		ranks, release, err = newRankBufs(len(comms), maxCount*es, comm.HostSourceOf(comms[0]))
	}
	if err != nil {
		return nil, err
	}
	defer release()
	var ex *exchange
	if launched {
		if ex, err = newExchange(comms[0], 2); err != nil {
			return nil, err
		}
		defer ex.close()
	}
	var rows []CollectiveRow
	for _, size := range sizes {
		count, per := geometry(cfg.Op, cfg.DType, size, n)
		if per == 0 {
			continue
		}
		// nccl-tests' count column is the count passed to the collective:
		// per rank for all_gather and reduce_scatter.
		res := CollectiveRow{Bytes: int64(count * es), Count: per, DType: cfg.DType, RedOp: "none", Root: -1}
		// sendrecv_perf prints the -o operation though nothing is reduced;
		// the other collectives without a reduction print "none".
		if cfg.Op.Reduces() || cfg.Op == SendRecv {
			res.RedOp = cfg.RedOp.String()
		}
		if cfg.Op.Rooted() {
			res.Root = cfg.Root
		}
		for _, inPlace := range []bool{false, true} {
			if inPlace && cfg.Op == SendRecv {
				continue // a rank cannot send and receive one buffer at once
			}
			// A collective that completes without blocking may not look
			// at ctx: stop between placements once it is done.
			if err := ctx.Err(); err != nil {
				return rows, err
			}
			t, err := runPlacement(ctx, comms, ranks, &cfg, count, per, inPlace, ex)
			if err != nil {
				return rows, fmt.Errorf("bench: %s %d bytes (%s): %w", cfg.Op, res.Bytes, placeName(inPlace), err)
			}
			if inPlace {
				res.InPlace = t
			} else {
				res.OutOfPlace = t
			}
		}
		rows = append(rows, res)
		if row != nil {
			row(res)
		}
	}
	return rows, nil
}

func placeName(inPlace bool) string {
	if inPlace {
		return "in-place"
	}
	return "out-of-place"
}

// rankBufs is one rank's buffers and its outcome in the current
// placement.
type rankBufs struct {
	// send and recv are the buffers' bytes: views of host pool blocks,
	// or, for device buffers, host copies that fillInputs writes and
	// uploads, and into which the result is downloaded to be checked.
	send, recv []byte
	// sendBuf and recvBuf are the buffers as collectives take them
	// (Uint8, the whole size); kern is set for device buffers.
	sendBuf, recvBuf comm.Buffer
	kern             comm.Kernels
	elapsed          time.Duration
	wrong            int64
	err              error
	// pending is an operation whose Wait ended with its context: the
	// backend may still write its buffers until it completes.
	pending    comm.Work
	hasPending bool
}

// drainTimeout bounds the wait, after an aborted or interrupted
// placement, for the operations still pending: an aborted backend
// completes them within a bound it documents (seconds); past this one the
// buffers are leaked rather than reused.
const drainTimeout = 30 * time.Second

// newRankBufs returns a send and a receive buffer of size bytes for each
// of n ranks, from a CommPool over src (nil: HostSource; the
// communicator's own host memory where it has one, comm.HostSourceOf)
// (collectives take pool memory, never Go heap memory), and the function
// that returns them. A buffer whose
// operation may still be pending is never returned to the pool.
func newRankBufs(n, size int, src allocator.Source) ([]*rankBufs, func(), error) {
	// Two blocks per rank, all carved from one slab sized for them (not
	// the default 64 MiB: a sweep of small sizes maps, and under the
	// invariants tag poisons, only what it uses). The limit is that slab
	// and a page of rounding.
	per := int64(size+allocator.Alignment-1) &^ (allocator.Alignment - 1)
	slab := 2 * int64(n) * per
	if slab > math.MaxInt-(1<<20) {
		return nil, nil, fmt.Errorf("bench: %d ranks x 2 buffers of %d bytes: more than an address space holds", n, size)
	}
	pool, err := allocator.New(allocator.Options{Source: src, Limit: slab + 1<<20, SlabSize: int(slab)})
	if err != nil {
		return nil, nil, fmt.Errorf("bench: CommPool for %d ranks of 2 x %d bytes: %w", n, size, err)
	}
	var blocks []allocator.Block
	ranks := make([]*rankBufs, n)
	release := func() {
		for i, b := range blocks {
			if rb := ranks[i/2]; rb == nil || !rb.drained() {
				continue // the backend may still write it: leak it
			}
			pool.Put(b)
		}
		pool.Close() // a leaked block keeps its slab mapped
	}
	for r := range ranks {
		for range 2 {
			b, err := pool.Get(size)
			if err != nil {
				release()
				return nil, nil, fmt.Errorf("bench: rank %d: a buffer of %d bytes (%d ranks x 2): %w", r, size, n, err)
			}
			blocks = append(blocks, b)
		}
		rb := &rankBufs{send: blocks[2*r].Bytes()[:size:size], recv: blocks[2*r+1].Bytes()[:size:size]}
		rb.sendBuf = comm.HostBuffer(blocks[2*r].Addr(), size, comm.Uint8)
		rb.recvBuf = comm.HostBuffer(blocks[2*r+1].Addr(), size, comm.Uint8)
		ranks[r] = rb
	}
	return ranks, release, nil
}

// newDeviceBufs is newRankBufs in each rank's device memory: a CommPool
// per rank over its communicator's Source, and host copies of both
// buffers to fill and check them.
func newDeviceBufs(comms []comm.Communicator, size int) ([]*rankBufs, func(), error) {
	per := int64(size+allocator.Alignment-1) &^ (allocator.Alignment - 1)
	if 2*per > math.MaxInt-(1<<20) {
		return nil, nil, fmt.Errorf("bench: 2 buffers of %d bytes: more than an address space holds", size)
	}
	pools := make([]*allocator.Pool, len(comms))
	blocks := make([][2]allocator.Block, len(comms))
	ranks := make([]*rankBufs, len(comms))
	release := func() {
		for i, p := range pools {
			if p == nil {
				continue
			}
			if rb := ranks[i]; rb == nil || rb.drained() {
				for _, b := range blocks[i] {
					if b.Addr() != nil {
						p.Put(b)
					}
				}
			}
			p.Close() // a leaked block keeps its slab mapped
		}
	}
	for r, c := range comms {
		dm, ok := c.(DeviceMemory)
		if !ok {
			release()
			return nil, nil, fmt.Errorf("%w: device buffers need a communicator with device memory (DeviceMemory); rank %d's (%s) has none",
				ErrConfig, c.Rank(), comm.CapsOf(c).Backend)
		}
		p, err := allocator.New(allocator.Options{Source: dm.Source(), Limit: 2*per + 1<<20, SlabSize: int(2 * per)})
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("bench: rank %d: a device CommPool of 2 x %d bytes: %w", c.Rank(), size, err)
		}
		pools[r] = p
		rb := &rankBufs{send: make([]byte, size), recv: make([]byte, size), kern: dm.Kernels()}
		for i, dst := range []*comm.Buffer{&rb.sendBuf, &rb.recvBuf} {
			b, err := p.Get(size)
			if err != nil {
				release()
				return nil, nil, fmt.Errorf("bench: rank %d: a device buffer of %d bytes: %w", c.Rank(), size, err)
			}
			blocks[r][i] = b
			*dst = comm.Buffer{Addr: b.Addr(), Count: size, DType: comm.Uint8, Loc: comm.Device, Device: comm.DeviceOf(c)}
		}
		ranks[r] = rb
	}
	return ranks, release, nil
}

// typed returns the first elems elements of dt of b (a Uint8 buffer).
func typed(b comm.Buffer, elems int, dt comm.DType) comm.Buffer {
	b.Count, b.DType = elems, dt
	if elems == 0 {
		b.Addr = nil
	}
	return b
}

// wait waits for w, remembering it if ctx ends first.
func (b *rankBufs) wait(ctx context.Context, w comm.Work) error {
	err := w.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		b.pending, b.hasPending = w, true
	}
	return err
}

// drained waits (bounded) for an operation left pending, and reports
// whether the backend is done with the rank's buffers.
func (b *rankBufs) drained() bool {
	if !b.hasPending {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := b.pending.Wait(ctx); err != nil && ctx.Err() != nil {
		return false
	}
	b.hasPending = false
	return true
}

// issueFunc returns the call one rank makes for one iteration, and the
// buffer that holds that rank's result (Count 0 when the rank has none).
func issueFunc(c comm.Communicator, b *rankBufs, cfg *CollectiveConfig, count, per int, inPlace bool) (issue func() comm.Work, out comm.Buffer) {
	r, n := c.Rank(), c.Size()
	dt := cfg.DType
	send, recv := typed(b.sendBuf, count, dt), typed(b.recvBuf, count, dt)
	es := dt.Size()
	switch cfg.Op {
	case AllReduce:
		if inPlace {
			return func() comm.Work { return c.AllReduce(recv, recv, cfg.RedOp) }, recv
		}
		return func() comm.Work { return c.AllReduce(send, recv, cfg.RedOp) }, recv
	case Broadcast:
		if inPlace || r != cfg.Root {
			return func() comm.Work { return c.Broadcast(recv, cfg.Root) }, recv
		}
		if b.kern != nil {
			// On the device stream, ordered before the broadcast.
			return func() comm.Work {
				b.kern.Copy(recv, send)
				return c.Broadcast(recv, cfg.Root)
			}, recv
		}
		return func() comm.Work {
			copy(b.recv[:count*es], b.send[:count*es])
			return c.Broadcast(recv, cfg.Root)
		}, recv
	case Reduce:
		out := recv
		if r != cfg.Root {
			out = comm.Buffer{DType: dt}
		}
		if inPlace {
			return func() comm.Work { return c.Reduce(recv, recv, cfg.RedOp, cfg.Root) }, out
		}
		return func() comm.Work { return c.Reduce(send, recv, cfg.RedOp, cfg.Root) }, out
	case AllGather:
		s := typed(b.sendBuf, per, dt)
		if inPlace {
			s = recv.Slice(r*per, per)
		}
		return func() comm.Work { return c.AllGather(s, recv) }, recv
	case ReduceScatter:
		o := typed(b.recvBuf, per, dt)
		if inPlace {
			o = send.Slice(r*per, per)
		}
		return func() comm.Work { return c.ReduceScatter(send, o, cfg.RedOp) }, o
	case SendRecv:
		to, from := (r+1)%n, (r-1+n)%n
		// Send and Recv are rendezvous operations run in issue order, so
		// a ring alternates: even ranks send first, odd ranks receive
		// first (with an odd number of ranks, the last even rank's send
		// waits for rank 0's, which completes against rank 1).
		if r%2 == 0 {
			return func() comm.Work {
				sw := c.Send(send, to)
				return joinWork(sw, c.Recv(recv, from))
			}, recv
		}
		return func() comm.Work {
			rw := c.Recv(recv, from)
			return joinWork(rw, c.Send(send, to))
		}, recv
	}
	panic("unreachable")
}

// joinWork waits for a and then b.
func joinWork(a, b comm.Work) comm.Work { return comm.NewWork(pair{a, b}, 0) }

type pair struct{ a, b comm.Work }

func (p pair) WaitOp(ctx context.Context, _ uint64) error {
	return errors.Join(p.a.Wait(ctx), p.b.Wait(ctx))
}

func (p pair) TestOp(uint64) (bool, error) {
	da, ea := p.a.Test()
	db, eb := p.b.Test()
	return da && db, errors.Join(ea, eb)
}

func runPlacement(ctx context.Context, comms []comm.Communicator, ranks []*rankBufs, cfg *CollectiveConfig, count, per int, inPlace bool, ex *exchange) (Timing, error) {
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	var wg sync.WaitGroup
	for i, c := range comms {
		b := ranks[i]
		b.elapsed, b.wrong, b.err = 0, 0, nil
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.err = runRank(ctx, c, b, cfg, count, per, inPlace)
			if b.err != nil {
				// Release the other ranks from the collective this one left.
				c.Abort(fmt.Errorf("rank %d failed: %w", c.Rank(), b.err))
			}
		}()
	}
	wg.Wait()
	bytes := int64(count * cfg.DType.Size())
	if ex == nil {
		return combine(ranks, cfg, bytes)
	}
	// One rank of a launched job: its own outcome, then everyone's.
	b := ranks[0]
	if b.err != nil {
		return Timing{}, b.err
	}
	all, err := ex.gather(ctx, float64(b.elapsed), float64(b.wrong))
	if err != nil {
		return Timing{}, err
	}
	group := make([]*rankBufs, ex.n)
	for r := range group {
		group[r] = &rankBufs{elapsed: time.Duration(all[2*r]), wrong: int64(all[2*r+1])}
	}
	return combine(group, cfg, bytes)
}

// combine makes one placement's Timing from every rank's: the time is
// combined as cfg.Average says (by default the mean over ranks, as
// nccl-tests), wrong elements are summed, and the bandwidths are those of
// bytes in that time.
func combine(ranks []*rankBufs, cfg *CollectiveConfig, bytes int64) (Timing, error) {
	t := Timing{Valid: true, Checked: cfg.Check}
	var sum time.Duration
	lo, hi := ranks[0].elapsed, ranks[0].elapsed
	errs := make([]error, len(ranks))
	for i, b := range ranks {
		errs[i] = b.err
		sum += b.elapsed
		lo, hi = min(lo, b.elapsed), max(hi, b.elapsed)
		t.Wrong += b.wrong
	}
	if err := firstErr(errs); err != nil {
		return t, err // the root cause rather than the aborts it caused
	}
	switch cfg.Average {
	case AverageRank0:
		t.Time = ranks[0].elapsed
	case AverageMin:
		t.Time = lo
	case AverageMax:
		t.Time = hi
	default:
		t.Time = sum / time.Duration(len(ranks))
	}
	t.AlgBW = comm.AlgBW(bytes, t.Time)
	t.BusBW = comm.BusBW(cfg.Op.Kind(), len(ranks), bytes, t.Time)
	return t, nil
}

func runRank(ctx context.Context, c comm.Communicator, b *rankBufs, cfg *CollectiveConfig, count, per int, inPlace bool) error {
	issue, out := issueFunc(c, b, cfg, count, per, inPlace)
	p := pattern{dt: cfg.DType, n: c.Size()}
	// Timed data: the pattern too, so that reductions over it stay finite.
	p.fillInputs(cfg, b, c.Rank(), count, per, inPlace)
	for range cfg.Warmup {
		if err := b.wait(ctx, issue()); err != nil {
			return err
		}
	}
	if err := b.wait(ctx, c.Barrier()); err != nil {
		return err
	}
	start := time.Now()
	for range cfg.Iters {
		if err := b.wait(ctx, issue()); err != nil {
			return err
		}
	}
	b.elapsed = time.Since(start) / time.Duration(cfg.Iters)
	if !cfg.Check {
		return nil
	}
	// One more iteration on fresh inputs, verified element by element.
	p.fillInputs(cfg, b, c.Rank(), count, per, inPlace)
	if err := b.wait(ctx, c.Barrier()); err != nil {
		return err
	}
	if err := b.wait(ctx, issue()); err != nil {
		return err
	}
	if b.kern != nil {
		out = b.download(out)
	}
	if corruptHook != nil {
		corruptHook(c.Rank(), inPlace, out)
	}
	b.wrong = p.check(cfg, c.Rank(), out, per)
	return nil
}

// upload copies the host copies of a device rank's buffers (what
// fillInputs wrote, count elements of dt) into the device buffers.
func (b *rankBufs) upload(count int, dt comm.DType) {
	n := count * dt.Size()
	b.kern.Upload(typed(b.sendBuf, n, comm.Uint8), b.send[:n])
	b.kern.Upload(typed(b.recvBuf, n, comm.Uint8), b.recv[:n])
}

// download copies out (device memory) into the host copy of the receive
// buffer, whose filled values the check no longer needs, and returns it
// as a host Buffer.
func (b *rankBufs) download(out comm.Buffer) comm.Buffer {
	if out.Count == 0 {
		return comm.Buffer{DType: out.DType}
	}
	h := b.recv[:out.Bytes()]
	b.kern.Download(h, out)
	return comm.HostBuffer(unsafe.Pointer(unsafe.SliceData(h)), out.Count, out.DType)
}

// pattern is the data of a checked collective: element i of rank r's
// input is a small integer, so that sums over ranks are exact in every
// dtype (bfloat16 holds integers exactly up to 256).
type pattern struct {
	dt comm.DType
	n  int
}

// garbage marks output elements that the collective must overwrite.
const garbage = 99

// value returns rank r's input element i.
func (p pattern) value(r, i int) int64 {
	v := int64((i*7 + r*3) % 9)
	if p.dt == comm.Uint8 {
		return v
	}
	return v - 4
}

// expected returns element i of the result of red over all ranks' inputs.
func (p pattern) expected(red comm.Op, i int) float64 {
	acc := p.value(0, i)
	for r := 1; r < p.n; r++ {
		v := p.value(r, i)
		switch red {
		case comm.Sum, comm.Avg:
			acc += v
		case comm.Max:
			acc = max(acc, v)
		case comm.Min:
			acc = min(acc, v)
		}
	}
	if p.dt == comm.Uint8 && red != comm.Max && red != comm.Min {
		acc &= 0xff
	}
	if red != comm.Avg {
		return float64(acc)
	}
	if !p.dt.IsFloat() {
		return float64(acc / int64(p.n)) // truncation, as integers divide
	}
	return float64(acc) / float64(p.n)
}

func (p pattern) fillInputs(cfg *CollectiveConfig, b *rankBufs, r, count, per int, inPlace bool) {
	if b.kern != nil {
		defer b.upload(count, p.dt)
	}
	es := p.dt.Size()
	switch cfg.Op {
	case AllReduce, Reduce, ReduceScatter:
		if inPlace && cfg.Op != ReduceScatter {
			p.fill(b.recv[:count*es], r, 0)
		} else {
			p.fill(b.send[:count*es], r, 0)
			p.fillConst(b.recv[:count*es], garbage)
		}
	case Broadcast:
		p.fillConst(b.recv[:count*es], garbage)
		if r == cfg.Root {
			if inPlace {
				p.fill(b.recv[:count*es], r, 0)
			} else {
				p.fill(b.send[:count*es], r, 0)
			}
		}
	case AllGather:
		p.fillConst(b.recv[:count*es], garbage)
		if inPlace {
			p.fill(b.recv[r*per*es:(r+1)*per*es], r, 0)
		} else {
			p.fill(b.send[:per*es], r, 0)
		}
	case SendRecv:
		p.fill(b.send[:count*es], r, 0)
		p.fillConst(b.recv[:count*es], garbage)
	}
}

// fill writes rank r's pattern into buf, element i holding value(r, base+i).
func (p pattern) fill(buf []byte, r, base int) {
	n := len(buf) / p.dt.Size()
	for i := range n {
		p.set(buf, i, p.value(r, base+i))
	}
}

func (p pattern) fillConst(buf []byte, v int64) {
	n := len(buf) / p.dt.Size()
	for i := range n {
		p.set(buf, i, v)
	}
}

func (p pattern) set(buf []byte, i int, v int64) {
	comm.PutElem(p.dt, buf[i*p.dt.Size():], float64(v))
}

func (p pattern) get(buf []byte, i int) float64 {
	return comm.Elem(p.dt, buf[i*p.dt.Size():])
}

// tolerance is the error allowed for an average, which is not an integer;
// every other result is compared exactly.
func (p pattern) tolerance(red comm.Op, want float64) float64 {
	if red != comm.Avg || !p.dt.IsFloat() {
		return 0
	}
	rel := map[comm.DType]float64{comm.Float32: 1e-6, comm.Float64: 1e-12, comm.Float16: 1e-3, comm.BFloat16: 8e-3}[p.dt]
	return rel * max(1, math.Abs(want))
}

// check counts the elements of out that differ from the exact result.
func (p pattern) check(cfg *CollectiveConfig, r int, out comm.Buffer, per int) int64 {
	if out.Count == 0 {
		return 0
	}
	buf := out.AsBytes()
	var wrong int64
	for i := range out.Count {
		var want float64
		switch cfg.Op {
		case AllReduce, Reduce:
			want = p.expected(cfg.RedOp, i)
		case ReduceScatter:
			want = p.expected(cfg.RedOp, r*per+i)
		case Broadcast:
			want = float64(p.value(cfg.Root, i))
		case AllGather:
			want = float64(p.value(i/per, i%per))
		case SendRecv:
			want = float64(p.value((r-1+p.n)%p.n, i))
		}
		got := p.get(buf, i)
		if !(math.Abs(got-want) <= p.tolerance(cfg.RedOp, want)) {
			wrong++
		}
	}
	return wrong
}

// AvgBusBW returns the mean bus bandwidth over every valid timing of rows,
// as nccl-tests' "Avg bus bandwidth" footer.
func AvgBusBW(rows []CollectiveRow) float64 {
	var sum float64
	var k int
	for _, r := range rows {
		for _, t := range []Timing{r.OutOfPlace, r.InPlace} {
			if t.Valid {
				sum += t.BusBW
				k++
			}
		}
	}
	if k == 0 {
		return 0
	}
	return sum / float64(k)
}

// WrongTests returns the number of checked placements (one size, out of
// place or in place) that had at least one wrong element: what
// nccl-tests' "Out of bounds values" footer counts.
func WrongTests(rows []CollectiveRow) int {
	var k int
	for _, r := range rows {
		for _, t := range []Timing{r.OutOfPlace, r.InPlace} {
			if t.Valid && t.Wrong > 0 {
				k++
			}
		}
	}
	return k
}

// WrongTotal returns the wrong elements over all rows.
func WrongTotal(rows []CollectiveRow) int64 {
	var w int64
	for _, r := range rows {
		w += r.OutOfPlace.Wrong + r.InPlace.Wrong
	}
	return w
}
