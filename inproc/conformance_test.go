package inproc_test

import (
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/inproc"
)

func newGroup(t *testing.T, n int) []comm.Communicator {
	t.Helper()
	cs, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]comm.Communicator, n)
	for r, c := range cs {
		out[r] = c
	}
	return out
}

// TestConformance runs the suite with every rank driven from one
// goroutine.
func TestConformance(t *testing.T) {
	commtest.Run(t, newGroup, commtest.AbortReachesPeers())
}

// TestSPMD runs the suite as a backend under mpirun runs it, one rank's
// side at a time, with a goroutine per rank.
func TestSPMD(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("%dranks", n), func(t *testing.T) {
			commtest.RunGoroutines(t, n, newGroup, commtest.AbortReachesPeers(), commtest.Large(1<<20, 3))
		})
	}
}
