//go:build mpi && cgo

package mpi_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/mpi"
)

// TestSPMD runs the conformance suite, this process being one rank of the
// world, over communicators in the default, non-blocking mode (see
// TestBlockingCollectives for the blocking one).
func TestSPMD(t *testing.T) {
	n := 1
	if s, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_SIZE")); err == nil {
		n = s
	}
	// Each pairwise 16-bit addition rounds: N-1 of them over N ranks, and
	// Avg's division once more.
	opts := []commtest.Option{commtest.AbortEndsProcess(), commtest.HalfTolerance(max(n-2, 0), max(n-1, 1))}
	commtest.RunSPMD(t, func(t *testing.T) comm.Communicator {
		c, err := mpi.Open(mpi.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}, opts...)
}
