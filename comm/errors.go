package comm

import (
	"errors"
	"fmt"
)

// Sentinel errors. Backends wrap them with %w and the numbers that explain
// them; callers test with errors.Is.
var (
	// ErrAborted: the group was aborted (by Abort on any rank, or by a
	// failure that makes further collectives meaningless).
	ErrAborted = errors.New("comm: group aborted")
	// ErrMismatch: ranks issued different collectives at the same sequence
	// number (operation, count, dtype, reduction op or root differ).
	ErrMismatch = errors.New("comm: collective mismatch between ranks")
	// ErrClosed: the communicator was closed.
	ErrClosed = errors.New("comm: communicator closed")
	// ErrTimeout: a collective did not complete within the backend's
	// deadline (distinct from the caller's context expiring).
	ErrTimeout = errors.New("comm: collective timed out")
	// ErrInvalid: the arguments of a call are wrong (bad dtype, op, root,
	// peer or sizes).
	ErrInvalid = errors.New("comm: invalid argument")
)

// OpError describes a failed collective: which rank saw it, the sequence
// number, the operation, and the cause (one of the sentinels above,
// wrapped, or a transport error).
type OpError struct {
	Rank  int    // the rank reporting the error
	Seq   uint64 // the rank's sequence number of the collective (1-based)
	Kind  Kind
	Count int
	DType DType
	Err   error
}

func (e *OpError) Error() string {
	if e.Kind == KindBarrier {
		// A barrier moves no data: no count or dtype to name.
		return fmt.Sprintf("comm: rank %d: %s #%d: %v", e.Rank, e.Kind, e.Seq, e.Err)
	}
	return fmt.Sprintf("comm: rank %d: %s #%d (%d x %s): %v", e.Rank, e.Kind, e.Seq, e.Count, e.DType, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }
