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

	"github.com/ddpgo/ddpgo/comm"
)

// barrier checks that no rank leaves a Barrier before every rank has
// entered it.
func (s *suite) barrier(t *testing.T, cs []comm.Communicator) {
	n := len(cs)
	ws := make([]comm.Work, n)
	for round := range 20 {
		for r := range n - 1 {
			ws[r] = cs[r].Barrier()
		}
		for range 10 {
			for r := range n - 1 {
				if done, err := ws[r].Test(); done {
					t.Fatalf("round %d: rank %d's barrier completed (err %v) before rank %d entered it", round, r, err, n-1)
				}
			}
			runtime.Gosched()
		}
		ws[n-1] = cs[n-1].Barrier()
		s.waitOK(t, ws)
	}
}

// issueOrder issues a chain of dependent collectives on every rank and
// waits only at the end: each step reduces the previous step's result to a
// root and broadcasts it from there, which gives the expected values only
// if every rank runs its operations in issue order.
func (s *suite) issueOrder(t *testing.T, cs []comm.Communicator) {
	n := len(cs)
	const steps, count = 8, 7
	bufs := make([][][]float64, n)
	var ws []comm.Work
	for r := range cs {
		bufs[r] = make([][]float64, steps+1)
		for k := range bufs[r] {
			bufs[r][k] = make([]float64, count)
		}
		for i := range count {
			bufs[r][0][i] = float64(r + 1 + i)
		}
	}
	for k := range steps {
		root := k % n
		for r, c := range cs {
			ws = append(ws, c.Reduce(comm.Float64s(bufs[r][k]), comm.Float64s(bufs[r][k+1]), comm.Sum, root))
		}
		for r, c := range cs {
			ws = append(ws, c.Broadcast(comm.Float64s(bufs[r][k+1]), root))
		}
		if k%3 == 2 {
			for r, c := range cs {
				ws = append(ws, c.AllReduce(comm.Float64s(bufs[r][k+1]), comm.Float64s(bufs[r][k+1]), comm.Max))
			}
		}
	}
	var all []comm.Work
	for r, c := range cs {
		all = append(all, c.AllGather(comm.Float64s(bufs[r][steps][:1]), comm.Float64s(make([]float64, n))))
	}
	s.waitOK(t, append(ws, all...))
	for i := range count {
		want := float64(n*(n+1)/2 + n*i)
		for k := 1; k < steps; k++ {
			want *= float64(n)
		}
		for r := range cs {
			if got := bufs[r][steps][i]; got != want {
				t.Fatalf("rank %d, element %d after %d dependent steps = %v, want %v", r, i, steps, got, want)
			}
		}
	}
}

func (s *suite) waitTwice(t *testing.T, cs []comm.Communicator) {
	n := len(cs)
	ws := make([]comm.Work, n)
	bufs := make([][]int64, n)
	for r, c := range cs {
		bufs[r] = []int64{int64(r), 1}
		ws[r] = c.AllReduce(comm.Int64s(bufs[r]), comm.Int64s(bufs[r]), comm.Sum)
	}
	s.waitOK(t, ws)
	s.waitOK(t, ws)
	for r, w := range ws {
		if done, err := w.Test(); !done || err != nil {
			t.Errorf("rank %d: Test after Wait = %v, %v; want true, nil", r, done, err)
		}
		if want := int64(n * (n - 1) / 2); bufs[r][0] != want || bufs[r][1] != int64(n) {
			t.Errorf("rank %d: %v, want [%d %d]", r, bufs[r], want, n)
		}
	}
}

// waitDeadline checks that Wait returns when its context expires while
// the collective cannot complete, and that the collective completes later.
func (s *suite) waitDeadline(t *testing.T, cs []comm.Communicator) {
	n := len(cs)
	ws := make([]comm.Work, n)
	bufs := make([][]float32, n)
	for r := range cs {
		bufs[r] = []float32{float32(r), 2}
	}
	for r := range n - 1 {
		ws[r] = cs[r].AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), comm.Sum)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	errc := make(chan error, 1)
	go func() { errc <- ws[0].Wait(ctx) }()
	var err error
	select {
	case err = <-errc:
	case <-time.After(s.cfg.waitTimeout):
		t.Fatalf("Wait with a context that expired after 20ms has not returned after %v", s.cfg.waitTimeout)
	}
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a collective that rank %d has not joined, with an expiring context = %v; want context.DeadlineExceeded", n-1, err)
	}
	ws[n-1] = cs[n-1].AllReduce(comm.Float32s(bufs[n-1]), comm.Float32s(bufs[n-1]), comm.Sum)
	s.waitOK(t, ws)
	for r := range cs {
		if want := float32(n * (n - 1) / 2); bufs[r][0] != want || bufs[r][1] != float32(2*n) {
			t.Errorf("rank %d: %v, want [%v %v]", r, bufs[r], want, 2*n)
		}
	}
}

var errInjected = errors.New("commtest: injected failure")

// abort checks that Abort on the last rank fails the pending collectives
// of every other rank and every later operation of every rank.
func (s *suite) abort(t *testing.T, n int) {
	cs := s.group(t, n)
	ws := make([]comm.Work, n-1)
	for r := range n - 1 {
		ws[r] = allReduceInPlace(cs[r], comm.Float32s(make([]float32, 100)), comm.Sum)
	}
	cs[n-1].Abort(errInjected)
	for r, err := range s.wait(t, ws) {
		if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, errInjected) {
			t.Errorf("rank %d: pending all_reduce after rank %d aborted: %v; want an error wrapping ErrAborted and the cause", r, n-1, err)
		}
	}
	later := make([]comm.Work, n)
	for r, c := range cs {
		later[r] = c.Barrier()
	}
	for r, err := range s.wait(t, later) {
		if !errors.Is(err, comm.ErrAborted) {
			t.Errorf("rank %d: barrier after abort: %v; want ErrAborted", r, err)
		}
	}
}

// mismatchCases issue collectives that disagree between ranks at the
// same sequence number; every rank must get ErrMismatch in an *OpError
// that carries its rank, the sequence number and its own operation, and
// whose message names the odd rank and both sides of the disagreement.
func (s *suite) mismatchCases(t *testing.T, n int) {
	f := func(k int) comm.Buffer { return comm.Float32s(make([]float32, k)) }
	cases := []struct {
		name  string
		odd   int          // the rank whose call differs from the others'
		names []string     // what the message must name: both values that differ
		kinds [2]comm.Kind // the operations of the odd rank and of the others
		issue func(c comm.Communicator, odd bool) comm.Work
	}{
		{"op", 0, []string{comm.Sum.String(), comm.Max.String()}, [2]comm.Kind{comm.KindAllReduce, comm.KindAllReduce}, func(c comm.Communicator, odd bool) comm.Work {
			if odd {
				return c.AllReduce(f(7), f(7), comm.Sum)
			}
			return c.AllReduce(f(7), f(7), comm.Max)
		}},
		{"count", n - 1, []string{"7", "8"}, [2]comm.Kind{comm.KindAllReduce, comm.KindAllReduce}, func(c comm.Communicator, odd bool) comm.Work {
			if odd {
				return c.AllReduce(f(8), f(8), comm.Sum)
			}
			return c.AllReduce(f(7), f(7), comm.Sum)
		}},
		{"dtype", 0, []string{comm.Int32.String(), comm.Float32.String()}, [2]comm.Kind{comm.KindAllReduce, comm.KindAllReduce}, func(c comm.Communicator, odd bool) comm.Work {
			if odd {
				return allReduceInPlace(c, comm.Int32s(make([]int32, 7)), comm.Sum)
			}
			return c.AllReduce(f(7), f(7), comm.Sum)
		}},
		{"kind", 0, []string{comm.KindAllReduce.String(), comm.KindBroadcast.String()}, [2]comm.Kind{comm.KindAllReduce, comm.KindBroadcast}, func(c comm.Communicator, odd bool) comm.Work {
			if odd {
				return c.AllReduce(f(7), f(7), comm.Sum)
			}
			return c.Broadcast(f(7), 0)
		}},
		{"root", 0, []string{"0", "1"}, [2]comm.Kind{comm.KindBroadcast, comm.KindBroadcast}, func(c comm.Communicator, odd bool) comm.Work {
			if odd {
				return c.Broadcast(f(7), 0)
			}
			return c.Broadcast(f(7), 1)
		}},
		{"reduce op", n / 2, []string{comm.Min.String(), comm.Sum.String()}, [2]comm.Kind{comm.KindReduce, comm.KindReduce}, func(c comm.Communicator, odd bool) comm.Work {
			if odd {
				return c.Reduce(f(5), f(5), comm.Min, 0)
			}
			return c.Reduce(f(5), f(5), comm.Sum, 0)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := s.group(t, n)
			// One good collective first, so the mismatch is not at the
			// first sequence number.
			ws := make([]comm.Work, n)
			for r, c := range cs {
				ws[r] = c.AllReduce(f(3), f(3), comm.Sum)
			}
			s.waitOK(t, ws)
			for r, c := range cs {
				ws[r] = tc.issue(c, r == tc.odd)
			}
			for r, err := range s.wait(t, ws) {
				var oe *comm.OpError
				kind := tc.kinds[1]
				if r == tc.odd {
					kind = tc.kinds[0]
				}
				switch {
				case !errors.Is(err, comm.ErrMismatch):
					t.Errorf("rank %d: %v; want ErrMismatch", r, err)
					continue
				case !errors.As(err, &oe) || oe.Rank != r:
					t.Errorf("rank %d: %v; want an *OpError of rank %d", r, err, r)
					continue
				case oe.Seq != 2 || oe.Kind != kind:
					t.Errorf("rank %d: %v: OpError for %s #%d; want %s #2 (the rank's second operation)", r, err, oe.Kind, oe.Seq, kind)
				}
				msg := err.Error()
				if r != tc.odd && !strings.Contains(msg, fmt.Sprintf("rank %d", tc.odd)) {
					t.Errorf("rank %d: %q does not name rank %d, the one that differs", r, msg, tc.odd)
				}
				for _, w := range tc.names {
					if !strings.Contains(msg, w) {
						t.Errorf("rank %d: %q does not name %q", r, msg, w)
					}
				}
			}
		})
	}
}

// invalid issues the same bad call on every rank; every rank must get
// ErrInvalid.
func (s *suite) invalid(t *testing.T, n int) {
	f := func(k int) comm.Buffer { return comm.Float32s(make([]float32, k)) }
	cases := []struct {
		name  string
		issue func(c comm.Communicator) comm.Work
	}{
		{"broadcast root -1", func(c comm.Communicator) comm.Work { return c.Broadcast(f(4), -1) }},
		{"broadcast root n", func(c comm.Communicator) comm.Work { return c.Broadcast(f(4), n) }},
		{"reduce root n", func(c comm.Communicator) comm.Work { return c.Reduce(f(4), f(4), comm.Sum, n) }},
		{"all_gather recv count", func(c comm.Communicator) comm.Work { return c.AllGather(f(4), f(4*n+1)) }},
		{"reduce_scatter send count", func(c comm.Communicator) comm.Work { return c.ReduceScatter(f(4*n-1), f(4), comm.Sum) }},
		{"all_reduce op 0", func(c comm.Communicator) comm.Work { return c.AllReduce(f(4), f(4), 0) }},
		{"all_reduce op 99", func(c comm.Communicator) comm.Work { return c.AllReduce(f(4), f(4), 99) }},
		{"all_reduce dtype 0", func(c comm.Communicator) comm.Work {
			b := f(4)
			b.DType = 0
			return c.AllReduce(b, b, comm.Sum)
		}},
		{"all_reduce negative count", func(c comm.Communicator) comm.Work {
			b := f(4)
			b.Count = -1
			return c.AllReduce(b, b, comm.Sum)
		}},
		{"send to self", func(c comm.Communicator) comm.Work { return c.Send(f(4), c.Rank()) }},
		{"send to rank n", func(c comm.Communicator) comm.Work { return c.Send(f(4), n) }},
		{"recv from rank -1", func(c comm.Communicator) comm.Work { return c.Recv(f(4), -1) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := s.group(t, n)
			ws := make([]comm.Work, n)
			for r, c := range cs {
				ws[r] = tc.issue(c)
			}
			for r, err := range s.wait(t, ws) {
				if !errors.Is(err, comm.ErrInvalid) {
					t.Errorf("rank %d: %v; want ErrInvalid", r, err)
				}
			}
		})
	}
}

// close checks that closing a rank fails its pending collective with
// ErrClosed, that Close is idempotent and that operations issued after
// Close fail with ErrClosed.
func (s *suite) close(t *testing.T, n int) {
	cs := s.group(t, n)
	var pending comm.Work
	if n > 1 {
		pending = allReduceInPlace(cs[0], comm.Float32s(make([]float32, 10)), comm.Sum)
	}
	for i := range 2 {
		if err := cs[0].Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if n > 1 {
		if err := s.wait(t, []comm.Work{pending})[0]; !errors.Is(err, comm.ErrClosed) {
			t.Errorf("collective pending at Close: %v; want ErrClosed", err)
		}
	}
	after := allReduceInPlace(cs[0], comm.Float32s(make([]float32, 10)), comm.Sum)
	if err := s.wait(t, []comm.Work{after})[0]; !errors.Is(err, comm.ErrClosed) {
		t.Errorf("collective issued after Close: %v; want ErrClosed", err)
	}
}

// concurrentGroups drives several groups at once, each rank from its own
// goroutine.
func (s *suite) concurrentGroups(t *testing.T) {
	var sizes []int
	for _, n := range s.cfg.ranks {
		if n > 1 {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		sizes = []int{1}
	}
	sizes = append(sizes, sizes[0])
	const iters, count = 50, 1000
	var wg sync.WaitGroup
	for gi, n := range sizes {
		cs := s.group(t, n)
		for r, c := range cs {
			wg.Go(func() {
				buf := make([]float32, count)
				ctx, cancel := context.WithTimeout(context.Background(), s.cfg.waitTimeout)
				defer cancel()
				for it := range iters {
					for i := range buf {
						buf[i] = float32(r + it + i%10)
					}
					if err := c.AllReduce(comm.Float32s(buf), comm.Float32s(buf), comm.Sum).Wait(ctx); err != nil {
						t.Errorf("group %d, rank %d, iteration %d: %v", gi, r, it, err)
						return
					}
					for i, v := range buf {
						if want := float32(n*(n-1)/2 + n*(it+i%10)); v != want {
							t.Errorf("group %d (%d ranks), rank %d, iteration %d: element %d = %v, want %v", gi, n, r, it, i, v, want)
							return
						}
					}
					if it%10 == 0 {
						if err := c.Barrier().Wait(ctx); err != nil {
							t.Errorf("group %d, rank %d, barrier: %v", gi, r, err)
							return
						}
					}
				}
			})
		}
	}
	wg.Wait()
}

// allReduceInPlace issues the in-place form of AllReduce on buf.
func allReduceInPlace(c comm.Communicator, buf comm.Buffer, op comm.Op) comm.Work {
	return c.AllReduce(buf, buf, op)
}
