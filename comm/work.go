package comm

import "context"

// Work is the handle of one asynchronous collective. The zero Work is
// complete with no error. Work is a small value, not a pointer: a backend
// implements Waiter on its own long-lived state and identifies the
// operation by id, so issuing a collective allocates nothing.
type Work struct {
	w  Waiter
	id uint64
}

// Waiter is implemented by backends; most code uses Work instead.
type Waiter interface {
	// WaitOp blocks until operation id has completed or ctx is done. It
	// returns the operation's error, or ctx's error wrapped with what the
	// operation was waiting for.
	WaitOp(ctx context.Context, id uint64) error
	// TestOp reports without blocking whether operation id has completed,
	// and its error if so.
	TestOp(id uint64) (done bool, err error)
}

// NewWork returns the Work for operation id of w. Backends call it.
func NewWork(w Waiter, id uint64) Work { return Work{w: w, id: id} }

// FailedWork returns a Work that has already completed with err.
func FailedWork(err error) Work {
	if err == nil {
		return Work{}
	}
	return Work{w: failed{err}}
}

// Wait blocks until the collective has completed, or ctx is done. A Work
// may be waited for any number of times.
func (w Work) Wait(ctx context.Context) error {
	if w.w == nil {
		return nil
	}
	return w.w.WaitOp(ctx, w.id)
}

// Test reports without blocking whether the collective has completed, and
// its error if it has.
func (w Work) Test() (done bool, err error) {
	if w.w == nil {
		return true, nil
	}
	return w.w.TestOp(w.id)
}

// ID returns the backend's identifier of the operation (for most backends,
// the rank's sequence number of the collective).
func (w Work) ID() uint64 { return w.id }

type failed struct{ err error }

func (f failed) WaitOp(context.Context, uint64) error { return f.err }
func (f failed) TestOp(uint64) (bool, error)          { return true, f.err }
