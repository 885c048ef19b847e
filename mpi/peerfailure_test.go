//go:build mpi && cgo

package mpi

import (
	"errors"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/shm"
)

// TestPeerFailureJobRanks: on a level of a hierarchy (rank 1 of a host
// whose ranks are the job's 2 and 3) every failed shared-memory wait
// names the job's ranks, the one the engine reports in its own words (a
// wait that timed out) included, which still unwraps to the engine's
// error.
func TestPeerFailureJobRanks(t *testing.T) {
	c := &communicator{rank: 1, size: 2, level: "host", job: []int{2, 3}}
	p := shm.Ident{Pid: 42}
	for _, tc := range []struct {
		err     error
		want    string
		aborted bool
	}{
		{&shm.AbortError{Rank: 0, Cause: "out of memory"}, "rank 2 aborted the job: out of memory", true},
		{&shm.PeerError{Rank: 0, Proc: p, Closed: true}, "rank 2 (process 42) has closed its communicator", true},
		{&shm.PeerError{Rank: 0, Proc: p, State: shm.Gone}, "rank 2 (process 42) has exited", true},
		{&shm.PeerError{Rank: 0, Proc: p, State: shm.Stopped, Timeout: true}, "mpi: rank 3: the shared-memory wait failed: timed out waiting for rank 2 (process 42, stopped)", false},
	} {
		err := c.peerFailure(tc.err)
		if !strings.Contains(err.Error(), tc.want) || errors.Is(err, comm.ErrAborted) != tc.aborted {
			t.Errorf("%v: %v, want %q (aborted %v)", tc.err, err, tc.want, tc.aborted)
		}
		var pe *shm.PeerError
		if errors.As(tc.err, &pe) && !tc.aborted && (!errors.As(err, &pe) || pe.Rank != 2 || !pe.Timeout) {
			t.Errorf("%v: %v does not unwrap to the engine's error with the job's rank", tc.err, err)
		}
	}
}
