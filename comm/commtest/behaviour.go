package commtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// small returns a buffer of k elements of dt in rank r's small slot.
func (tm *team) small(r, k int, dt comm.DType) comm.Buffer {
	return buffer(tm.mem.get(r, slotSmall, k*dt.Size()), dt)
}

func float32s(b comm.Buffer) []float32 { return unsafe.Slice((*float32)(b.Addr), b.Count) }
func float64s(b comm.Buffer) []float64 { return unsafe.Slice((*float64)(b.Addr), b.Count) }
func int64s(b comm.Buffer) []int64     { return unsafe.Slice((*int64)(b.Addr), b.Count) }

// barrier checks that no rank leaves a Barrier before every rank has
// entered it. The rank that enters last changes from round to round.
func (tm *team) barrier(t *testing.T) {
	n := tm.n
	for round := range 20 {
		late := round % n
		ws := make([]comm.Work, n)
		issued := make([]bool, n)
		tm.each(func(r int) {
			if r != late {
				ws[r], issued[r] = tm.cs[r].Barrier(), true
			}
		})
		tm.each(func(r int) {
			if r == late {
				return
			}
			for range 10 {
				if done, err := ws[r].Test(); done {
					tm.fail(r, "round %d: the barrier completed (error %v) before rank %d entered it", round, err, late)
					return
				}
				runtime.Gosched()
			}
		})
		tm.sync()
		tm.each(func(r int) {
			if r == late {
				ws[r], issued[r] = tm.cs[r].Barrier(), true
			}
		})
		deadline := tm.deadline()
		for _, r := range tm.local {
			if issued[r] {
				tm.waitOK(r, fmt.Sprintf("barrier, round %d", round), deadline, ws[r:r+1])
			}
		}
	}
}

// issueOrder issues a chain of dependent collectives on every rank and
// waits only at the end: each step reduces the previous step's result to a
// root and broadcasts it from there, which gives the expected values only
// if every rank runs its operations in issue order.
func (tm *team) issueOrder(t *testing.T) {
	n := tm.n
	const steps, count = 8, 7
	bufs := make([][]comm.Buffer, n) // by rank: the steps' buffers, then the gathered results
	tm.step(fmt.Sprintf("%d dependent reduce, broadcast and all_reduce steps", steps), func(r int) []comm.Work {
		mem := tm.small(r, (steps+1)*count+n, comm.Float64)
		bufs[r] = make([]comm.Buffer, steps+2)
		for k := range steps + 1 {
			bufs[r][k] = mem.Slice(k*count, count)
		}
		bufs[r][steps+1] = mem.Slice((steps+1)*count, n)
		clear(float64s(mem))
		for i, x := 0, float64s(bufs[r][0]); i < count; i++ {
			x[i] = float64(r + 1 + i)
		}
		var ws []comm.Work
		c := tm.cs[r]
		for k := range steps {
			root := k % n
			ws = append(ws, c.Reduce(bufs[r][k], bufs[r][k+1], comm.Sum, root), c.Broadcast(bufs[r][k+1], root))
			if k%3 == 2 {
				ws = append(ws, c.AllReduce(bufs[r][k+1], bufs[r][k+1], comm.Max))
			}
		}
		return append(ws, c.AllGather(bufs[r][steps].Slice(0, 1), bufs[r][steps+1]))
	}, func(r int) string {
		got := float64s(bufs[r][steps])
		for i := range count {
			want := float64(n*(n+1)/2 + n*i)
			for k := 1; k < steps; k++ {
				want *= float64(n)
			}
			if got[i] != want {
				return fmt.Sprintf("element %d of %d = %v, want %v", i, count, got[i], want)
			}
		}
		return ""
	})
}

// waitTwice checks that a Work may be waited for again, and tested, after
// it completed.
func (tm *team) waitTwice(t *testing.T) {
	n := tm.n
	ws := make([]comm.Work, n)
	tm.step("all_reduce(sum) of int64, count 2, in place, waited for twice", func(r int) []comm.Work {
		b := tm.small(r, 2, comm.Int64)
		v := int64s(b)
		v[0], v[1] = int64(r), 1
		ws[r] = tm.cs[r].AllReduce(b, b, comm.Sum)
		return ws[r : r+1]
	}, func(r int) string {
		if err := tm.cfg.await(ws[r:r+1], tm.deadline())[0]; err != nil {
			return fmt.Sprintf("second Wait: %v", err)
		}
		if done, err := ws[r].Test(); !done || err != nil {
			return fmt.Sprintf("Test after Wait = %v, %v; want true, nil", done, err)
		}
		if v, want := int64s(tm.small(r, 2, comm.Int64)), int64(n*(n-1)/2); v[0] != want || v[1] != int64(n) {
			return fmt.Sprintf("result %v, want [%d %d]", v, want, n)
		}
		return ""
	})
}

// waitDeadline checks that Wait returns when its context expires while
// the collective cannot complete, and that the collective completes later.
// Every rank in turn joins last, so every rank's Wait is checked.
func (tm *team) waitDeadline(t *testing.T) {
	n := tm.n
	const expiry = 20 * time.Millisecond
	for late := range n {
		ws := make([]comm.Work, n)
		issued := make([]bool, n)
		issue := func(r int) {
			b := tm.small(r, 2, comm.Float32)
			v := float32s(b)
			v[0], v[1] = float32(r), 2
			ws[r], issued[r] = tm.cs[r].AllReduce(b, b, comm.Sum), true
		}
		tm.each(func(r int) {
			if r != late {
				issue(r)
			}
		})
		tm.each(func(r int) {
			if r == late {
				return
			}
			// A Wait that ignores its context is a failure of Wait, not of
			// the collective, which completes once the late rank joins.
			err := tm.cfg.await(ws[r:r+1], time.Now().Add(expiry))[0]
			switch {
			case errors.Is(err, errHung):
				tm.fail(r, "Wait with a context that expired after %v has not returned after %v", expiry, tm.cfg.waitTimeout/2)
			case !errors.Is(err, context.DeadlineExceeded):
				tm.fail(r, "Wait on an all_reduce that rank %d has not joined, with a context that expired after %v = %v; want an error wrapping context.DeadlineExceeded", late, expiry, err)
			}
		})
		tm.sync()
		tm.each(func(r int) {
			if r == late {
				issue(r)
			}
		})
		deadline := tm.deadline()
		for _, r := range tm.local {
			if !issued[r] || !tm.waitOK(r, fmt.Sprintf("all_reduce(sum) of float, count 2, in place, joined last by rank %d", late), deadline, ws[r:r+1]) {
				continue
			}
			if v, want := float32s(tm.small(r, 2, comm.Float32)), float32(n*(n-1)/2); v[0] != want || v[1] != float32(2*n) {
				tm.fail(r, "all_reduce joined last by rank %d: result %v, want [%v %v]", late, v, want, 2*n)
			}
		}
	}
}

var errInjected = errors.New("commtest: injected failure")

// abort checks that Abort on the last rank fails its pending operation
// and every later one with an error wrapping comm.ErrAborted and the
// cause, and, for a backend whose Abort reaches its peers, the other
// ranks' operations too.
func (tm *team) abort(t *testing.T) {
	if tm.cfg.abortEndsRun {
		t.Skip("Abort ends the process on this backend (AbortEndsProcess)")
	}
	n, a := tm.n, tm.n-1
	g := tm.freshGroup(t)
	pending := make([]comm.Work, n)
	issued := make([]bool, n)
	tm.each(func(r int) {
		switch {
		case r == a && n > 1:
			// Rank 0 never sends: the Recv stays pending.
			pending[r], issued[r] = g[r].Recv(tm.small(r, 100, comm.Float32), 0), true
		case r != a && tm.cfg.abortPeers:
			// Rank a never joins: the AllReduce stays pending.
			b := tm.small(r, 100, comm.Float32)
			pending[r], issued[r] = g[r].AllReduce(b, b, comm.Sum), true
		}
	})
	tm.sync()
	tm.each(func(r int) {
		if r == a {
			g[r].Abort(errInjected)
		}
	})
	deadline := tm.deadline()
	for _, r := range tm.local {
		if !issued[r] {
			continue
		}
		errs, ok := tm.wait(r, "the operation pending at Abort", deadline, pending[r])
		switch {
		case !ok:
		case r == a && (!errors.Is(errs[0], comm.ErrAborted) || !errors.Is(errs[0], errInjected)):
			tm.fail(r, "recv pending when the rank aborted: %v; want an error wrapping comm.ErrAborted and the cause", errs[0])
		case r != a && (!errors.Is(errs[0], comm.ErrAborted) || !errors.Is(errs[0], errInjected)):
			tm.fail(r, "all_reduce pending when rank %d aborted: %v; want an error wrapping comm.ErrAborted and the cause, since Abort reaches the peers (AbortReachesPeers)", a, errs[0])
		}
	}
	// A peer whose Abort does not reach it issues nothing more: its
	// barrier could not complete.
	later := make([]comm.Work, n)
	issued = make([]bool, n)
	tm.each(func(r int) {
		if r == a || tm.cfg.abortPeers {
			later[r], issued[r] = g[r].Barrier(), true
		}
	})
	deadline = tm.deadline()
	for _, r := range tm.local {
		if !issued[r] {
			continue
		}
		errs, ok := tm.wait(r, "a barrier issued after Abort", deadline, later[r])
		switch {
		case !ok:
		case r == a && (!errors.Is(errs[0], comm.ErrAborted) || !errors.Is(errs[0], errInjected)):
			tm.fail(r, "barrier issued after the rank aborted: %v; want an error wrapping comm.ErrAborted and the cause", errs[0])
		case r != a && !errors.Is(errs[0], comm.ErrAborted):
			tm.fail(r, "barrier issued after rank %d aborted: %v; want an error wrapping comm.ErrAborted (AbortReachesPeers)", a, errs[0])
		}
	}
}

// mismatchCases issue collectives that disagree between ranks at the
// same sequence number; every rank must get ErrMismatch in an *OpError
// that carries its rank, the sequence number and its own operation, and
// whose message names the odd rank and both sides of the disagreement.
func (tm *team) mismatchCases(t *testing.T) {
	n := tm.n
	for _, c := range tm.cs {
		if c != nil && !comm.CapsOf(c).MismatchDetection {
			t.Skip("the backend does not report Caps.MismatchDetection")
		}
	}
	type issuer func(c comm.Communicator, odd bool, f func(k int, dt comm.DType) comm.Buffer) comm.Work
	cases := []struct {
		name  string
		odd   int          // the rank whose call differs from the others'
		names []string     // what the message must name: both values that differ
		kinds [2]comm.Kind // the operations of the odd rank and of the others
		issue issuer
	}{
		{"op", 0, []string{comm.Sum.String(), comm.Max.String()}, [2]comm.Kind{comm.KindAllReduce, comm.KindAllReduce}, func(c comm.Communicator, odd bool, f func(int, comm.DType) comm.Buffer) comm.Work {
			if odd {
				return c.AllReduce(f(7, comm.Float32), f(7, comm.Float32), comm.Sum)
			}
			return c.AllReduce(f(7, comm.Float32), f(7, comm.Float32), comm.Max)
		}},
		{"count", n - 1, []string{"7", "8"}, [2]comm.Kind{comm.KindAllReduce, comm.KindAllReduce}, func(c comm.Communicator, odd bool, f func(int, comm.DType) comm.Buffer) comm.Work {
			if odd {
				return c.AllReduce(f(8, comm.Float32), f(8, comm.Float32), comm.Sum)
			}
			return c.AllReduce(f(7, comm.Float32), f(7, comm.Float32), comm.Sum)
		}},
		{"dtype", 0, []string{comm.Int32.String(), comm.Float32.String()}, [2]comm.Kind{comm.KindAllReduce, comm.KindAllReduce}, func(c comm.Communicator, odd bool, f func(int, comm.DType) comm.Buffer) comm.Work {
			if odd {
				return c.AllReduce(f(7, comm.Int32), f(7, comm.Int32), comm.Sum)
			}
			return c.AllReduce(f(7, comm.Float32), f(7, comm.Float32), comm.Sum)
		}},
		{"kind", 0, []string{comm.KindAllReduce.String(), comm.KindBroadcast.String()}, [2]comm.Kind{comm.KindAllReduce, comm.KindBroadcast}, func(c comm.Communicator, odd bool, f func(int, comm.DType) comm.Buffer) comm.Work {
			if odd {
				return c.AllReduce(f(7, comm.Float32), f(7, comm.Float32), comm.Sum)
			}
			return c.Broadcast(f(7, comm.Float32), 0)
		}},
		{"root", 0, []string{"0", "1"}, [2]comm.Kind{comm.KindBroadcast, comm.KindBroadcast}, func(c comm.Communicator, odd bool, f func(int, comm.DType) comm.Buffer) comm.Work {
			if odd {
				return c.Broadcast(f(7, comm.Float32), 0)
			}
			return c.Broadcast(f(7, comm.Float32), 1)
		}},
		{"reduce op", n / 2, []string{comm.Min.String(), comm.Sum.String()}, [2]comm.Kind{comm.KindReduce, comm.KindReduce}, func(c comm.Communicator, odd bool, f func(int, comm.DType) comm.Buffer) comm.Work {
			if odd {
				return c.Reduce(f(5, comm.Float32), f(5, comm.Float32), comm.Min, 0)
			}
			return c.Reduce(f(5, comm.Float32), f(5, comm.Float32), comm.Sum, 0)
		}},
	}
	for _, tc := range cases {
		tm.check(t, tc.name, func(t *testing.T) {
			g := tm.freshGroup(t)
			// One good collective first, so the mismatch is not at the
			// first sequence number.
			tm.step("all_reduce(sum) of float, count 3, in place, before the mismatch", func(r int) []comm.Work {
				b := tm.small(r, 3, comm.Float32)
				return []comm.Work{g[r].AllReduce(b, b, comm.Sum)}
			}, nil)
			ws := make([]comm.Work, n)
			issued := make([]bool, n)
			tm.each(func(r int) {
				f := func(k int, dt comm.DType) comm.Buffer { return tm.small(r, k, dt) }
				ws[r], issued[r] = tc.issue(g[r], r == tc.odd, f), true
			})
			deadline := tm.deadline()
			for _, r := range tm.local {
				if !issued[r] {
					continue
				}
				errs, ok := tm.wait(r, "the mismatched collective", deadline, ws[r])
				if !ok {
					continue
				}
				err := errs[0]
				var oe *comm.OpError
				kind := tc.kinds[1]
				if r == tc.odd {
					kind = tc.kinds[0]
				}
				switch {
				case !errors.Is(err, comm.ErrMismatch):
					tm.fail(r, "%v; want ErrMismatch", err)
					continue
				case !errors.As(err, &oe) || oe.Rank != r:
					tm.fail(r, "%v; want an *OpError of rank %d", err, r)
					continue
				case oe.Seq != 2 || oe.Kind != kind:
					tm.fail(r, "%v: OpError for %s #%d; want %s #2 (the rank's second operation)", err, oe.Kind, oe.Seq, kind)
				}
				msg := err.Error()
				if r != tc.odd && !strings.Contains(msg, fmt.Sprintf("rank %d", tc.odd)) {
					tm.fail(r, "%q does not name rank %d, the one that differs", msg, tc.odd)
				}
				for _, w := range tc.names {
					if !strings.Contains(msg, w) {
						tm.fail(r, "%q does not name %q", msg, w)
					}
				}
			}
		})
	}
}

// invalid issues the same bad call on every rank of one fresh group;
// every rank must get ErrInvalid.
func (tm *team) invalid(t *testing.T) {
	n := tm.n
	type issuer func(c comm.Communicator, f func(k int) comm.Buffer) comm.Work
	cases := []struct {
		name  string
		issue issuer
	}{
		{"broadcast root -1", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.Broadcast(f(4), -1) }},
		{"broadcast root n", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.Broadcast(f(4), n) }},
		{"reduce root n", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.Reduce(f(4), f(4), comm.Sum, n) }},
		{"all_gather recv count", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work {
			return c.AllGather(f(4), f(4*n+1))
		}},
		{"reduce_scatter send count", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work {
			return c.ReduceScatter(f(4*n-1), f(4), comm.Sum)
		}},
		{"all_reduce op 0", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.AllReduce(f(4), f(4), 0) }},
		{"all_reduce op 99", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.AllReduce(f(4), f(4), 99) }},
		{"all_reduce dtype 0", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work {
			b := f(4)
			b.DType = 0
			return c.AllReduce(b, b, comm.Sum)
		}},
		{"all_reduce negative count", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work {
			b := f(4)
			b.Count = -1
			return c.AllReduce(b, b, comm.Sum)
		}},
		{"send to self", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.Send(f(4), c.Rank()) }},
		{"send to rank n", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.Send(f(4), n) }},
		{"recv from rank -1", func(c comm.Communicator, f func(int) comm.Buffer) comm.Work { return c.Recv(f(4), -1) }},
	}
	// One group serves every case: bad calls are refused before they
	// reach the other ranks, or refused by all of them alike.
	g := tm.group(t)
	defer tm.closeGroups(t, [][]comm.Communicator{g})
	for _, tc := range cases {
		tm.check(t, tc.name, func(t *testing.T) {
			ws := make([]comm.Work, n)
			issued := make([]bool, n)
			tm.each(func(r int) {
				// Distinct slots, so that a call with two buffers of
				// different sizes gets two live blocks.
				f := func(k int) comm.Buffer {
					s := slotSend
					if k != 4 {
						s = slotRecv
					}
					return buffer(tm.mem.get(r, s, 4*k), comm.Float32)
				}
				ws[r], issued[r] = tc.issue(g[r], f), true
			})
			deadline := tm.deadline()
			for _, r := range tm.local {
				if !issued[r] {
					continue
				}
				if errs, ok := tm.wait(r, tc.name, deadline, ws[r]); ok && !errors.Is(errs[0], comm.ErrInvalid) {
					tm.fail(r, "%s: %v; want ErrInvalid", tc.name, errs[0])
				}
			}
		})
	}
}

// close checks that closing a rank fails its pending collective with
// ErrClosed, that Close is idempotent and that operations issued after
// Close fail with ErrClosed.
func (tm *team) close(t *testing.T) {
	g := tm.freshGroup(t)
	// A backend whose Abort ends the process may end it on a Close with
	// an operation pending.
	withPending := tm.n > 1 && !tm.cfg.abortEndsRun
	tm.each(func(r int) {
		if r != 0 {
			return
		}
		b := tm.small(r, 10, comm.Float32)
		var pending comm.Work
		if withPending {
			pending = g[r].AllReduce(b, b, comm.Sum)
		}
		for i := range 2 {
			if err := g[r].Close(); err != nil {
				tm.fail(r, "Close #%d: %v", i+1, err)
			}
		}
		if withPending {
			errs, ok := tm.wait(r, "all_reduce pending at Close", tm.deadline(), pending)
			if !ok {
				return
			}
			if !errors.Is(errs[0], comm.ErrClosed) {
				tm.fail(r, "all_reduce pending at Close: %v; want ErrClosed", errs[0])
			}
		}
		errs, ok := tm.wait(r, "all_reduce issued after Close", tm.deadline(), g[r].AllReduce(b, b, comm.Sum))
		if ok && !errors.Is(errs[0], comm.ErrClosed) {
			tm.fail(r, "all_reduce issued after Close: %v; want ErrClosed", errs[0])
		}
	})
}

// concurrentGroups drives several groups at once, each rank of each group
// from its own goroutine.
func (tm *team) concurrentGroups(t *testing.T) {
	gs := tm.drv.concurrent(t, tm)
	const count = 1000
	type job struct {
		g, r, n int
		c       comm.Communicator
		buf     comm.Buffer
		msg     string
		broken  bool
	}
	var jobs []*job
	for gi, g := range gs {
		for r, c := range g {
			if c != nil {
				b := buffer(tm.mem.get(r, slotGroup+slot(gi), 4*count), comm.Float32)
				jobs = append(jobs, &job{g: gi, r: r, n: len(g), c: c, buf: b})
			}
		}
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() { j.msg, j.broken = tm.hammer(j.c, j.n, j.buf) })
	}
	wg.Wait()
	for _, j := range jobs {
		switch {
		case j.broken:
			tm.tainted = true
			tm.broke(j.r, "group %d (%d ranks): %s", j.g, j.n, j.msg)
		case j.msg != "":
			tm.fail(j.r, "group %d (%d ranks): %s", j.g, j.n, j.msg)
		}
	}
}

// hammer runs a rank's side of the concurrency check on c and returns its
// first failure, and whether an operation failed or did not complete.
func (tm *team) hammer(c comm.Communicator, n int, b comm.Buffer) (string, bool) {
	const iters = 50
	r, buf := c.Rank(), float32s(b)
	first := ""
	for it := range iters {
		for i := range buf {
			buf[i] = float32(r + it + i%10)
		}
		if err := tm.cfg.await([]comm.Work{c.AllReduce(b, b, comm.Sum)}, tm.deadline())[0]; err != nil {
			return fmt.Sprintf("iteration %d: all_reduce: %v", it, err), true
		}
		// A wrong value is reported once the iterations are done: the
		// other ranks of the group still expect every one of them.
		for i, v := range buf {
			if want := float32(n*(n-1)/2 + n*(it+i%10)); v != want && first == "" {
				first = fmt.Sprintf("iteration %d: all_reduce(sum) of float, count %d, in place: element %d of %d = %v, want %v", it, len(buf), i, len(buf), v, want)
			}
		}
		if it%10 == 0 {
			if err := tm.cfg.await([]comm.Work{c.Barrier()}, tm.deadline())[0]; err != nil {
				return fmt.Sprintf("iteration %d: barrier: %v", it, err), true
			}
		}
	}
	return first, false
}
