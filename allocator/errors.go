package allocator

import (
	"errors"
	"fmt"
)

// Sentinel errors. The pool wraps them with %w and the numbers that explain
// them; callers test with errors.Is.
var (
	// ErrExhausted: serving a Get would take the bytes mapped past the
	// pool's limit, even after Trim. The error is an *ExhaustedError.
	ErrExhausted = errors.New("allocator: pool exhausted")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("allocator: pool closed")
	// ErrMisuse: a Put of a block that is not live in this pool (double Put,
	// a block of another pool, a zero or forged Block), a negative size, or
	// a Close with blocks still outstanding. Under the invariants build tag
	// misuse by Get and Put panics instead of returning.
	ErrMisuse = errors.New("allocator: misuse")
	// ErrInvalid: bad Options, or a Source that broke its contract.
	ErrInvalid = errors.New("allocator: invalid")
)

// ExhaustedError is returned by Get when the request cannot be served
// within the limit. It wraps ErrExhausted.
type ExhaustedError struct {
	Request int   // bytes asked for (n of Get(n))
	Need    int64 // bytes that would have had to be mapped
	Limit   int64 // the pool's limit on bytes mapped
	InUse   int64 // bytes in outstanding blocks
	Mapped  int64 // bytes mapped when the request failed (after Trim)
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("allocator: pool exhausted: Get(%d) needs a new slab of %d bytes; limit %d bytes, %d bytes in use, %d bytes mapped",
		e.Request, e.Need, e.Limit, e.InUse, e.Mapped)
}

// Unwrap returns ErrExhausted.
func (e *ExhaustedError) Unwrap() error { return ErrExhausted }
