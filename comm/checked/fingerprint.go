package checked

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
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

// fingerprint is a decoded record.
type fingerprint struct {
	ok   bool // the record is a fingerprint
	num  uint64
	call comm.Call
	// why the call is invalid on its rank, with the values the reason
	// names (backend.Check's rulebook, which every backend enforces)
	inv backend.Invalid
}

// encode writes f at the start of rec.
func encode(rec []byte, f *fingerprint) {
	w := (*[words]int64)(unsafe.Pointer(&rec[0]))
	w[0] = magic
	w[1] = int64(f.num)
	w[2] = int64(f.call.Seq)
	w[3] = int64(f.call.Kind) | int64(f.call.Op)<<8 | int64(f.call.DType)<<16 | int64(f.inv.Reason)<<24
	w[4] = int64(f.call.Count)
	w[5] = int64(f.call.Root)
	w[6] = f.inv.A
	w[7] = f.inv.B
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
		inv: backend.Invalid{Reason: backend.Reason(w[3] >> 24), A: w[6], B: w[7]},
	}
}

// invalidText says why f's call is invalid in a group of n ranks; the rank
// that made the call and every rank that decodes its fingerprint say the
// same.
func (f *fingerprint) invalidText(n int) string { return f.inv.Text(f.call, n) }

// check finds why the call o of rank rank in a group of n ranks is
// invalid, if it is: the rules of the comm contract, which every backend
// enforces, checked here so that a call invalid on some ranks fails on
// every rank instead of hanging the others in the backend. What only a
// backend knows (which memory it accepts) stays the backend's to check.
func (o *op) check(rank, n int) {
	r := backend.Rules{Rank: rank, Size: n}
	o.fp.inv = r.Check(&o.fp.call, &o.send, &o.recv)
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
		case !fps[r].inv.OK():
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
		if !fps[r].inv.OK() {
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
	case !send.inv.OK() || !recv.inv.OK():
		say := func(f *fingerprint) string {
			if f.inv.OK() {
				return "<nil>"
			}
			return f.invalidText(n)
		}
		return fmt.Errorf("%w: message %d from rank %d to rank %d: send (seq %d): %s; recv (seq %d): %s", comm.ErrInvalid, send.num, src, dst, send.call.Seq, say(send), recv.call.Seq, say(recv))
	}
	return comm.MessageMismatchError(send.num, src, dst, send.call, recv.call)
}
