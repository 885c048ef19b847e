package backend

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/cpu"

	"github.com/ddpgo/ddpgo/comm"
)

// RingSize is the number of operations a rank may have issued and not yet
// completed; issuing one more waits for the oldest (see Ring.Reserve).
const RingSize = 256

// FailLogMax bounds the failures a ring keeps for Waits that come after an
// operation's slot has been reused; beyond it the older half is forgotten.
const FailLogMax = 4096

// Ring is one rank's ordered ring of operations: the descriptors of type D
// that the backend's transport reads, and the result slots that Test and
// Wait read. Its zero value is not usable: call Init first. See the
// package documentation for who may call what.
type Ring[D any] struct {
	name string
	rank int
	spin bool
	adv  Advancer
	park Parker
	werr WaitErrorer
	stk  Sticky

	_      cpu.CacheLinePad
	issued atomic.Uint64 // sequence number of the last published operation
	_      cpu.CacheLinePad

	slots [RingSize]slot
	ops   [RingSize]D

	waiters Waiters

	fmu       sync.Mutex // guards the failure log
	fails     []failure  // failures whose slot may have been reused, by sequence number
	forgotten uint64     // failures up to this sequence number were dropped
	failFrom  uint64     // the first failure logged once Sticky reported one; every later operation failed
}

// slot holds the result of the last operation completed in it.
type slot struct {
	// done is the sequence number of the last operation completed in this
	// slot; while the slot's result is rewritten for operation s it is
	// s|writing, so a reader never pairs one operation's number with the
	// next one's error.
	done atomic.Uint64
	err  atomic.Pointer[error]
}

// writing marks a slot whose result is being rewritten.
const writing = 1 << 63

// failure is a failed operation, kept for Waits that come after its ring
// slot has been reused.
type failure struct {
	seq uint64
	err error
}

// Config names a ring's backend and rank for its errors, and gives the
// hooks through which the backend takes part in Test and Wait.
type Config struct {
	// Backend prefixes the ring's errors ("inproc", "mpi").
	Backend string
	// Rank is the rank the ring belongs to.
	Rank int
	// Spin makes Wait poll briefly (see Spinner) before it parks; without
	// it Wait parks at once, for a backend whose completing goroutine
	// needs the waiter's processor (mpi's owner, readied by the issue).
	Spin bool
	// Hooks, if not nil, is asked for the optional interfaces Advancer,
	// Parker, WaitErrorer and Sticky. A backend whose communicator type is
	// exported passes an unexported type of its own (a conversion of the
	// communicator's pointer), so the hooks stay out of its API.
	Hooks any
}

// Advancer is implemented by a backend whose Test may do a bounded amount
// of work toward completing an operation: inproc finishes a collective it
// joined on the issuing goroutine once every peer has arrived; a wrapper
// completes an operation whose inner Work has completed.
type Advancer interface {
	// Advance is called by Test before it reads the slot of operation id,
	// which has been issued. It may call Complete.
	Advance(id uint64)
}

// Parker is implemented by a backend that must learn when a Wait parks:
// from then on something must call Complete (and so wake it) without the
// waiter's help.
type Parker interface {
	// Parking is called once per Wait, after the waiter is registered and
	// before it first sleeps.
	Parking(id uint64)
}

// WaitErrorer is implemented by a backend that says more than the default
// of a Wait that its context ended ("<backend>: rank R: waiting for
// operation #id: cause").
type WaitErrorer interface {
	WaitError(id uint64, cause error) error
}

// Sticky is implemented by a backend whose failures are permanent: once
// Failure returns non-nil, every operation that completes from then on,
// and every later one, fails. The ring then stops logging failures, and
// reports an old operation after the first one logged as failed with
// Failure's error.
type Sticky interface {
	Failure() error
}

// Init configures r. It must be called before any other method, and
// before r is shared.
func (r *Ring[D]) Init(c Config) {
	r.name, r.rank, r.spin = c.Backend, c.Rank, c.Spin
	r.adv, _ = c.Hooks.(Advancer)
	r.park, _ = c.Hooks.(Parker)
	r.werr, _ = c.Hooks.(WaitErrorer)
	r.stk, _ = c.Hooks.(Sticky)
}

// Op returns the descriptor of operation seq. The issuer writes it
// between Reserve and Publish (or PublishDone); whoever runs the
// operation reads it after seeing seq published, until the operation
// completes. Once it has, the issuer may rewrite the slot for operation
// seq+RingSize: a reader that comes later (an engine walking past
// completed operations) must tell the two apart, by a sequence number in
// the descriptor, or by Ended.
func (r *Ring[D]) Op(seq uint64) *D { return &r.ops[seq%RingSize] }

// Issued returns the sequence number of the last published operation.
func (r *Ring[D]) Issued() uint64 { return r.issued.Load() }

// Reserve returns the sequence number of the next operation, once the
// slot it takes is free: the operation RingSize before it must have
// completed, which Reserve waits for through w, the backend's Waiter
// (without a deadline: the backend's own watchdog bounds the wait). Only
// the issuer calls it, under the lock that orders its issues, and
// publishes the number with Publish or PublishDone before it reserves
// another.
func (r *Ring[D]) Reserve(w comm.Waiter) uint64 {
	seq := r.issued.Load() + 1
	if seq > RingSize && !r.Done(seq-RingSize) {
		wait(w, seq-RingSize)
	}
	return seq
}

// wait waits for operation id of w without a deadline.
func wait(w comm.Waiter, id uint64) { _ = w.WaitOp(context.Background(), id) }

// Publish makes operation seq, reserved and with its descriptor written,
// visible: Issued returns it, and Test and Wait accept it. It panics
// unless seq is the number Reserve returned: the one after Issued, its
// slot free.
func (r *Ring[D]) Publish(seq uint64) {
	r.publishable(seq)
	r.issued.Store(seq)
}

// publishable panics unless operation seq may be published now.
func (r *Ring[D]) publishable(seq uint64) {
	// Both words were loaded by Reserve just before: this costs two
	// loads from the cache and a branch.
	if issued := r.issued.Load(); seq != issued+1 || seq > RingSize && !r.Done(seq-RingSize) {
		r.misuse("publishes operation #%d after #%d, over slot state %#x", seq, issued, r.slots[seq%RingSize].done.Load())
	}
}

// misuse panics: a backend broke the ring's rules, and going on would
// report wrong results.
func (r *Ring[D]) misuse(format string, args ...any) {
	panic(fmt.Sprintf("backend: %s rank %d: misuse of the ring: ", r.name, r.rank) + fmt.Sprintf(format, args...))
}

// PublishDone publishes operation seq, reserved and with its descriptor
// written, as complete without error: an operation its issuer ran whole
// before publishing it. Test and Wait then find it done, and it keeps its
// place in the issuer's count. No waiter can be parked on an operation not
// yet published, so nothing is woken. A Sticky backend must not call it
// once it has failed: its operations from then on fail. It panics as
// Publish does.
func (r *Ring[D]) PublishDone(seq uint64) {
	r.publishable(seq)
	s := &r.slots[seq%RingSize]
	if s.err.Load() != nil {
		// As Complete does: a Test of the slot's last operation must see
		// the slot change before that operation's error goes.
		s.done.Store(seq | writing)
		s.err.Store(nil)
	}
	s.done.Store(seq)
	r.issued.Store(seq)
}

// Complete records the result of operation seq (err nil for success) and
// wakes the goroutines parked in Wait. It reports whether it recorded it:
// the first Complete of an operation wins and later ones do nothing, so
// several goroutines may race to complete one operation. It panics for
// an operation not yet published, or whose slot still holds an earlier
// operation that has not completed (Complete(seq+RingSize) while seq is
// pending): a backend's mistake, in every build.
func (r *Ring[D]) Complete(seq uint64, err error) bool {
	s := &r.slots[seq%RingSize]
	old := s.done.Load()
	if old&^writing >= seq {
		if seq == 0 {
			r.misuse("completes operation #0")
		}
		return false
	}
	// The slot's last operation must be the one RingSize before (none
	// for the first RingSize), completed: Reserve waited for it.
	prev := uint64(0)
	if seq > RingSize {
		prev = seq - RingSize
	}
	if old != prev || seq > r.issued.Load() {
		r.misuse("completes operation #%d, published %d, over slot state %#x", seq, r.issued.Load(), old)
	}
	if !s.done.CompareAndSwap(old, seq|writing) {
		return false
	}
	if err != nil {
		e := err // a heap copy only on failure
		s.err.Store(&e)
		r.logFailure(seq, err)
	} else if s.err.Load() != nil { // an atomic pointer store is not free
		s.err.Store(nil)
	}
	s.done.Store(seq)
	r.waiters.Notify()
	return true
}

// Done reports whether operation seq has completed with its result in
// place, and its slot not yet reused.
func (r *Ring[D]) Done(seq uint64) bool { return r.slots[seq%RingSize].done.Load() == seq }

// Ended reports whether operation seq has completed, its slot perhaps
// reused since (when Done no longer says so), or is completing now.
func (r *Ring[D]) Ended(seq uint64) bool {
	return r.slots[seq%RingSize].done.Load()&^writing >= seq
}

// Test reports whether operation id has completed, and its error: the
// body of a backend's comm.Waiter TestOp. It calls the backend's
// Advancer first. An id never issued completes at once with
// comm.ErrInvalid.
func (r *Ring[D]) Test(id uint64) (bool, error) {
	if id == 0 || id > r.issued.Load() {
		return true, fmt.Errorf("%w: %s: rank %d has issued no operation #%d", comm.ErrInvalid, r.name, r.rank, id)
	}
	if r.adv != nil {
		r.adv.Advance(id)
	}
	s := &r.slots[id%RingSize]
	done := s.done.Load()
	switch {
	case done&^writing < id || done == id|writing:
		return false, nil
	case done == id:
		ep := s.err.Load()
		if s.done.Load() == id {
			if ep == nil {
				return true, nil
			}
			return true, *ep
		}
	}
	// The slot has been reused since operation id completed.
	return true, r.oldResult(id)
}

// Wait waits until operation id has completed or ctx is done: the body of
// a backend's comm.Waiter WaitOp. It tests, spins if the ring was
// configured to, registers as a waiter, calls the backend's Parker, and
// sleeps until a Complete wakes it. A Wait that ctx ends returns the
// backend's WaitErrorer's error, or one that wraps context.Cause(ctx).
func (r *Ring[D]) Wait(ctx context.Context, id uint64) error {
	if done, err := r.Test(id); done {
		return err
	}
	if r.spin {
		for sp := (Spinner{}); sp.Spin(); {
			if done, err := r.Test(id); done {
				return err
			}
		}
	}
	ch := r.waiters.Add()
	defer r.waiters.Drop(ch)
	if r.park != nil {
		r.park.Parking(id)
	}
	cancel := ctx.Done()
	for {
		if done, err := r.Test(id); done {
			return err
		}
		if cancel == nil { // a context that never ends: a plain receive
			<-ch
			continue
		}
		select {
		case <-ch:
		case <-cancel:
			return r.waitError(id, context.Cause(ctx))
		}
	}
}

// Await waits until ready() holds or ctx is done, as Wait waits for an
// operation: for a backend that waits for a stage of operation id before
// its completion (a wrapper waiting for its call to be launched). Whoever
// makes ready() hold must call Notify.
func (r *Ring[D]) Await(ctx context.Context, id uint64, ready func() bool) error {
	if ready() {
		return nil
	}
	if r.spin {
		for sp := (Spinner{}); sp.Spin(); {
			if ready() {
				return nil
			}
		}
	}
	ch := r.waiters.Add()
	defer r.waiters.Drop(ch)
	cancel := ctx.Done()
	for !ready() {
		select {
		case <-ch:
		case <-cancel:
			return r.waitError(id, context.Cause(ctx))
		}
	}
	return nil
}

// Notify wakes the goroutines parked in Wait and Await, for a change
// other than a Complete that one of them waits for.
func (r *Ring[D]) Notify() { r.waiters.Notify() }

// Waiting returns the number of goroutines parked in Wait and Await.
func (r *Ring[D]) Waiting() int { return r.waiters.Len() }

func (r *Ring[D]) waitError(id uint64, cause error) error {
	if r.werr != nil {
		return r.werr.WaitError(id, cause)
	}
	return fmt.Errorf("%s: rank %d: waiting for operation #%d: %w", r.name, r.rank, id, cause)
}

// oldResult returns the result of operation id, completed long enough ago
// that its ring slot has been reused.
func (r *Ring[D]) oldResult(id uint64) error {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	i, found := slices.BinarySearchFunc(r.fails, id, cmpFailure)
	switch {
	case found:
		return r.fails[i].err
	case r.failFrom != 0 && id > r.failFrom:
		return fmt.Errorf("%s: rank %d: operation #%d: %w", r.name, r.rank, id, r.stk.Failure())
	case id <= r.forgotten:
		return fmt.Errorf("%w: %s: rank %d: operation #%d completed more than %d failures ago; its result is no longer kept", comm.ErrInvalid, r.name, r.rank, id, FailLogMax/2)
	}
	return nil
}

func cmpFailure(f failure, id uint64) int { return cmp.Compare(f.seq, id) }

// logFailure keeps the error of operation seq for Waits that come after
// its slot has been reused. Once a Sticky backend has failed, every later
// operation fails with its error, so those need no entry.
func (r *Ring[D]) logFailure(seq uint64, err error) {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	if r.failFrom != 0 {
		return
	}
	if len(r.fails) == FailLogMax {
		r.forgotten = r.fails[FailLogMax/2-1].seq
		r.fails = r.fails[:copy(r.fails, r.fails[FailLogMax/2:])]
	}
	if seq <= r.forgotten {
		return // completed out of order, older than what the log still holds
	}
	// Operations usually complete in order: the entry goes last.
	i := len(r.fails)
	for i > 0 && r.fails[i-1].seq > seq {
		i--
	}
	r.fails = slices.Insert(r.fails, i, failure{seq, err})
	if r.stk != nil && r.stk.Failure() != nil {
		r.failFrom = seq
	}
}
