package inproc_test

import (
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

func TestConformance(t *testing.T) {
	commtest.Run(t, newGroup)
}
