package comm

import (
	"fmt"
	"strings"
)

// Call is one rank's call of an operation as a mismatch report names it:
// what must agree across ranks, and the rank's sequence number. Count is
// the count that must agree: the per-rank count of AllGather and
// ReduceScatter. Root is the peer of a Send or Recv.
type Call struct {
	Kind  Kind
	Op    Op // reductions only
	DType DType
	Count int
	Root  int    // Broadcast and Reduce; the peer of Send and Recv
	Seq   uint64 // the rank's sequence number of the operation
}

// reduces reports whether the call's Op must agree.
func (c Call) reduces() bool {
	return c.Kind == KindAllReduce || c.Kind == KindReduce || c.Kind == KindReduceScatter
}

// rooted reports whether the call's Root must agree.
func (c Call) rooted() bool { return c.Kind == KindBroadcast || c.Kind == KindReduce }

// Matches reports whether two ranks' calls of the same collective agree:
// the same kind, dtype and count, and the same op and root where they
// matter. Sequence numbers need not agree.
func (c Call) Matches(d Call) bool {
	if c.Kind != d.Kind || c.DType != d.DType || c.Count != d.Count {
		return false
	}
	if c.reduces() && c.Op != d.Op {
		return false
	}
	if c.rooted() && c.Root != d.Root {
		return false
	}
	return true
}

// String describes the call, for example "all_reduce(sum, 2 x float)
// (seq 2)" or "broadcast(root 0, 7 x float) (seq 5)".
func (c Call) String() string {
	switch {
	case c.Kind == KindBarrier:
		return fmt.Sprintf("barrier (seq %d)", c.Seq)
	case c.Kind == KindReduce:
		return fmt.Sprintf("reduce(%s, root %d, %d x %s) (seq %d)", c.Op, c.Root, c.Count, c.DType, c.Seq)
	case c.reduces():
		return fmt.Sprintf("%s(%s, %d x %s) (seq %d)", c.Kind, c.Op, c.Count, c.DType, c.Seq)
	case c.Kind == KindBroadcast:
		return fmt.Sprintf("broadcast(root %d, %d x %s) (seq %d)", c.Root, c.Count, c.DType, c.Seq)
	}
	return fmt.Sprintf("%s(%d x %s) (seq %d)", c.Kind, c.Count, c.DType, c.Seq)
}

// MismatchError returns the error that every rank of collective number k
// reports when the ranks' calls (calls[r] is rank r's) disagree, or nil
// when they agree. It wraps ErrMismatch and names the ranks that differ
// from the call most ranks made (on a tie, the lowest rank's), so that one
// odd rank is named as the odd one even when it is rank 0, and then every
// rank's call. Every rank that sees the same calls builds the same
// message.
func MismatchError(k uint64, calls []Call) error {
	agree := true
	for r := 1; r < len(calls) && agree; r++ {
		agree = calls[r].Matches(calls[0])
	}
	if agree {
		return nil
	}
	ref, best := 0, 0
	for r := range calls {
		votes := 0
		for q := range calls {
			if calls[q].Matches(calls[r]) {
				votes++
			}
		}
		if votes > best {
			ref, best = r, votes
		}
	}
	var same, differ []int
	for r := range calls {
		if calls[r].Matches(calls[ref]) {
			same = append(same, r)
		} else {
			differ = append(differ, r)
		}
	}
	var b strings.Builder
	for r := range calls {
		fmt.Fprintf(&b, "; rank %d: %s", r, calls[r])
	}
	return fmt.Errorf("%w: collective #%d: rank(s) %v differ from rank(s) %v%s", ErrMismatch, k, differ, same, b.String())
}

// MessageMismatchError returns the error both ends of message number k
// from rank src to rank dst report when the sender's call send and the
// receiver's call recv disagree on count or dtype, or nil when they agree.
func MessageMismatchError(k uint64, src, dst int, send, recv Call) error {
	if send.Count == recv.Count && send.DType == recv.DType {
		return nil
	}
	return fmt.Errorf("%w: message %d from rank %d to rank %d: rank %d sends %d x %s (seq %d), rank %d receives %d x %s (seq %d)",
		ErrMismatch, k, src, dst, src, send.Count, send.DType, send.Seq, dst, recv.Count, recv.DType, recv.Seq)
}
