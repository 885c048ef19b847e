package backend

import (
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// TestOldest drives the kit's watchdog helper with explicit times: it
// watches the oldest incomplete operation, reports on the Watchdog's
// schedule, restarts the schedule when that operation completes, reads
// the issue time of the operation it reports, and tests no operation a
// whole ring behind the last issued.
func TestOldest(t *testing.T) {
	r := newRank(false)
	t0 := time.Unix(1000, 0)
	issuedAt := map[uint64]time.Time{}
	issue := func(at time.Time) uint64 {
		seq := r.issue()
		issuedAt[seq] = at
		return seq
	}
	var tested []uint64
	test := func(seq uint64) bool {
		tested = append(tested, seq)
		done, _ := r.ops.Test(seq)
		return done
	}
	at := func(seq uint64) time.Time { return issuedAt[seq] }
	o := Oldest{Dog: comm.Watchdog{StallInterval: time.Second, Timeout: 3 * time.Second}}

	if _, ok := o.Check(r.ops.Issued(), test, at, t0); ok {
		t.Fatal("something due with nothing issued")
	}
	a := issue(t0)
	b := issue(t0.Add(time.Second))
	if d, ok := o.Check(r.ops.Issued(), test, at, t0.Add(time.Second/2)); ok {
		t.Fatalf("due before the stall interval: %+v", d)
	}
	d, ok := o.Check(r.ops.Issued(), test, at, t0.Add(time.Second))
	if !ok || d.Seq != a || !d.Report || d.Expired || d.Waited != time.Second || !d.Issued.Equal(t0) {
		t.Fatalf("after a second: %+v, %v; want a report of #%d", d, ok, a)
	}
	if d, ok := o.Check(r.ops.Issued(), test, at, t0.Add(3*time.Second/2)); ok {
		t.Fatalf("reported twice in one interval: %+v", d)
	}
	// a completes: b is watched from its own issue time.
	r.ops.Complete(a, nil)
	if d, ok := o.Check(r.ops.Issued(), test, at, t0.Add(3*time.Second/2)); ok {
		t.Fatalf("b reported half a second after its issue: %+v", d)
	}
	d, ok = o.Check(r.ops.Issued(), test, at, t0.Add(4*time.Second))
	if !ok || d.Seq != b || !d.Report || !d.Expired || d.Waited != 3*time.Second {
		t.Fatalf("b at its timeout: %+v, %v", d, ok)
	}
	r.ops.Complete(b, nil)

	// A ring and more issued and completed since: one tick tests no
	// operation a whole ring behind the last.
	for range RingSize + 10 {
		r.ops.Complete(issue(t0), nil)
	}
	tested = tested[:0]
	if d, ok := o.Check(r.ops.Issued(), test, at, t0.Add(time.Hour)); ok {
		t.Fatalf("due with everything complete: %+v", d)
	}
	if len(tested) > RingSize || tested[0] <= r.ops.Issued()-RingSize {
		t.Errorf("tested %d operations from #%d, last issued #%d", len(tested), tested[0], r.ops.Issued())
	}
	// An operation whose slot is reused between at and the second test is
	// not reported.
	c := issue(t0)
	if _, ok := o.Check(r.ops.Issued(), test, func(seq uint64) time.Time {
		r.ops.Complete(seq, nil)
		return at(seq)
	}, t0.Add(time.Hour)); ok {
		t.Errorf("#%d reported though it completed while its stamp was read", c)
	}
}
