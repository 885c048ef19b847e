package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ddpgo/ddpgo/bench"
)

// Interrupts. The first SIGINT or SIGTERM cancels the command's context
// with interruptCause as its cause, which says what the signal means and,
// in a launched job, which ranks of this machine have exited: under
// mpirun a rank learns of a peer's death only by the SIGTERM with which
// mpirun ends the others (after Ctrl-C too), and a collective waiting on
// shared memory cannot tell who is missing.

// interruptCause is the cause the command's context is cancelled with
// when signal s arrives. It wraps context.Canceled.
func interruptCause(s os.Signal) error {
	msg := "received " + s.String()
	if s == syscall.SIGTERM {
		msg = "received SIGTERM (under mpirun: Ctrl-C, or a process of the job has ended)"
	}
	if gone := peersGone(); gone != "" {
		msg += "; " + gone
	}
	return fmt.Errorf("%w: %s", context.Canceled, msg)
}

// jobPeers is where the ranks of this process's launched job run, once
// the command has learnt it (watchPeers).
var jobPeers atomic.Pointer[peerSet]

type peerSet struct {
	rank  int
	host  string
	hosts []bench.Host
}

// watchPeers records where every rank of g's launched job runs (hosts,
// from rankHosts), so that an interrupt can say which ranks on this
// machine have exited.
func watchPeers(g *group, hosts []bench.Host) {
	if !g.launched || g.size == 1 {
		return
	}
	host, _ := os.Hostname()
	jobPeers.Store(&peerSet{rank: g.rank, host: host, hosts: hosts})
}

// peersGone names the ranks of the job, on this machine, whose process
// no longer exists.
func peersGone() string {
	ps := jobPeers.Load()
	if ps == nil {
		return ""
	}
	var gone []string
	for _, h := range ps.hosts {
		if h.Rank == ps.rank || h.Name != ps.host || h.PID <= 0 {
			continue
		}
		if err := syscall.Kill(h.PID, 0); errors.Is(err, syscall.ESRCH) {
			gone = append(gone, fmt.Sprintf("rank %d (pid %d)", h.Rank, h.PID))
		}
	}
	switch len(gone) {
	case 0:
		return ""
	case 1:
		return gone[0] + ", on this machine, has exited (mpirun's message says how)"
	}
	return strings.Join(gone, ", ") + ", on this machine, have exited (mpirun's message says how)"
}

// interruptGrace is how long a launched job's ranks other than 0 wait,
// once interrupted, before they stop: stopping a rank mid-collective ends
// the whole job, and rank 0, interrupted at the same moment by mpirun,
// first prints the statistics of the steps completed.
const interruptGrace = 500 * time.Millisecond
