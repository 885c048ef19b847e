package backend

import (
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// Oldest watches a rank's oldest incomplete operation on a comm.Watchdog's
// schedule: the part of a backend's watchdog goroutine that every backend
// shares. On each tick the backend calls Check; what it does with a
// report or an expiry (log it, abort its communicator, end the job) is its
// own. The zero value is not usable: set Dog.
//
// Check walks forward from the oldest operation not yet found complete,
// testing each (through the backend's TestOp, so an Advancer may finish
// it), and jumps to a ring behind the last issued: every operation a whole
// ring before it has completed, since its slot's next operation waited
// for it (Ring.Reserve). A tick therefore tests at most RingSize
// operations, however many completed since the last one.
type Oldest struct {
	// Dog is the schedule: StallInterval, Timeout and OnStall.
	Dog comm.Watchdog

	low     uint64 // every operation before it has completed
	watched uint64 // the operation w watches
	w       comm.Watch
}

// Due is what Check found due for operation Seq, which has been incomplete
// for Waited since it was issued.
type Due struct {
	Seq     uint64
	Report  bool // a stall report is due (Oldest.Dog.Report)
	Expired bool // Dog.Timeout has passed since Seq was issued
	Waited  time.Duration
	Issued  time.Time
	Dog     comm.Watchdog // Dog with its defaults filled in
}

// Check looks at the oldest incomplete operation at now. issued is the
// sequence number of the last operation issued (Ring.Issued); test reports
// whether an operation has completed (the backend's TestOp); at returns
// when operation seq was issued, and may record what else the backend
// wants of it for its report (its kind, say): Check calls it and then tests
// seq once more, so that what at read belongs to seq and not to an
// operation that has since reused its slot. It returns ok false when
// nothing is incomplete or nothing is due.
func (o *Oldest) Check(issued uint64, test func(seq uint64) bool, at func(seq uint64) time.Time, now time.Time) (d Due, ok bool) {
	o.low = max(o.low, 1)
	if issued > RingSize {
		o.low = max(o.low, issued-RingSize+1)
	}
	for o.low <= issued && test(o.low) {
		o.low++
	}
	if o.low > issued {
		return Due{}, false
	}
	seq := o.low
	t := at(seq)
	if test(seq) {
		return Due{}, false
	}
	if o.watched != seq {
		o.watched, o.w = seq, o.Dog.Start(t)
	}
	report, expired := o.w.Check(now)
	if !report && !expired {
		return Due{}, false
	}
	return Due{Seq: seq, Report: report, Expired: expired, Waited: o.w.Waited(now), Issued: t, Dog: o.w.Watchdog()}, true
}
