package mpi

import (
	"slices"
	"testing"
	"time"
)

// TestShmWait: what a stall report or a failed wait says of the ranks of
// an all-reduce in shared memory, in each state a rank can be in. Every
// rank having posted is not "the data is still moving": what is left is
// this rank's own part, so this rank is named; peers that exited or closed
// their communicator are named so, whether or not they had posted.
func TestShmWait(t *testing.T) {
	run := func(r int) peer { return peer{rank: r, pid: 100 + r} }
	in := func(r int, s rankState) peer { return peer{rank: r, pid: 100 + r, state: s} }
	for _, c := range []struct {
		name            string
		me              int
		missing, others []peer
		ranks           []int
		detail          string
	}{
		{"one-running", 0, []peer{run(1)}, nil, []int{1},
			"rank 1 (process 101) has not joined it"},
		{"one-stopped", 0, []peer{in(2, rankStopped)}, []peer{run(1)}, []int{2},
			"rank 2 (process 102, stopped) has not joined it"},
		{"two", 0, []peer{run(1), in(2, rankStopped)}, nil, []int{1, 2},
			"rank 1 (process 101), rank 2 (process 102, stopped) have not joined it"},
		{"closed", 0, []peer{in(1, rankClosed)}, nil, []int{1},
			"rank 1 (process 101) has closed its communicator"},
		{"exited", 1, []peer{in(0, rankExited)}, nil, []int{0},
			"rank 0 (process 100) has exited"},
		{"closed-and-late", 0, []peer{run(1), in(2, rankClosed)}, nil, []int{1, 2},
			"rank 1 (process 101) has not joined it; rank 2 (process 102) has closed its communicator"},
		{"all-posted", 0, nil, []peer{run(1)}, []int{0},
			"every rank has posted it; this rank has still to finish it"},
		{"all-posted-peer-exited", 0, nil, []peer{in(1, rankExited)}, []int{0},
			"every rank has posted it; this rank has still to finish it; rank 1 (process 101) has exited"},
		{"all-posted-peer-closed", 2, nil, []peer{run(0), in(1, rankClosed)}, []int{2},
			"every rank has posted it; this rank has still to finish it; rank 1 (process 101) has closed its communicator"},
		{"missing-and-exited", 0, []peer{in(2, rankStopped)}, []peer{in(1, rankExited)}, []int{2},
			"rank 2 (process 102, stopped) has not joined it; rank 1 (process 101) has exited"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ranks, detail := shmWait(c.me, c.missing, c.others)
			if !slices.Equal(ranks, c.ranks) || detail != c.detail {
				t.Errorf("shmWait = %v, %q;\nwant %v, %q", ranks, detail, c.ranks, c.detail)
			}
		})
	}
}

// TestPause: a watchdog tick far later than its period says that this
// process did not run, for the waits that the pause fell in, and only for
// them; ticks on time, or late by less than a second, say nothing.
func TestPause(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const every = time.Second
	var p pause
	for i := range 5 {
		p.tick(t0.Add(time.Duration(i)*every+time.Duration(i)*100*time.Millisecond), every) // a little late each time
	}
	if got := p.since(t0); got != "" {
		t.Fatalf("after ticks on time: %q; want nothing", got)
	}
	// Stopped after the tick at 4.4 s: the next comes at 8.4 s.
	p.tick(t0.Add(8400*time.Millisecond), every)
	want := "this rank did not run for at least 3s (stopped?)"
	if got := p.since(t0.Add(3 * time.Second)); got != want {
		t.Errorf("a wait begun before the pause: %q; want %q", got, want)
	}
	p.tick(t0.Add(9400*time.Millisecond), every)
	if got := p.since(t0.Add(9 * time.Second)); got != "" {
		t.Errorf("a wait begun after the pause: %q; want nothing", got)
	}
	if got := p.since(t0.Add(3 * time.Second)); got != want {
		t.Errorf("the pause is forgotten by the next tick: %q; want %q", got, want)
	}

	// A fast watchdog (a 1 ms period) whose ticks come 500 ms late, as on
	// a loaded machine, says nothing.
	var q pause
	q.tick(t0, time.Millisecond)
	q.tick(t0.Add(500*time.Millisecond), time.Millisecond)
	if got := q.since(t0); got != "" {
		t.Errorf("a 500 ms gap at a 1 ms period: %q; want nothing", got)
	}
}

func TestJoinClauses(t *testing.T) {
	if got := joinClauses("", "a", "", "b"); got != "a; b" {
		t.Errorf("joinClauses = %q", got)
	}
}
