package comm

import (
	"fmt"
	"time"
)

// Stall describes a wait for peers that has lasted longer than a
// watchdog's stall interval: which rank waits, in which operation, for
// which ranks, and for how long.
type Stall struct {
	Rank int    // the waiting rank
	Seq  uint64 // the rank's sequence number of the operation (Work.ID)
	Kind Kind   // the operation; 0 when the wait is not for one operation
	// Missing lists, in increasing order, the ranks that have not joined
	// the operation, or whose part of it is left (the waiting rank itself
	// among them, when every rank has joined but this one has still to
	// finish it). It is nil when the waiter cannot tell (a backend that is
	// not a Progress, as MPI and NCCL are not), and empty but not nil when
	// every rank has joined and the data is still moving.
	Missing []int
	Waited  time.Duration // how long the rank has waited so far
	// Detail is what the waiter adds about why it waits, for example the
	// reducer's step, bucket and parameters. It may be empty.
	Detail string
}

// String describes the stall in one line, naming the missing ranks.
func (s Stall) String() string {
	return fmt.Sprintf("comm: rank %d has waited %v %s", s.Rank, s.Waited.Round(time.Millisecond), s.what())
}

// TimeoutError returns the error of a wait that s describes and that
// reached its watchdog's Timeout: it wraps ErrTimeout and says what
// String says.
func (s Stall) TimeoutError() error {
	return fmt.Errorf("%w after %v: rank %d waited %s", ErrTimeout, s.Waited.Round(time.Millisecond), s.Rank, s.what())
}

// what says where the rank waits and for whom.
func (s Stall) what() string {
	op := fmt.Sprintf("in %s #%d", s.Kind, s.Seq)
	if s.Kind == 0 {
		op = fmt.Sprintf("in operation #%d", s.Seq)
	}
	var who string
	switch {
	case s.Missing == nil:
		who = " (the backend cannot tell which ranks have not joined)"
	case len(s.Missing) == 0:
		who = " (every rank has joined; the data is still moving)"
	default:
		who = fmt.Sprintf(" for rank(s) %v", s.Missing)
	}
	if s.Detail != "" {
		return op + who + ": " + s.Detail
	}
	return op + who
}

// Progress is implemented by a backend that can tell which ranks a
// pending operation waits for (inproc can: it sees every rank's arrival;
// MPI and NCCL cannot). A watchdog asks only when a stall is due, so
// Missing may take locks and allocate.
type Progress interface {
	// Missing returns, in increasing order, the ranks that have not yet
	// joined the operation of w, this rank included when its own earlier
	// operations still hold it back. It returns nil when it cannot tell,
	// in particular when w is not a pending operation of this
	// communicator, and an empty, non-nil slice when every rank has
	// joined and the operation is only moving data.
	Missing(w Work) []int
}

// MissingRanks returns c.Missing(w) if c is a Progress, and nil (not
// known) otherwise.
func MissingRanks(c Communicator, w Work) []int {
	if p, ok := c.(Progress); ok {
		return p.Missing(w)
	}
	return nil
}

// IssuedBy reports whether w is an operation of the backend x, so that a
// Progress can tell its own Works from others'.
func (w Work) IssuedBy(x Waiter) bool { return w.w != nil && w.w == x }
