package backend

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/ddpgo/ddpgo/comm"
)

// Rules are what a call is checked against: the comm contract for the
// caller's rank in a group of Size ranks (0 <= Rank < Size), and what
// only the backend knows of the memory it carries.
type Rules struct {
	Rank, Size int
	// HostOnly refuses device memory.
	HostOnly bool
	// MaxCount, if positive, bounds a buffer's element count (MPI counts
	// are C ints).
	MaxCount int
	// OneDevice makes device memory valid only on Device, the rank's
	// device (NCCL: one GPU per rank).
	OneDevice bool
	Device    int
}

// Reason says why a call is invalid. Invalid carries it with two values,
// so that a rank can describe another rank's invalid call from a few
// integers (comm/checked sends them in its fingerprints).
type Reason uint8

// Reasons a call is invalid.
const (
	Valid       Reason = iota
	BadDType           // A: the buffer (see Invalid), B: its dtype
	BadCount           // A: the buffer, B: its count
	NilAddr            // A: the buffer, B: its count
	BadOp              // the call's op
	BadRoot            // the call's root
	BadPair            // AllReduce, Reduce on root: A, B: recv's count and dtype differ from send's
	BadGather          // AllGather: A, B: recv's count and dtype; want Size times send
	BadScatter         // ReduceScatter: A, B: send's count and dtype; want Size times recv
	Overlapping        // send and recv overlap without being the same buffer (or this rank's block)
	BadPeer            // A: the peer, B: the rank
	DeviceMem          // A: the buffer: device memory for a host-only backend
	TooMany            // A: the buffer, B: its count, above Rules.MaxCount
	BadLoc             // A: the buffer, B: its location, neither host nor device
	OtherDevice        // A: the buffer, B: its device, not Rules.Device
	TooLarge           // A: the buffer, B: its count, whose bytes do not fit between its address and the end of memory
)

// Buffer numbers, the A of the reasons that name a buffer.
const (
	SendBuf = iota
	RecvBuf
	Buf // the one buffer of Broadcast, Send and Recv
)

var bufNames = [...]string{"send", "recv", "buf"}

// Invalid says why a call is invalid; the zero value means it is valid.
type Invalid struct {
	Reason Reason
	A, B   int64
}

// OK reports whether the call is valid.
func (v Invalid) OK() bool { return v.Reason == Valid }

// Check checks call (its Kind, Op and Root; the peer of Send and Recv in
// Root) with its buffers against the rules. Broadcast, Send and Recv pass
// their one buffer as send; recv is read only where the kind has one (on
// root only, for Reduce). It returns the first reason the call is
// invalid. Every backend checks every call with it, so it takes pointers
// (nothing is copied), returns early and allocates nothing; a backend
// keeps its Rules for the communicator's life.
func (r *Rules) Check(call *comm.Call, send, recv *comm.Buffer) Invalid {
	switch call.Kind {
	case comm.KindSend, comm.KindRecv:
		if call.Root < 0 || call.Root >= r.Size || call.Root == r.Rank {
			return Invalid{BadPeer, int64(call.Root), int64(r.Rank)}
		}
		return r.buffer(Buf, send)
	case comm.KindBroadcast:
		if v := r.buffer(Buf, send); !v.OK() {
			return v
		}
		if call.Root < 0 || call.Root >= r.Size {
			return Invalid{Reason: BadRoot}
		}
		return Invalid{}
	case comm.KindBarrier:
		return Invalid{}
	}
	if v := r.buffer(SendBuf, send); !v.OK() {
		return v
	}
	onRoot := call.Kind != comm.KindReduce || call.Root == r.Rank
	if onRoot {
		if v := r.buffer(RecvBuf, recv); !v.OK() {
			return v
		}
	}
	if call.Kind != comm.KindAllGather && !call.Op.Valid() {
		return Invalid{Reason: BadOp}
	}
	switch call.Kind {
	case comm.KindAllReduce, comm.KindReduce:
		if call.Kind == comm.KindReduce && (call.Root < 0 || call.Root >= r.Size) {
			return Invalid{Reason: BadRoot}
		}
		if !onRoot {
			return Invalid{}
		}
		if recv.Count != send.Count || recv.DType != send.DType {
			return Invalid{BadPair, int64(recv.Count), int64(recv.DType)}
		}
		if !comm.InPlace(*send, *recv) && intersect(send, recv) {
			return Invalid{Reason: Overlapping}
		}
	case comm.KindAllGather:
		if !blocks(recv.Count, r.Size, send.Count) || recv.DType != send.DType {
			return Invalid{BadGather, int64(recv.Count), int64(recv.DType)}
		}
		if !OwnBlock(*send, *recv, r.Rank) && intersect(send, recv) {
			return Invalid{Reason: Overlapping}
		}
	case comm.KindReduceScatter:
		if !blocks(send.Count, r.Size, recv.Count) || send.DType != recv.DType {
			return Invalid{BadScatter, int64(send.Count), int64(send.DType)}
		}
		if !OwnBlock(*recv, *send, r.Rank) && intersect(send, recv) {
			return Invalid{Reason: Overlapping}
		}
	}
	return Invalid{}
}

// buffer checks buffer i of a call.
func (r *Rules) buffer(i int, b *comm.Buffer) Invalid {
	switch {
	case !b.DType.Valid():
		return Invalid{BadDType, int64(i), int64(b.DType)}
	case b.Count < 0:
		return Invalid{BadCount, int64(i), int64(b.Count)}
	case b.Count > 0 && b.Addr == nil:
		return Invalid{NilAddr, int64(i), int64(b.Count)}
	case !fits(b):
		return Invalid{TooLarge, int64(i), int64(b.Count)}
	case b.Loc != comm.Host && b.Loc != comm.Device:
		return Invalid{BadLoc, int64(i), int64(b.Loc)}
	case r.OneDevice && b.Loc == comm.Device && b.Device != r.Device:
		return Invalid{OtherDevice, int64(i), int64(b.Device)}
	case r.HostOnly && b.Loc != comm.Host:
		return Invalid{Reason: DeviceMem, A: int64(i)}
	case r.MaxCount > 0 && b.Count > r.MaxCount:
		return Invalid{TooMany, int64(i), int64(b.Count)}
	}
	return Invalid{}
}

// fits reports whether b's bytes (b.Count >= 0 of a valid dtype) can be
// counted in an int, and its end, one past its last byte, is an address:
// only then may the end be computed.
func fits(b *comm.Buffer) bool {
	hi, n := bits.Mul64(uint64(b.Count), uint64(b.DType.Size()))
	return hi == 0 && n <= math.MaxInt && uint64(uintptr(b.Addr)) <= uint64(^uintptr(0))-n
}

// blocks reports whether whole == size·part, exactly: the product is not
// formed where it would overflow.
func blocks(whole, size, part int) bool {
	hi, lo := bits.Mul64(uint64(size), uint64(part))
	return whole >= 0 && size >= 0 && part >= 0 && hi == 0 && lo == uint64(whole)
}

// intersect reports whether a and b, whose bytes fit (see fits), share a
// byte. Host memory is one space whatever the buffers' Device fields say;
// device memory is one space per device.
func intersect(a, b *comm.Buffer) bool {
	if a.Loc != b.Loc || a.Loc != comm.Host && a.Device != b.Device {
		return false
	}
	na, nb := uintptr(a.Bytes()), uintptr(b.Bytes())
	pa, pb := uintptr(a.Addr), uintptr(b.Addr)
	return na > 0 && nb > 0 && pa < pb+nb && pb < pa+na
}

// OwnBlock reports whether part is exactly block rank of whole (blocks of
// part's size, part not empty): the in-place form of AllGather and
// ReduceScatter.
func OwnBlock(part, whole comm.Buffer, rank int) bool {
	hi, off := bits.Mul64(uint64(rank), uint64(part.Bytes()))
	at, carry := bits.Add64(uint64(uintptr(whole.Addr)), off, 0)
	return part.Count > 0 && rank >= 0 && hi == 0 && carry == 0 &&
		part.Loc == whole.Loc && part.Device == whole.Device &&
		uint64(uintptr(part.Addr)) == at
}

// Text says why a call is invalid in a group of size ranks, from call's
// kind, op, dtype, count and root and v alone: the rank that made the call
// and any rank that is told v say the same.
func (v Invalid) Text(call comm.Call, size int) string {
	switch v.Reason {
	case Valid:
		return "valid"
	case BadDType:
		return fmt.Sprintf("%s has dtype %s", bufName(v.A), comm.DType(v.B))
	case BadCount:
		return fmt.Sprintf("%s has count %d", bufName(v.A), v.B)
	case NilAddr:
		return fmt.Sprintf("%s has count %d and a nil address", bufName(v.A), v.B)
	case BadOp:
		return fmt.Sprintf("reduction op %s", call.Op)
	case BadRoot:
		return fmt.Sprintf("root %d out of range for %d ranks", call.Root, size)
	case BadPeer:
		if v.A == v.B {
			return fmt.Sprintf("peer %d is the rank itself", v.A)
		}
		return fmt.Sprintf("peer %d out of range for %d ranks", v.A, size)
	case BadPair:
		return fmt.Sprintf("recv is %d x %s, send is %d x %s", v.A, comm.DType(v.B), call.Count, call.DType)
	case BadGather:
		return fmt.Sprintf("recv is %d x %s, want %s x %s", v.A, comm.DType(v.B), product(size, call.Count), call.DType)
	case BadScatter:
		return fmt.Sprintf("send is %d x %s, want %s x %s", v.A, comm.DType(v.B), product(size, call.Count), call.DType)
	case Overlapping:
		if call.Kind == comm.KindAllGather || call.Kind == comm.KindReduceScatter {
			return "send and recv overlap other than as this rank's block"
		}
		return "send and recv overlap without being the same buffer"
	case DeviceMem:
		return fmt.Sprintf("%s is device memory; the backend carries host buffers only", bufName(v.A))
	case TooMany:
		return fmt.Sprintf("%s has %d elements, more than the backend's counts can hold", bufName(v.A), v.B)
	case BadLoc:
		return fmt.Sprintf("%s has unknown location %d", bufName(v.A), v.B)
	case OtherDevice:
		return fmt.Sprintf("%s is memory of device %d, not the rank's", bufName(v.A), v.B)
	case TooLarge:
		return fmt.Sprintf("%s has count %d: its bytes do not fit between its address and the end of memory", bufName(v.A), v.B)
	}
	return fmt.Sprintf("reason %d", v.Reason)
}

// Err returns nil for a valid call, and otherwise an error that wraps
// comm.ErrInvalid and names the call's kind and why. For a valid call it
// is inlined to a comparison.
func (v Invalid) Err(call comm.Call, size int) error {
	if v.Reason == Valid {
		return nil
	}
	return v.err(call, size)
}

func (v Invalid) err(call comm.Call, size int) error {
	return fmt.Errorf("%w: %s: %s", comm.ErrInvalid, call.Kind, v.Text(call, size))
}

// product writes size·count, or "size·count" where the product overflows.
func product(size, count int) string {
	hi, lo := bits.Mul64(uint64(size), uint64(count))
	if size < 0 || count < 0 || hi != 0 || lo > math.MaxInt {
		return fmt.Sprintf("%d·%d", size, count)
	}
	return fmt.Sprint(lo)
}

func bufName(i int64) string {
	if i >= 0 && int(i) < len(bufNames) {
		return bufNames[i]
	}
	return fmt.Sprintf("buffer %d", i)
}
