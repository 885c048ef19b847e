package mpi

import (
	"fmt"
	"strings"
	"time"
)

// What stall reports and failed waits say about the ranks of an
// all-reduce in shared memory, and about this rank's own pauses. It needs
// no cgo, so that its words are tested in every build.

// rankState is what the shared-memory segment tells of a rank.
type rankState uint8

const (
	rankRunning rankState = iota
	rankStopped           // its process is stopped (SIGSTOP, or a debugger)
	rankExited            // its process has exited (or its pid names another now)
	rankClosed            // it has closed its communicator
)

// peer is a rank as a report names it.
type peer struct {
	rank, pid int
	state     rankState
}

// String names the rank and its process: "rank 1 (process 42, stopped)".
func (p peer) String() string {
	if p.state == rankStopped {
		return fmt.Sprintf("rank %d (process %d, stopped)", p.rank, p.pid)
	}
	return fmt.Sprintf("rank %d (process %d)", p.rank, p.pid)
}

// shmWait says for whom this rank (me) waits in an all-reduce in shared
// memory. missing are the ranks that have not published what it waits
// for; others the ranks that have, other than me. The ranks returned are
// the stall's Missing: missing's, or, when every rank has published, me
// alone, since what is left of the all-reduce is this rank's own part (a
// rank that is not missing cannot have left it unfinished). The detail
// says why each missing rank is missing, and which of the others have
// exited or closed their communicator since.
func shmWait(me int, missing, others []peer) ([]int, string) {
	var clauses, waited []string
	ranks := make([]int, 0, max(len(missing), 1))
	for _, p := range missing {
		ranks = append(ranks, p.rank)
		if p.state == rankRunning || p.state == rankStopped {
			waited = append(waited, p.String())
		}
	}
	switch {
	case len(missing) == 0:
		ranks = append(ranks, me)
		clauses = append(clauses, "every rank has posted it; this rank has still to finish it")
	case len(waited) == 1:
		clauses = append(clauses, waited[0]+" has not joined it")
	case len(waited) > 1:
		clauses = append(clauses, strings.Join(waited, ", ")+" have not joined it")
	}
	for _, ps := range [][]peer{missing, others} {
		for _, p := range ps {
			switch p.state {
			case rankExited:
				clauses = append(clauses, p.String()+" has exited")
			case rankClosed:
				clauses = append(clauses, p.String()+" has closed its communicator")
			}
		}
	}
	return ranks, strings.Join(clauses, "; ")
}

// mayHaveClosed is what a report says of the peers where MPI cannot tell
// which ranks an operation waits for (outside shared memory): a peer that
// closed its communicator looks the same as one that has not issued the
// operation yet.
const mayHaveClosed = "a peer may not have issued it yet, or may have closed its communicator"

// pause is the last stretch in which a watchdog's ticks did not come,
// found from the gaps between them: when a tick comes far later than its
// period, this process did not run (it was stopped, or starved of
// processor time) for at least the gap less one period.
type pause struct {
	last    time.Time     // the last tick
	end     time.Time     // the end of the last pause found
	lasted  time.Duration // and its least length
	started bool
}

// tick notes a tick of period every at now.
func (p *pause) tick(now time.Time, every time.Duration) {
	if p.started {
		// Late by more than a period and more than a second: no
		// scheduler delay of a running process comes near that.
		if late := now.Sub(p.last) - every; late > max(every, time.Second) {
			p.end, p.lasted = now, late
		}
	}
	p.last, p.started = now, true
}

// since says how long this rank did not run after t, as a clause of a
// report ("" if it ran throughout, as far as the ticks tell).
func (p *pause) since(t time.Time) string {
	if p.lasted == 0 || p.end.Before(t) {
		return ""
	}
	return fmt.Sprintf("this rank did not run for at least %v (stopped?)", p.lasted.Round(time.Second/10))
}

// joinClauses joins the non-empty clauses of a report with "; ".
func joinClauses(cs ...string) string {
	var b strings.Builder
	for _, c := range cs {
		if c == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(c)
	}
	return b.String()
}
