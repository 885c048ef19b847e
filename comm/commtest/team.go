package commtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// A team runs the checks of one group from one goroutine: every rank's
// side (Run) or one rank's (RunSPMD). The checks say what each rank does,
// once; the team's driver decides which ranks run here, where their
// communicators come from, how the ranks meet and how they agree on the
// outcome of a check.
type team struct {
	cfg   *config
	n     int
	local []int // the ranks run here
	drv   driver
	mem   *memory
	cs    []comm.Communicator // the main communicator of each rank run here, by rank

	// The running check's state.
	out     []outcome             // by rank
	fresh   [][]comm.Communicator // groups taken by the check, closed when it ends
	tainted bool                  // an operation did not complete: its memory may still be written
	ws      [][]comm.Work         // by rank: a step's operations

	// lost is set when the ranks could not agree on an outcome: nothing
	// more can run in step.
	lost error
}

// outcome is one rank's result of a check.
type outcome struct {
	msg    string // the first failure, "" if none
	more   int    // failures after the first
	broken bool   // an operation failed or did not complete
}

// Outcome codes, agreed across ranks at the end of every check.
const (
	passed int32 = iota
	failed       // a result was wrong
	broken       // an operation failed or did not complete: the main communicators are replaced
)

func (o *outcome) code() int32 {
	switch {
	case o.broken:
		return broken
	case o.msg != "":
		return failed
	}
	return passed
}

// A driver is what differs between Run and RunSPMD.
type driver interface {
	// group returns a new group over the team's ranks: element r is rank
	// r's communicator, nil for a rank not run here. It is collective.
	group(t *testing.T) []comm.Communicator
	// sync returns once every rank of the team has called it.
	sync(tm *team) error
	// agree fills in codes, by rank, the codes of the ranks not run here.
	agree(tm *team, codes []int32) error
	// concurrent returns the groups that the concurrency check drives at
	// once.
	concurrent(t *testing.T, tm *team) [][]comm.Communicator
}

func newTeam(cfg *config, n int, local []int, drv driver, mem *memory) *team {
	return &team{
		cfg: cfg, n: n, local: local, drv: drv, mem: mem,
		cs:  make([]comm.Communicator, n),
		out: make([]outcome, n),
		ws:  make([][]comm.Work, n),
	}
}

// check runs body as the subtest name of t and then has every rank agree
// on its outcome: a check that failed on one rank fails on all of them,
// each naming the ranks that failed, and the ranks go on in step. body
// reports through fail and broke, never by stopping early, so that every
// rank issues the same collectives.
func (tm *team) check(t *testing.T, name string, body func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		if tm.lost != nil {
			t.Fatalf("not run: %v", tm.lost)
		}
		clear(tm.out)
		defer tm.settle(t)
		body(t)
	})
}

// settle ends a check: the ranks agree on its outcome, the check's fresh
// groups are closed, its memory is released (or abandoned, if an operation
// may still write it), and, if an operation failed on any rank, every rank
// replaces its main communicator.
func (tm *team) settle(t *testing.T) {
	codes := make([]int32, tm.n)
	for _, r := range tm.local {
		codes[r] = tm.out[r].code()
	}
	var agreeErr error
	if tm.lost == nil {
		agreeErr = tm.drv.agree(tm, codes)
	}
	for _, r := range tm.local {
		if o := &tm.out[r]; o.msg != "" {
			more := ""
			if o.more > 0 {
				more = fmt.Sprintf(" (and %d more failures)", o.more)
			}
			t.Errorf("rank %d: %s%s", r, o.msg, more)
		}
	}
	var others []int
	renew := false
	for r, c := range codes {
		if c != passed && !tm.isLocal(r) {
			others = append(others, r)
		}
		renew = renew || c == broken
	}
	if len(others) > 0 {
		t.Errorf("rank(s) %v failed this check (their own output says how)", others)
	}
	tm.closeGroups(t, tm.fresh)
	tm.fresh = nil
	if agreeErr != nil {
		tm.lost = fmt.Errorf("rank(s) %v could not agree with their peers on the outcome of %s: %v", tm.local, t.Name(), agreeErr)
		t.Error(tm.lost)
		tm.tainted = true
	}
	if tm.tainted {
		n := tm.mem.abandon()
		t.Logf("%d buffers abandoned: an operation that did not complete may still write them", n)
		tm.tainted = false
	} else {
		tm.mem.release()
	}
	if renew && tm.lost == nil {
		tm.closeMain(t)
		tm.cs = tm.group(t)
	}
}

func (tm *team) isLocal(r int) bool {
	for _, l := range tm.local {
		if l == r {
			return true
		}
	}
	return false
}

// group takes a new group from the driver.
func (tm *team) group(t *testing.T) []comm.Communicator { return tm.drv.group(t) }

// freshGroup takes a new group for the running check, which closes it
// when it ends.
func (tm *team) freshGroup(t *testing.T) []comm.Communicator {
	g := tm.drv.group(t)
	tm.fresh = append(tm.fresh, g)
	return g
}

func (tm *team) closeMain(t *testing.T) {
	tm.closeGroups(t, [][]comm.Communicator{tm.cs})
	tm.cs = make([]comm.Communicator, tm.n)
}

func (tm *team) closeGroups(t *testing.T, gs [][]comm.Communicator) {
	for _, g := range gs {
		for r, c := range g {
			if c == nil {
				continue
			}
			if err := c.Close(); err != nil {
				t.Errorf("rank %d: Close: %v", r, err)
			}
		}
	}
}

// each runs fn for every rank run here, in rank order, until the check
// halts: a rank whose operation failed or did not complete issues nothing
// more in the check (under Run, no rank does), so that its peers stop at
// their next wait instead of at every one.
func (tm *team) each(fn func(r int)) {
	for _, r := range tm.local {
		if tm.halted() {
			return
		}
		fn(r)
	}
}

func (tm *team) halted() bool {
	for _, r := range tm.local {
		if tm.out[r].broken {
			return true
		}
	}
	return false
}

// sync returns once every rank has reached it; a check uses it where one
// rank must not issue an operation before the others have done something.
// If the ranks fail to meet, they are out of step for good: the check
// fails and no later one runs.
func (tm *team) sync() {
	if tm.lost != nil {
		return
	}
	if err := tm.drv.sync(tm); err != nil {
		tm.lost = fmt.Errorf("rank(s) %v could not meet their peers on the control communicator: %v", tm.local, err)
		for _, r := range tm.local {
			tm.broke(r, "%v", tm.lost)
		}
		tm.tainted = true
	}
}

// step runs one round of a check: issue returns rank r's operations, which
// are issued on every rank run here before any is waited for; once they
// have all completed without error, check returns a description of rank
// r's first wrong result, or "". what names the round in failures.
func (tm *team) step(what string, issue func(r int) []comm.Work, check func(r int) string) {
	ws := tm.ws
	clear(ws)
	tm.each(func(r int) { ws[r] = issue(r) })
	deadline := tm.deadline()
	for _, r := range tm.local {
		if ws[r] == nil || !tm.waitOK(r, what, deadline, ws[r]) || check == nil {
			continue
		}
		if msg := check(r); msg != "" {
			tm.fail(r, "%s: %s", what, msg)
		}
	}
}

func (tm *team) deadline() time.Time { return time.Now().Add(tm.cfg.waitTimeout) }

// wait waits until deadline for rank r's operations ws and returns their
// errors. If one did not complete, it marks the rank broken and returns
// false.
func (tm *team) wait(r int, what string, deadline time.Time, ws ...comm.Work) ([]error, bool) {
	errs := tm.cfg.await(ws, deadline)
	for i, err := range errs {
		if incomplete(err) {
			tm.tainted = true
			tm.broke(r, "%s: %s did not complete within %v: %v", what, opName(i, len(ws), ws[i]), tm.cfg.waitTimeout, err)
			return errs, false
		}
	}
	return errs, true
}

// waitOK is wait that also marks the rank broken if an operation failed.
func (tm *team) waitOK(r int, what string, deadline time.Time, ws []comm.Work) bool {
	errs, ok := tm.wait(r, what, deadline, ws...)
	if !ok {
		return false
	}
	for i, err := range errs {
		if err != nil {
			tm.broke(r, "%s: %s failed: %v", what, opName(i, len(ws), ws[i]), err)
			return false
		}
	}
	return true
}

func opName(i, n int, w comm.Work) string {
	if n == 1 {
		return fmt.Sprintf("the operation (id %d)", w.ID())
	}
	return fmt.Sprintf("operation %d of %d (id %d)", i+1, n, w.ID())
}

// fail records a wrong result of rank r; the first one is reported.
func (tm *team) fail(r int, format string, args ...any) {
	if o := &tm.out[r]; o.msg == "" {
		o.msg = fmt.Sprintf(format, args...)
	} else {
		o.more++
	}
}

// broke records an operation of rank r that failed or did not complete;
// the rank issues nothing more in the check.
func (tm *team) broke(r int, format string, args ...any) {
	tm.fail(r, format, args...)
	tm.out[r].broken = true
}

// errHung marks a Wait that did not return although its context ended.
var errHung = errors.New("commtest: Wait ignores its context")

func incomplete(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errHung)
}

// await waits for ws with a context that ends at deadline and returns
// their errors. The waits run on a goroutine of their own, so that a Wait
// that ignores its context is abandoned half a wait timeout after the
// deadline instead of hanging the suite; the goroutine then ends when the
// backend completes or fails the operation (at the latest when the suite
// closes its communicator).
func (c *config) await(ws []comm.Work, deadline time.Time) []error {
	res := make(chan []error, 1)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	go func() {
		defer cancel()
		errs := make([]error, len(ws))
		for i, w := range ws {
			errs[i] = w.Wait(ctx)
		}
		res <- errs
	}()
	grace := c.waitTimeout / 2
	timer := time.NewTimer(time.Until(deadline) + grace)
	defer timer.Stop()
	select {
	case errs := <-res:
		return errs
	case <-timer.C:
		errs := make([]error, len(ws))
		for i := range errs {
			errs[i] = fmt.Errorf("%w: Wait has not returned %v after its context's deadline", errHung, grace)
		}
		return errs
	}
}

// together is Run's driver: every rank runs here, from one goroutine. One
// phase of a check has run on every rank before the next starts, so sync
// has nothing to wait for, and the outcome of every rank is known here.
type together struct {
	n        int
	newGroup func(t *testing.T, n int) []comm.Communicator
	sizes    []int // the group sizes of the concurrency check
}

func (d *together) ranks() []int {
	rs := make([]int, d.n)
	for r := range rs {
		rs[r] = r
	}
	return rs
}

func (d *together) group(t *testing.T) []comm.Communicator { return d.groupOf(t, d.n) }

func (d *together) groupOf(t *testing.T, n int) []comm.Communicator {
	t.Helper()
	cs := d.newGroup(t, n)
	if len(cs) != n {
		t.Fatalf("newGroup(%d) returned %d communicators", n, len(cs))
	}
	for r, c := range cs {
		if c.Rank() != r || c.Size() != n {
			t.Fatalf("communicator %d of %d has Rank %d, Size %d", r, n, c.Rank(), c.Size())
		}
	}
	return cs
}

func (d *together) sync(*team) error           { return nil }
func (d *together) agree(*team, []int32) error { return nil }

func (d *together) concurrent(t *testing.T, tm *team) [][]comm.Communicator {
	gs := make([][]comm.Communicator, len(d.sizes))
	for i, n := range d.sizes {
		gs[i] = d.groupOf(t, n)
		tm.fresh = append(tm.fresh, gs[i])
	}
	return gs
}

// alone is RunSPMD's driver: one rank runs here; the others run the same
// checks elsewhere, and the ranks meet and agree on the control
// communicator.
type alone struct {
	newComm func(t *testing.T) comm.Communicator
	rank, n int
	calls   int
	control comm.Communicator
}

// first takes the main communicator, which sets the rank and group size
// that every later call must match.
func (d *alone) first(t *testing.T) comm.Communicator {
	t.Helper()
	d.calls++
	c := d.newComm(t)
	if c == nil {
		t.Fatal("newComm returned a nil communicator")
	}
	d.rank, d.n = c.Rank(), c.Size()
	if d.n < 1 || d.rank < 0 || d.rank >= d.n {
		t.Fatalf("newComm returned a communicator of rank %d in a group of %d", d.rank, d.n)
	}
	return c
}

func (d *alone) take(t *testing.T, what string) comm.Communicator {
	t.Helper()
	d.calls++
	c := d.newComm(t)
	if c == nil || c.Rank() != d.rank || c.Size() != d.n {
		got := "nil"
		if c != nil {
			got = fmt.Sprintf("rank %d of %d", c.Rank(), c.Size())
		}
		t.Fatalf("newComm call %d (%s) returned %s; the first call returned rank %d of %d", d.calls, what, got, d.rank, d.n)
	}
	return c
}

func (d *alone) closeControl(t *testing.T) {
	if d.control == nil {
		return
	}
	if err := d.control.Close(); err != nil {
		t.Errorf("rank %d: closing the control communicator: %v", d.rank, err)
	}
}

func (d *alone) group(t *testing.T) []comm.Communicator {
	g := make([]comm.Communicator, d.n)
	g[d.rank] = d.take(t, "a fresh group")
	return g
}

// controlDeadline is the deadline of an operation on the control
// communicator. It allows for a peer that arrives late because it waited
// out its own deadlines first: two waits of a check, each abandoned half a
// timeout after its deadline, come to three timeouts.
func (d *alone) controlDeadline(tm *team) time.Time {
	return time.Now().Add(4 * tm.cfg.waitTimeout)
}

func (d *alone) sync(tm *team) error {
	return tm.cfg.await([]comm.Work{d.control.Barrier()}, d.controlDeadline(tm))[0]
}

// agree combines the ranks' codes with an AllReduce Max on the control
// communicator, to which each rank contributes its own code at its index
// and zeros elsewhere.
func (d *alone) agree(tm *team, codes []int32) error {
	b := tm.mem.get(d.rank, slotControl, 4*d.n)
	v := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), d.n)
	copy(v, codes)
	buf := comm.HostBuffer(unsafe.Pointer(unsafe.SliceData(b)), d.n, comm.Int32)
	if err := tm.cfg.await([]comm.Work{d.control.AllReduce(buf, buf, comm.Max)}, d.controlDeadline(tm))[0]; err != nil {
		return err
	}
	copy(codes, v)
	return nil
}

func (d *alone) concurrent(t *testing.T, tm *team) [][]comm.Communicator {
	return [][]comm.Communicator{tm.freshGroup(t), tm.freshGroup(t)}
}
