package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// Sizes of the segment's parts.
const (
	line = 64
	page = 4096
	// InlineBytes is the largest input a header carries itself: a peer's
	// one read of the header's line brings the call and the input.
	InlineBytes = 24
	// DescBytes is the size of a rank's descriptor of a direct
	// collective's buffers (Desc).
	DescBytes = 128
	// offsets inside a rank's part
	offClosed = 2 * line
	offDesc   = 4 * line
	offStage  = 8 * line
)

// Layout is the shape of a segment: how many ranks share it, and how large
// each of a rank's two staging buffers is.
type Layout struct {
	Ranks int
	// Stage is the size of a staging buffer: the largest input a staged
	// collective may stage (every block of a ReduceScatter counted).
	Stage int
	// StreamMin is the size of a rank's slice of a two-rank direct float32
	// sum or average, out of place on both ranks, from which Share writes
	// both outputs with streaming (non-temporal) stores (package
	// internal/reduce says when that pays): 0 means DefaultStreamMin, a
	// negative value never.
	StreamMin int
}

// DefaultStreamMin is Layout.StreamMin's default, the threshold mpi's
// former C kernel used: from 512 KiB slices (a 1 MiB all-reduce of two
// ranks) its streamed stores measured faster than ordinary ones, below
// it slower (docs/lab/small-messages.md). Not measured again for the Go
// kernels.
const DefaultStreamMin = 512 << 10

// streamMin is l.StreamMin with its default.
func (l Layout) streamMin() int {
	switch {
	case l.StreamMin == 0:
		return DefaultStreamMin
	case l.StreamMin < 0:
		return int(^uint(0) >> 1)
	}
	return l.StreamMin
}

// stageBytes is Stage rounded up to whole cache lines.
func (l Layout) stageBytes() int { return roundUp(l.Stage, line) }

// stride is the size of a rank's part, whole pages so that no two ranks'
// parts share one.
func (l Layout) stride() int { return roundUp(offStage+2*l.stageBytes(), page) }

// Size is the number of bytes a segment of this layout takes.
func (l Layout) Size() int { return page + l.Ranks*l.stride() }

func (l Layout) validate() error {
	if l.Ranks < 1 || l.Ranks > MaxRanks {
		return fmt.Errorf("%w: shm: %d ranks, want 1 to %d", comm.ErrInvalid, l.Ranks, MaxRanks)
	}
	if l.Stage < 0 || l.Stage > MaxStage {
		return fmt.Errorf("%w: shm: staging buffers of %d bytes, want 0 to %d", comm.ErrInvalid, l.Stage, MaxStage)
	}
	return nil
}

// Limits of a layout.
const (
	MaxRanks = 1 << 16
	MaxStage = 1 << 30
)

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// Segment is the memory every rank of a group shares, as this process sees
// it: the group's head (the gate of direct collectives) on the first page,
// then one part per rank. A rank's part holds its two headers (parities 0
// and 1) on the first two cache lines, its two descriptors of direct
// collectives from offDesc, and its two staging buffers from offStage.
// Whatever the memory is (the Go heap, or a file every process maps), the
// segment only reads and writes it with ordinary and atomic loads and
// stores.
type Segment struct {
	base   unsafe.Pointer
	l      Layout
	stride int    // l.stride()
	stageB int    // l.stageBytes()
	mem    []byte // the Go-heap memory of NewHeap, kept alive
	mapped []byte // the mapping of Create or Open
	fd     int    // the memfd of Create until CloseFile; -1 otherwise
}

// NewHeap returns a segment of layout l in this process's memory, for
// ranks that are goroutines of one process.
func NewHeap(l Layout) (*Segment, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	mem := make([]byte, l.Size()+page)
	off := (page - int(uintptr(unsafe.Pointer(&mem[0]))%page)) % page
	s, err := Over(unsafe.Pointer(&mem[off]), l.Size(), l)
	if err != nil {
		return nil, err
	}
	s.mem = mem
	return s, nil
}

// Over returns the segment of layout l at base, size bytes of zeroed,
// page-aligned memory that every rank maps (each at its own address).
func Over(base unsafe.Pointer, size int, l Layout) (*Segment, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	if uintptr(base)%page != 0 || size < l.Size() {
		return nil, fmt.Errorf("%w: shm: %d bytes at %p for a segment of %d bytes (%d ranks, %d-byte staging), page-aligned",
			comm.ErrInvalid, size, base, l.Size(), l.Ranks, l.Stage)
	}
	return &Segment{base: base, l: l, stride: l.stride(), stageB: l.stageBytes(), fd: -1}, nil
}

// Layout returns the segment's layout.
func (s *Segment) Layout() Layout { return s.l }

// atomic32 is the futex word's type.
type atomic32 = atomic.Uint32

// head is the group's part of the segment, each word on a line of its
// own.
type head struct {
	// gate is the number of the last direct collective opened or
	// cancelled, times 4, plus gateGo or gateCancel.
	gate atomic.Uint64
	_    [line - 8]byte
	// arrivals counts the publications of ranks that wait with Futex
	// (Endpoint.Notify): the futex word their sleepers wait on.
	arrivals atomic32
	_        [line - 4]byte
	// sleepers counts the ranks asleep on arrivals.
	sleepers atomic.Uint32
	_        [line - 4]byte
	// abort is 0, or 1 + the rank that aborted the group, with
	// abortWriting set while that rank writes cause.
	abort atomic.Uint32
	_     [4]byte
	cause [causeBytes]byte
}

const causeBytes = 248

var _ [page - unsafe.Sizeof(head{})]byte // the head fits its page

func (s *Segment) head() *head { return (*head)(s.base) }

func (s *Segment) part(r int) unsafe.Pointer { return unsafe.Add(s.base, page+r*s.stride) }

// header is rank r's header of parity k%2.
func (s *Segment) header(r int, k uint64) *header {
	return (*header)(unsafe.Add(s.part(r), int(k%2)*line))
}

// Desc is rank r's descriptor of its buffers of direct collective k, for
// an adapter's Mapper to prepare before Share (every rank has published
// k).
func (s *Segment) Desc(r int, k uint64) *Desc { return s.desc(r, k) }

// closedMark is rank r's word that says it has closed its communicator:
// its peers' waits for it end at once.
func (s *Segment) closedMark(r int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Add(s.part(r), offClosed))
}

// desc is rank r's descriptor of parity k%2.
func (s *Segment) desc(r int, k uint64) *Desc {
	return (*Desc)(unsafe.Add(s.part(r), offDesc+int(k%2)*DescBytes))
}

// stage is rank r's staging buffer of parity k%2.
func (s *Segment) stage(r int, k uint64) unsafe.Pointer {
	return unsafe.Add(s.part(r), offStage+int(k%2)*s.stageB)
}

// header is a rank's publication of its call of a collective: what must
// agree across ranks, and for a staged collective its input when it fits.
// Peers read the rest once word says the phase they wait for; the rank
// writes word last. One cache line, so a peer's one read brings the call
// and a small input.
type header struct {
	word  atomic.Uint64 // k<<2 | phase
	kind  comm.Kind
	op    comm.Op
	dt    comm.DType
	flags Flags
	ok    bool // phase Agreed: the rank mapped every peer's buffers
	_     [3]byte
	root  int64
	count int64
	seq   uint64
	data  [InlineBytes]byte
}

// header must be exactly one cache line.
var (
	_ [line - unsafe.Sizeof(header{})]byte
	_ [unsafe.Sizeof(header{}) - line]byte
)

// call is the call h publishes.
func (h *header) call() comm.Call {
	return comm.Call{Kind: h.kind, Op: h.op, DType: h.dt, Count: int(h.count), Root: int(h.root), Seq: h.seq}
}

// Call returns rank r's call of collective k as it published it: valid
// once the rank has reached phase Called of k, until it publishes k+2. An
// adapter's error messages may name what a peer called.
func (s *Segment) Call(r int, k uint64) comm.Call { return s.header(r, k).call() }

// Desc is a rank's description of the buffers of a direct collective:
// for ranks of one address space the addresses themselves (Local); an
// adapter whose ranks are processes encodes what its Mapper needs to map
// them.
type Desc struct {
	Send, Recv uintptr
	Extra      [DescBytes - 16]byte
}

var (
	_ [DescBytes - unsafe.Sizeof(Desc{})]byte
	_ [unsafe.Sizeof(Desc{}) - DescBytes]byte
)
