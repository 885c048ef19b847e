package backend_test

import (
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
)

// TestLoopbackConformance runs the conformance suite against the example
// backend (example_test.go) on groups of its one size: every collective,
// issue order, waiting twice, Abort, invalid arguments, Close and
// concurrent groups. It lives apart from the example so that the example
// file is shown whole.
func TestLoopbackConformance(t *testing.T) {
	commtest.Run(t, func(t *testing.T, n int) []comm.Communicator {
		if n != 1 {
			t.Fatalf("loopback has one rank; the suite asked for %d", n)
		}
		return []comm.Communicator{newLoopback()}
	}, commtest.Ranks(1))
}
