package ddp

import (
	"fmt"
	"time"
)

// One blocking call at a time. Wait, WaitEach, Join and Broadcast share
// the step's state, its completion signal (a one-slot token that reaches
// one waiter) and the watchdog's timer, and Join and Broadcast issue
// collectives whose order every rank must agree on. A second such call
// from another goroutine would block forever, race on the step's
// statistics or put this rank's collectives out of order, so it fails at
// once with ErrConcurrent instead, and the first goes on. Close ends the
// call in progress (it aborts the group) and waits for it to return
// before it gives memory back.

// Blocking calls, as inCall holds them.
const (
	callNone int32 = iota
	callWait
	callWaitEach
	callJoin
	callBroadcast
	callBegin // never held: Begin only checks
	callWaitGather
	callConsolidate
)

var callNames = [...]string{"no call", "Wait", "WaitEach", "Join", "Broadcast", "Begin", "WaitGather", "Consolidate"}

// enter makes call the Reducer's blocking call in progress, or fails with
// ErrConcurrent if another goroutine is in one; leave must follow a nil
// return.
func (r *Reducer) enter(call int32) error {
	if !r.inCall.CompareAndSwap(callNone, call) {
		return r.concurrent(call)
	}
	if err := r.usable(); err != nil {
		r.leave()
		return err
	}
	return nil
}

// leave ends the blocking call in progress, and tells a Close waiting
// for it. (Close stores closed before it loads inCall, leave stores
// inCall before it loads closed: one of them sees the other.)
func (r *Reducer) leave() {
	r.inCall.Store(callNone)
	if r.closed.Load() {
		select {
		case r.left <- struct{}{}:
		default:
		}
	}
}

// concurrent is the error of call made while another is in progress.
func (r *Reducer) concurrent(call int32) error {
	held := "another call"
	if h := r.inCall.Load(); h != callNone {
		held = callNames[h]
	}
	return fmt.Errorf("%w: rank %d: %s called while %s is running on another goroutine; "+
		"a Reducer takes one Wait, WaitEach, Join or Broadcast at a time, and Begin only between them",
		ErrConcurrent, r.c.Rank(), callNames[call], held)
}

// awaitCall waits, for at most Options.DrainTimeout, for the blocking call
// in progress to return. Close calls it once closed is set and the group
// aborted, which ends the call's wait.
func (r *Reducer) awaitCall() {
	if r.inCall.Load() == callNone {
		return
	}
	t := time.NewTimer(r.o.DrainTimeout)
	defer t.Stop()
	select {
	case <-r.left:
	case <-t.C:
	}
}
