package inproc

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/ddpgo/ddpgo/comm"
)

// Options configures a group. The zero value gives the defaults.
type Options struct {
	// StallInterval is how long a rank waits for its peers before it
	// reports a stall, and then how often it repeats the report.
	// Zero means comm.DefaultStallInterval (60 s).
	StallInterval time.Duration
	// Timeout is how long a rank waits for its peers before the operation
	// fails with comm.ErrTimeout and the group is aborted. Zero means
	// comm.DefaultTimeout (10 min).
	Timeout time.Duration
	// OnStall receives stall reports, which name the ranks that have not
	// joined. It is called on the waiting rank's worker goroutine and must
	// not block for long or call Close. Nil logs them with the standard
	// logger.
	OnStall func(comm.Stall)
}

// watchdog returns the comm.Watchdog that o describes.
func (o Options) watchdog() comm.Watchdog {
	return comm.Watchdog{StallInterval: o.StallInterval, Timeout: o.Timeout, OnStall: o.OnStall}
}

// NewGroup returns n communicators, one per rank, with default options.
func NewGroup(n int) ([]*Comm, error) { return NewGroupWith(n, Options{}) }

// NewGroupWith returns n communicators, one per rank, configured by o.
// Each communicator starts a worker goroutine that Close stops.
func NewGroupWith(n int, o Options) ([]*Comm, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: inproc: group size %d, want at least 1", comm.ErrInvalid, n)
	}
	dog := o.watchdog()
	if err := dog.Validate(); err != nil {
		return nil, fmt.Errorf("inproc: Options: %w", err)
	}
	g := &group{n: n, dog: dog.WithDefaults(), boxes: make([]atomic.Pointer[mailbox], n*n)}
	g.tick = max(g.dog.StallInterval/4, time.Millisecond)
	for i := range g.slots {
		g.slots[i].d = make([]desc, n)
	}
	hdrs := make([]header, 2*n)
	g.comms = make([]*Comm, n)
	for r := range n {
		g.comms[r] = newComm(g, r)
		g.comms[r].hdr = [2]*header{&hdrs[2*r], &hdrs[2*r+1]}
	}
	for _, c := range g.comms {
		go c.run()
	}
	return append([]*Comm(nil), g.comms...), nil
}

// slotCount is the number of collective descriptor slots. A rank can be at
// most one collective ahead of the slowest rank, so two would do.
const slotCount = 4

// Gate modes: the low two bits of group.gate; the rest is the number of
// the last parallel collective opened or cancelled.
const (
	modeCancel = 0 // a failing rank cancelled the collective
	modeGo     = 3 // every rank does its share, then the finish barrier
)

type group struct {
	n     int
	dog   comm.Watchdog // stall reports and the timeout of every wait for peers
	tick  time.Duration // how often an idle worker looks at collectives joined inline
	comms []*Comm

	_        cpu.CacheLinePad
	gate     atomic.Uint64 // collective number << 2 | mode, of parallel collectives
	_        cpu.CacheLinePad
	fin      atomic.Uint64 // shares finished, over all ranks
	_        cpu.CacheLinePad
	sleepers atomic.Int32 // workers parked until calls are published
	_        cpu.CacheLinePad
	failed   atomic.Pointer[error]
	_        cpu.CacheLinePad

	slots [slotCount]collSlot
	boxes []atomic.Pointer[mailbox] // boxes[src*n+dst], made on first use
}

// collSlot holds the ranks' calls of a collective where the others need
// more than a header says: the buffers of a parallel collective, the
// error of an invalid call.
type collSlot struct {
	d []desc
}

// header is a rank's publication of its call of a collective: what must
// agree across ranks, and for a small collective its staged input, here
// when it fits and in the rank's staging buffer otherwise. Peers read the
// rest once word holds the collective's number; the rank writes word
// last. A rank has two, for collectives of odd and even numbers, each one
// cache line, so a peer's one read brings the call and a small input.
type header struct {
	word  atomic.Uint64
	kind  comm.Kind
	op    comm.Op
	dt    comm.DType
	flags uint8
	_     [4]byte
	root  int64
	count int64
	seq   uint64
	data  [inlineBytes]byte
}

// Header flags.
const (
	hdrInvalid = 1 << iota // the call is invalid: its error is in the collective's slot
	hdrSmall               // the rank staged its input
)

// inlineBytes is the largest input staged in the header itself.
const inlineBytes = 24

// header must be exactly one cache line.
var (
	_ [64 - unsafe.Sizeof(header{})]byte
	_ [unsafe.Sizeof(header{}) - 64]byte
)

// call is what a mismatch report says of h.
func (h *header) call() comm.Call {
	return comm.Call{Kind: h.kind, Op: h.op, DType: h.dt, Count: int(h.count), Root: int(h.root), Seq: h.seq}
}

// Mailbox states: the low two bits of mailbox.state; the rest is the
// message's number on its (src, dst) pair.
const (
	boxCancel = 0
	boxPosted = 1
	boxTaken  = 2
	boxDone   = 3
)

type mailbox struct {
	state   atomic.Uint64
	d       desc  // the sender's call
	verdict error // set by the receiver before boxDone
	_       cpu.CacheLinePad
}

// box returns the mailbox of messages from src to dst. Mailboxes are made
// on first use, so a large group pays only for the pairs that talk.
func (g *group) box(src, dst int) *mailbox {
	p := &g.boxes[src*g.n+dst]
	if b := p.Load(); b != nil {
		return b
	}
	p.CompareAndSwap(nil, new(mailbox))
	return p.Load()
}

func (g *group) failure() error {
	if p := g.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// abort records the group's first failure and wakes every worker.
func (g *group) abort(err error) {
	if g.failed.CompareAndSwap(nil, &err) {
		g.wakeAll()
	}
}

func (g *group) wake(r int) {
	c := g.comms[r]
	if c.parked.Load() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (g *group) wakeAll() {
	for r := range g.comms {
		g.wake(r)
	}
}

// small reports whether collective d moves less than parallelBytes per
// rank (counting every block of an AllGather or ReduceScatter), so that
// every rank stages its input and does its own part, rather than every
// rank taking a share of every output. An invalid call stages nothing and
// fails on every rank, whichever path it takes.
func (g *group) small(d *desc) bool {
	if d.kind == comm.KindBarrier || d.err != nil {
		return true
	}
	if d.count >= parallelBytes {
		return false
	}
	bytes := d.count * d.dt.Size()
	if d.kind == comm.KindAllGather || d.kind == comm.KindReduceScatter {
		bytes *= g.n
	}
	return bytes < parallelBytes
}

// parallelBytes is the message size from which every rank takes a share of
// a collective. Below it every rank stages its input with its call and then
// does its own part, which needs no finish barrier.
const parallelBytes = 32 << 10

// desc is one rank's call.
type desc struct {
	kind  comm.Kind
	op    comm.Op
	dt    comm.DType
	root  int    // root, or peer for Send and Recv
	count int    // the count that must agree across ranks
	num   uint64 // the collective's number in the group, or the message's on its pair
	send  unsafe.Pointer
	recv  unsafe.Pointer
	seq   uint64
	err   error // argument error found when the call was issued
	// small: a collective whose ranks each do their own part from the
	// inputs staged with the calls (below parallelBytes)
	small bool
	// inline: the issuing goroutine joined the collective itself (see
	// Comm.issue), not the rank's worker
	inline bool
	// Every rank writes its own desc into a collective's slot and reads
	// the others': two cache lines each, so that no two ranks write one.
	_ [54]byte
}

// desc must be exactly two cache lines (see its padding).
var (
	_ [128 - unsafe.Sizeof(desc{})]byte
	_ [unsafe.Sizeof(desc{}) - 128]byte
)

// call is what a mismatch report says of d.
func (d *desc) call() comm.Call {
	return comm.Call{Kind: d.kind, Op: d.op, DType: d.dt, Count: d.count, Root: d.root, Seq: d.seq}
}

// judge compares every rank's call of collective k, all published, and
// returns nil if they agree, or the error every rank reports. Every rank
// judges for itself and, reading the same calls, reaches the same verdict.
func (g *group) judge(k uint64) error {
	p := k % 2
	h0 := g.comms[0].hdr[p]
	agree := true
	for _, c := range g.comms {
		h := c.hdr[p]
		if h.flags&hdrInvalid != 0 {
			return g.invalid(k)
		}
		agree = agree && h.call().Matches(h0.call())
	}
	if agree {
		return nil
	}
	calls := make([]comm.Call, g.n)
	for r, c := range g.comms {
		calls[r] = c.hdr[p].call()
	}
	return comm.MismatchError(k, calls)
}

// invalid is the verdict on collective k when some ranks' calls are
// invalid: it names them and their errors.
func (g *group) invalid(k uint64) error {
	var ranks []int
	msg := ""
	for r, c := range g.comms {
		if c.hdr[k%2].flags&hdrInvalid != 0 {
			ranks = append(ranks, r)
			msg += fmt.Sprintf("; rank %d: %v", r, g.slots[k%slotCount].d[r].err)
		}
	}
	return fmt.Errorf("%w: collective #%d: invalid call on rank(s) %v%s", comm.ErrInvalid, k, ranks, msg)
}

// published returns the first rank from rank from on that has not yet
// published its call of collective k, or n if every one has.
func (g *group) published(k uint64, from int) int {
	p := k % 2
	for r := from; r < g.n; r++ {
		if g.comms[r].hdr[p].word.Load() != k {
			return r
		}
	}
	return g.n
}
