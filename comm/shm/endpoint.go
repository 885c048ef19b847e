package shm

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/invariants"
)

// Flags say how a rank takes part in a collective; they travel in its
// header.
type Flags uint8

const (
	// Invalid: the rank's call is invalid; the adapter keeps its error.
	// Every rank fails the collective.
	Invalid Flags = 1 << iota
	// Staged: the rank staged its input with its call, and computes its
	// own output from every rank's staged input (Endpoint.FinishStaged).
	Staged
	// Direct: the rank published a descriptor of its buffers; every rank
	// reduces a slice of every buffer in place (Endpoint.Share).
	Direct
)

// path names the way flags f take part, for errors.
func (f Flags) path() string {
	switch {
	case f&Staged != 0:
		return "staged"
	case f&Direct != 0:
		return "direct"
	}
	return "neither staged nor direct"
}

// Phase is how far a rank has gone in a collective: the low two bits of
// its header's word, under the collective's number.
type Phase uint64

const (
	// Called: the call is published, with its staged input or its
	// descriptor.
	Called Phase = 1
	// Agreed: a direct collective's rank says whether it could map every
	// peer's buffers (Agree), for adapters whose Mapper can fail.
	Agreed Phase = 2
	// Shared: a direct collective's slice is written into every rank's
	// buffer; past it the rank touches no peer's buffer.
	Shared Phase = 3
)

// Endpoint is one rank's side of a segment: the protocol's steps as this
// rank takes them. None of its methods waits, reads a clock or makes a
// system call: they read and write the segment and return, and the
// adapter decides how to wait between them. One goroutine at a time
// takes a rank's steps (the one that holds the collective; see Claim).
type Endpoint struct {
	s    *Segment
	rank int
	n    int
	red  reducer
}

// Endpoint returns rank r's endpoint.
func (s *Segment) Endpoint(r int) *Endpoint {
	if r < 0 || r >= s.l.Ranks {
		panic(fmt.Sprintf("shm: rank %d of a segment of %d ranks", r, s.l.Ranks))
	}
	return &Endpoint{s: s, rank: r, n: s.l.Ranks, red: newReducer(s.l.Ranks)}
}

// Rank returns the endpoint's rank.
func (e *Endpoint) Rank() int { return e.rank }

// StagedBytes is the size of the input a rank stages for call c in a
// group of n ranks: every block of a ReduceScatter, nothing for a
// Barrier.
func StagedBytes(c comm.Call, n int) int { return stagedBytes(c.Kind, c.DType, c.Count, n) }

func stagedBytes(kind comm.Kind, dt comm.DType, count, n int) int {
	b := count * dt.Size()
	switch kind {
	case comm.KindBarrier:
		return 0
	case comm.KindReduceScatter:
		return b * n
	}
	return b
}

// Publish publishes this rank's call c of collective k, phase Called: the
// call in its header of parity k%2 and, with Staged, its input copied
// from send (none for a Barrier, nor for a Broadcast off its root); with
// Direct, the descriptor d. The word goes last. The caller must have
// completed collective k-1, so that every peer has read what this rank
// published for k-2 in the same places.
func (e *Endpoint) Publish(k uint64, c comm.Call, f Flags, send unsafe.Pointer, d *Desc) {
	h := e.s.header(e.rank, k)
	if invariants.Enabled {
		// Not in every build: loading the line before writing it costs a
		// second transfer of it between cores.
		if w := h.word.Load(); w>>2 >= k {
			invariants.Violated("shm", "rank %d publishes collective #%d over #%d", e.rank, k, w>>2)
		}
	}
	h.kind, h.op, h.dt, h.flags = c.Kind, c.Op, c.DType, f
	h.root, h.count, h.seq = int64(c.Root), int64(c.Count), c.Seq
	switch {
	case f&Invalid != 0:
	case f&Staged != 0:
		if c.Kind == comm.KindBroadcast && c.Root != e.rank {
			break
		}
		b := StagedBytes(c, e.n)
		if b > e.s.l.Stage && b > InlineBytes {
			// Checked always: the alternative is a write past the buffer.
			panic(fmt.Sprintf("shm: rank %d stages %d bytes of %s #%d in a %d-byte buffer", e.rank, b, c.Kind, k, e.s.l.Stage))
		}
		Move(e.input(e.rank, k, h), send, b)
	case f&Direct != 0:
		*e.s.desc(e.rank, k) = *d
	}
	h.word.Store(k<<2 | uint64(Called))
}

// input is where rank r's input of staged collective k (whose header h
// says how large it is) lies.
func (e *Endpoint) input(r int, k uint64, h *header) unsafe.Pointer {
	if stagedBytes(h.kind, h.dt, int(h.count), e.n) <= InlineBytes {
		return unsafe.Pointer(&h.data[0])
	}
	return e.s.stage(r, k)
}

// Lagging returns the first rank from rank from on that has not reached
// phase ph of collective k, or the rank count if every one has. A wait
// passes the rank it returned as from to its next look.
func (e *Endpoint) Lagging(k uint64, ph Phase, from int) int {
	t := k<<2 | uint64(ph)
	for r := from; r < e.n; r++ {
		if e.s.header(r, k).word.Load() < t {
			return r
		}
	}
	return e.n
}

// Published returns the number of the last collective rank r has
// published its call of.
func (s *Segment) Published(r int) uint64 {
	return max(s.header(r, 0).word.Load(), s.header(r, 1).word.Load()) >> 2
}

// InvalidError is the verdict on a collective that some ranks called with
// invalid arguments; the adapter, which keeps each rank's error, says
// what they were. It wraps comm.ErrInvalid.
type InvalidError struct {
	Collective uint64
	Ranks      []int
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("%v: collective #%d: invalid call on rank(s) %v", comm.ErrInvalid, e.Collective, e.Ranks)
}

func (e *InvalidError) Unwrap() error { return comm.ErrInvalid }

// Judge compares every rank's call of collective k, which every rank has
// published (Lagging(k, Called, 0) is the rank count). It returns nil if
// they agree, an *InvalidError if some rank's call is invalid, and
// otherwise comm.MismatchError's error. Every rank reads the same calls
// and reaches the same verdict. Agreement allocates nothing.
func (e *Endpoint) Judge(k uint64) error {
	h0 := e.s.header(0, k)
	agree, invalid, paths := true, false, true
	for r := range e.n {
		h := e.s.header(r, k)
		invalid = invalid || h.flags&Invalid != 0
		agree = agree && h.call().Matches(h0.call())
		paths = paths && h.flags == h0.flags
	}
	switch {
	case invalid:
		v := &InvalidError{Collective: k}
		for r := range e.n {
			if e.s.header(r, k).flags&Invalid != 0 {
				v.Ranks = append(v.Ranks, r)
			}
		}
		return v
	case agree && paths:
		return nil
	case agree:
		// The same calls, staged on some ranks and direct on others: a
		// staged rank would read a direct one's stale staging buffer, a
		// direct one follow a staged one's stale descriptor.
		var b strings.Builder
		for r := range e.n {
			fmt.Fprintf(&b, "; rank %d: %s", r, e.s.header(r, k).flags.path())
		}
		return fmt.Errorf("%w: collective #%d: the ranks took different paths%s", comm.ErrMismatch, k, b.String())
	}
	calls := make([]comm.Call, e.n)
	for r := range e.n {
		calls[r] = e.s.header(r, k).call()
	}
	return comm.MismatchError(k, calls)
}

// FinishStaged computes this rank's output of staged collective k into
// recv, from every rank's staged input in rank order, once the calls
// agree (Judge). It touches no peer's memory but what the peers staged,
// and writes only recv.
func (e *Endpoint) FinishStaged(k uint64, recv unsafe.Pointer) {
	me := e.s.header(e.rank, k)
	c := me.call()
	n := e.n
	sz := c.DType.Size()
	r := &e.red
	in := func(j int) unsafe.Pointer { return e.input(j, k, e.s.header(j, k)) }
	switch c.Kind {
	case comm.KindAllReduce:
		for j := range n {
			r.srcs[j] = in(j)
		}
		r.dsts[0] = recv
		r.reduceInto(r.dsts[:1], r.srcs[:n], c.DType, c.Op, c.Count, false)
	case comm.KindReduce:
		if c.Root != e.rank {
			return
		}
		for j := range n {
			r.srcs[j] = in(j)
		}
		r.dsts[0] = recv
		r.reduceInto(r.dsts[:1], r.srcs[:n], c.DType, c.Op, c.Count, false)
	case comm.KindBroadcast:
		if c.Root != e.rank {
			Move(recv, in(c.Root), c.Count*sz)
		}
	case comm.KindAllGather:
		for j := range n {
			Move(unsafe.Add(recv, j*c.Count*sz), in(j), c.Count*sz)
		}
	case comm.KindReduceScatter:
		for j := range n {
			r.srcs[j] = unsafe.Add(in(j), e.rank*c.Count*sz)
		}
		r.dsts[0] = recv
		r.reduceInto(r.dsts[:1], r.srcs[:n], c.DType, c.Op, c.Count, false)
	}
}

// Gate states: the low two bits of the head's gate word.
const (
	gateCancel = 0
	gateGo     = 3
)

// Open opens the gate of direct collective k, which every rank has
// published and whose calls agree, unless some rank has cancelled it
// first. It reports whether the collective goes ahead (the first of Open
// and Cancel decides, for every rank) and whether this call decided, so
// that one rank, not every one, wakes the others.
func (e *Endpoint) Open(k uint64) (open, decided bool) {
	m, decided := e.s.gate(k, gateGo)
	return m == gateGo, decided
}

// Cancel cancels direct collective k, unless some rank has opened it
// first: a rank whose wait for the calls failed does so, so that nobody
// writes its buffers after its operation has failed. It reports whether
// the collective is cancelled, and whether this call decided.
func (e *Endpoint) Cancel(k uint64) (cancelled, decided bool) {
	m, decided := e.s.gate(k, gateCancel)
	return m == gateCancel, decided
}

// gate sets the gate to k with mode unless it holds k or a later
// collective already, and returns the mode it holds for k and whether
// this call set it.
func (s *Segment) gate(k uint64, mode uint64) (uint64, bool) {
	g := &s.head().gate
	for {
		cur := g.Load()
		if cur>>2 > k {
			panic(fmt.Sprintf("shm: gate of direct collective #%d asked after #%d", k, cur>>2))
		}
		if cur>>2 == k {
			return cur & 3, false
		}
		if g.CompareAndSwap(cur, k<<2|mode) {
			return mode, true
		}
	}
}

// Agree publishes phase Agreed of direct collective k, whose calls agree
// (Judge): ok says whether this rank could map every peer's buffers. An
// adapter whose Mapper can fail (processes, mapping each other's memory)
// takes this step between Judge and Open, waits until every rank has
// reached Agreed, and asks Agreement: if any rank could not map, none
// shares, and every rank leaves the collective to another path.
func (e *Endpoint) Agree(k uint64, ok bool) {
	h := e.s.header(e.rank, k)
	h.ok = ok
	h.word.Store(k<<2 | uint64(Agreed))
}

// Agreement reports whether every rank could map every peer's buffers of
// direct collective k: every rank has reached Agreed, and every rank
// reads the same answer.
func (e *Endpoint) Agreement(k uint64) bool {
	for r := range e.n {
		if !e.s.header(r, k).ok {
			return false
		}
	}
	return true
}

// Mapper makes a rank's descriptor of its buffers into addresses in this
// process. Local is the Mapper of ranks that share an address space.
type Mapper interface {
	Map(rank int, d *Desc) (send, recv unsafe.Pointer)
}

// Local maps a descriptor to the addresses it holds.
var Local Mapper = local{}

type local struct{}

func (local) Map(_ int, d *Desc) (send, recv unsafe.Pointer) {
	// Read as pointers, not converted from integers: the buffers are the
	// peers' live memory in this address space, kept alive by their
	// operations until these complete.
	return *(*unsafe.Pointer)(unsafe.Pointer(&d.Send)), *(*unsafe.Pointer)(unsafe.Pointer(&d.Recv))
}

// LocalDesc describes buffers send and recv of this address space, for
// Local.
func LocalDesc(send, recv unsafe.Pointer) Desc { return Desc{Send: uintptr(send), Recv: uintptr(recv)} }

// Share does this rank's slice of direct collective k, which Open let
// through, reading and writing every rank's buffers as m maps them, and
// then publishes phase Shared. The collective is complete on every rank
// once every rank has reached Shared (Lagging); until then no rank may
// reuse its buffers.
func (e *Endpoint) Share(k uint64, m Mapper) {
	me := e.s.header(e.rank, k)
	c := me.call()
	n := e.n
	sz := c.DType.Size()
	r := &e.red
	for j := range n {
		r.sends[j], r.recvs[j] = m.Map(j, e.s.desc(j, k))
	}
	p := e.rank
	switch c.Kind {
	case comm.KindAllReduce:
		lo, hi := Split(c.Count, sz, p, n)
		for j := range n {
			r.srcs[j] = unsafe.Add(r.sends[j], lo*sz)
			r.dsts[j] = unsafe.Add(r.recvs[j], lo*sz)
		}
		r.reduceInto(r.dsts[:n], r.srcs[:n], c.DType, c.Op, hi-lo, (hi-lo)*sz >= e.s.l.streamMin())
	case comm.KindReduce:
		lo, hi := Split(c.Count, sz, p, n)
		for j := range n {
			r.srcs[j] = unsafe.Add(r.sends[j], lo*sz)
		}
		r.dsts[0] = unsafe.Add(r.recvs[c.Root], lo*sz)
		r.reduceInto(r.dsts[:1], r.srcs[:n], c.DType, c.Op, hi-lo, false)
	case comm.KindBroadcast:
		lo, hi := Split(c.Count, sz, p, n)
		src := unsafe.Add(r.sends[c.Root], lo*sz)
		for j := range n {
			if j != c.Root {
				Move(unsafe.Add(r.recvs[j], lo*sz), src, (hi-lo)*sz)
			}
		}
	case comm.KindAllGather:
		for j := range n {
			Move(unsafe.Add(r.recvs[j], p*c.Count*sz), r.sends[p], c.Count*sz)
		}
	case comm.KindReduceScatter:
		for j := range n {
			r.srcs[j] = unsafe.Add(r.sends[j], p*c.Count*sz)
		}
		r.dsts[0] = r.recvs[p]
		r.reduceInto(r.dsts[:1], r.srcs[:n], c.DType, c.Op, c.Count, false)
	}
	clear(r.sends)
	clear(r.recvs)
	me.word.Store(k<<2 | uint64(Shared))
}

// Split returns part p of parts of count elements of sz bytes, with part
// boundaries on 64-byte multiples, so that no two ranks write one cache
// line of a 64-byte-aligned buffer.
func Split(count, sz, p, parts int) (lo, hi int) {
	if parts == 1 {
		return 0, count
	}
	align := max(line/sz, 1)
	per := (count + parts - 1) / parts
	per = (per + align - 1) / align * align
	lo = min(p*per, count)
	hi = min(lo+per, count)
	return lo, hi
}
