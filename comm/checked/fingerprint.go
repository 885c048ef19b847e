package checked

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// A fingerprint is one rank's description of one call, as 8 int64 words:
// what must agree across ranks (the call's kind, op, dtype, count and
// root), the collective's number (or the message's on its pair), the
// rank's sequence number for the report, and the reason the call is
// invalid on this rank, if it is, with the values the reason names. Every
// rank decodes every rank's fingerprint and so builds the same verdict and
// the same message.
const (
	words = 8
	// recBytes is the size of one fingerprint record.
	recBytes = words * 8
	// magic marks a fingerprint, so that a record that is not one (ranks
	// whose exchanges paired with something else) is seen as such.
	magic = 0x6464_7067_6368_6b31 // "ddpgchk1"
)

// A reason says why a call is invalid; the fingerprint carries it with
// two values, so every rank can describe another rank's invalid call.
type reason uint8

const (
	valid reason = iota
	badDType
	badCount
	nilAddr
	badOp
	badRoot
	badPair     // AllReduce, Reduce on root: recv differs from send
	badGather   // AllGather: recv is not Size times send
	badScatter  // ReduceScatter: send is not Size times recv
	overlapping // AllReduce: send and recv overlap without being one buffer
	badPeer
)

// buffer names, for the reasons that name one
var bufNames = [...]string{"send", "recv", "buf"}

// fingerprint is a decoded record.
type fingerprint struct {
	ok     bool // the record is a fingerprint
	num    uint64
	call   comm.Call
	reason reason
	a, b   int64
}

// encode writes f at the start of rec.
func encode(rec []byte, f *fingerprint) {
	w := (*[words]int64)(unsafe.Pointer(&rec[0]))
	w[0] = magic
	w[1] = int64(f.num)
	w[2] = int64(f.call.Seq)
	w[3] = int64(f.call.Kind) | int64(f.call.Op)<<8 | int64(f.call.DType)<<16 | int64(f.reason)<<24
	w[4] = int64(f.call.Count)
	w[5] = int64(f.call.Root)
	w[6] = f.a
	w[7] = f.b
}

// decode reads the record at the start of rec.
func decode(rec []byte) fingerprint {
	w := (*[words]int64)(unsafe.Pointer(&rec[0]))
	if w[0] != magic {
		return fingerprint{}
	}
	return fingerprint{
		ok:  true,
		num: uint64(w[1]),
		call: comm.Call{
			Seq:   uint64(w[2]),
			Kind:  comm.Kind(w[3]),
			Op:    comm.Op(w[3] >> 8),
			DType: comm.DType(w[3] >> 16),
			Count: int(w[4]),
			Root:  int(w[5]),
		},
		reason: reason(w[3] >> 24),
		a:      w[6],
		b:      w[7],
	}
}

// invalidText says why f's call is invalid in a group of n ranks; the rank
// that made the call and every rank that decodes its fingerprint say the
// same.
func (f *fingerprint) invalidText(n int) string {
	c := &f.call
	switch f.reason {
	case badDType:
		return fmt.Sprintf("%s has dtype %s", bufNames[f.a], comm.DType(f.b))
	case badCount:
		return fmt.Sprintf("%s has count %d", bufNames[f.a], f.b)
	case nilAddr:
		return fmt.Sprintf("%s has count %d and a nil address", bufNames[f.a], f.b)
	case badOp:
		return fmt.Sprintf("reduction op %s", c.Op)
	case badRoot:
		return fmt.Sprintf("root %d out of range for %d ranks", c.Root, n)
	case badPeer:
		if int(f.a) == int(f.b) {
			return fmt.Sprintf("peer %d is the rank itself", f.a)
		}
		return fmt.Sprintf("peer %d out of range for %d ranks", f.a, n)
	case badPair:
		return fmt.Sprintf("recv is %d x %s, send is %d x %s", f.a, comm.DType(f.b), c.Count, c.DType)
	case badGather:
		return fmt.Sprintf("recv is %d x %s, want %d x %s", f.a, comm.DType(f.b), n*c.Count, c.DType)
	case badScatter:
		return fmt.Sprintf("send is %d x %s, want %d x %s", f.a, comm.DType(f.b), n*c.Count, c.DType)
	case overlapping:
		return "send and recv overlap without being the same buffer"
	}
	return fmt.Sprintf("reason %d", f.reason)
}

// check finds why the call o of rank rank in a group of n ranks is
// invalid, if it is: the rules of the comm contract, which every backend
// enforces, checked here so that a call invalid on some ranks fails on
// every rank instead of hanging the others in the backend. What only a
// backend knows (which memory it accepts) stays the backend's to check.
func (o *op) check(rank, n int) {
	f := &o.fp
	set := func(r reason, a, b int64) {
		if f.reason == valid {
			f.reason, f.a, f.b = r, a, b
		}
	}
	buf := func(i int, b comm.Buffer) {
		switch {
		case !b.DType.Valid():
			set(badDType, int64(i), int64(b.DType))
		case b.Count < 0:
			set(badCount, int64(i), int64(b.Count))
		case b.Count > 0 && b.Addr == nil:
			set(nilAddr, int64(i), int64(b.Count))
		}
	}
	c := &f.call
	switch c.Kind {
	case comm.KindSend, comm.KindRecv:
		if c.Root < 0 || c.Root >= n || c.Root == rank {
			set(badPeer, int64(c.Root), int64(rank))
		}
		buf(2, o.send)
		return
	case comm.KindBroadcast:
		buf(2, o.send)
	case comm.KindBarrier:
		return
	default:
		buf(0, o.send)
		if c.Kind != comm.KindReduce || c.Root == rank {
			buf(1, o.recv)
		}
	}
	if (c.Kind == comm.KindAllReduce || c.Kind == comm.KindReduce || c.Kind == comm.KindReduceScatter) && !c.Op.Valid() {
		set(badOp, 0, 0)
	}
	if (c.Kind == comm.KindBroadcast || c.Kind == comm.KindReduce) && (c.Root < 0 || c.Root >= n) {
		set(badRoot, 0, 0)
	}
	s, r := o.send, o.recv
	switch c.Kind {
	case comm.KindAllReduce:
		if r.Count != s.Count || r.DType != s.DType {
			set(badPair, int64(r.Count), int64(r.DType))
		} else if comm.Overlap(s, r) {
			set(overlapping, 0, 0)
		}
	case comm.KindReduce:
		if c.Root == rank && (r.Count != s.Count || r.DType != s.DType) {
			set(badPair, int64(r.Count), int64(r.DType))
		}
	case comm.KindAllGather:
		if r.Count != n*s.Count || r.DType != s.DType {
			set(badGather, int64(r.Count), int64(r.DType))
		}
	case comm.KindReduceScatter:
		if s.Count != n*r.Count || s.DType != r.DType {
			set(badScatter, int64(s.Count), int64(s.DType))
		}
	}
}

// collectiveVerdict returns the error every rank reports for collective
// number num, given every rank's fingerprint, or nil when the calls agree
// and are valid.
func collectiveVerdict(num uint64, fps []fingerprint) error {
	n := len(fps)
	invalid := false
	for r := range fps {
		switch {
		case !fps[r].ok:
			return fmt.Errorf("%w: collective #%d: rank %d sent no fingerprint: the ranks' operations are out of step (a collective issued outside the wrapper?)", comm.ErrMismatch, num, r)
		case fps[r].num != num:
			return outOfStep(num, fps)
		case fps[r].reason != valid:
			invalid = true
		}
	}
	if invalid {
		return invalidCalls(num, fps)
	}
	for r := 1; r < n; r++ {
		if !fps[r].call.Matches(fps[0].call) {
			calls := make([]comm.Call, n)
			for q := range fps {
				calls[q] = fps[q].call
			}
			return comm.MismatchError(num, calls)
		}
	}
	return nil
}

// outOfStep is the verdict on ranks at different collectives.
func outOfStep(num uint64, fps []fingerprint) error {
	var b strings.Builder
	for q := range fps {
		fmt.Fprintf(&b, "; rank %d is at collective #%d: %s", q, fps[q].num, fps[q].call)
	}
	return fmt.Errorf("%w: collective #%d: the ranks are at different collectives%s", comm.ErrMismatch, num, b.String())
}

// invalidCalls is the verdict on a collective some ranks called wrongly.
func invalidCalls(num uint64, fps []fingerprint) error {
	var ranks []int
	var b strings.Builder
	for r := range fps {
		if fps[r].reason != valid {
			ranks = append(ranks, r)
			fmt.Fprintf(&b, "; rank %d: %s: %s", r, fps[r].call, fps[r].invalidText(len(fps)))
		}
	}
	return fmt.Errorf("%w: collective #%d: invalid call on rank(s) %v%s", comm.ErrInvalid, num, ranks, b.String())
}

// messageVerdict returns the error both ends of a message report, given
// the sender's and the receiver's fingerprints, or nil when they agree
// and are valid.
func messageVerdict(src, dst int, send, recv *fingerprint, n int) error {
	switch {
	case !send.ok || !recv.ok || send.call.Kind != comm.KindSend || recv.call.Kind != comm.KindRecv || send.num != recv.num:
		return fmt.Errorf("%w: between ranks %d and %d: rank %d's %s (message #%d) met rank %d's %s (message #%d): the ranks' messages are out of step",
			comm.ErrMismatch, src, dst, src, send.call, send.num, dst, recv.call, recv.num)
	case send.reason != valid || recv.reason != valid:
		say := func(f *fingerprint) string {
			if f.reason == valid {
				return "<nil>"
			}
			return f.invalidText(n)
		}
		return fmt.Errorf("%w: message %d from rank %d to rank %d: send (seq %d): %s; recv (seq %d): %s", comm.ErrInvalid, send.num, src, dst, send.call.Seq, say(send), recv.call.Seq, say(recv))
	}
	return comm.MessageMismatchError(send.num, src, dst, send.call, recv.call)
}
