package inproc

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/shm"
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
	seg, err := shm.NewHeap(shm.Layout{Ranks: n, Stage: parallelBytes})
	if err != nil {
		return nil, fmt.Errorf("inproc: %w", err)
	}
	g := &group{n: n, dog: dog.WithDefaults(), seg: seg, boxes: make([]atomic.Pointer[mailbox], n*n)}
	g.tick = max(g.dog.StallInterval/4, time.Millisecond)
	for i := range g.errs {
		g.errs[i] = make([]error, n)
	}
	g.comms = make([]*Comm, n)
	for r := range n {
		g.comms[r] = newComm(g, r)
	}
	for _, c := range g.comms {
		go c.run()
	}
	return append([]*Comm(nil), g.comms...), nil
}

// slotCount is the number of collectives whose invalid calls' errors are
// kept. A rank can be at most one collective ahead of the slowest rank, so
// two would do.
const slotCount = 4

type group struct {
	n     int
	dog   comm.Watchdog // stall reports and the timeout of every wait for peers
	tick  time.Duration // how often an idle worker looks at collectives joined inline
	comms []*Comm
	seg   *shm.Segment // the ranks' headers, staging buffers and descriptors

	_        cpu.CacheLinePad
	sleepers atomic.Int32 // workers parked until calls are published
	_        cpu.CacheLinePad
	failed   atomic.Pointer[error]
	_        cpu.CacheLinePad

	// errs[k%slotCount][r] is rank r's error of collective k when its
	// call was invalid (its header says so)
	errs  [slotCount][]error
	boxes []atomic.Pointer[mailbox] // boxes[src*n+dst], made on first use
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
}

// call is what a mismatch report says of d.
func (d *desc) call() comm.Call {
	return comm.Call{Kind: d.kind, Op: d.op, DType: d.dt, Count: d.count, Root: d.root, Seq: d.seq}
}

// judge compares every rank's call of collective k, all published, and
// returns nil if they agree, or the error every rank reports (package
// shm's Judge, with the errors of invalid calls, which this package keeps).
func (c *Comm) judge(k uint64) error {
	v := c.ep.Judge(k)
	if v == nil {
		return nil
	}
	return c.g.invalid(k, v)
}

// invalid is verdict v on collective k with the errors of the invalid
// calls, which the group keeps, added.
func (g *group) invalid(k uint64, v error) error {
	var inv *shm.InvalidError
	if !errors.As(v, &inv) {
		return v
	}
	msg := ""
	for _, r := range inv.Ranks {
		msg += fmt.Sprintf("; rank %d: %v", r, g.errs[k%slotCount][r])
	}
	return fmt.Errorf("%w: collective #%d: invalid call on rank(s) %v%s", comm.ErrInvalid, k, inv.Ranks, msg)
}
