package ddp

import (
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// newTestGroup returns n communicators of one in-process group, closed when
// the test ends.
func newTestGroup(t testing.TB, n int) []comm.Communicator {
	t.Helper()
	g, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]comm.Communicator, n)
	for r, c := range g {
		cs[r] = c
	}
	t.Cleanup(func() {
		for _, c := range g {
			c.Close()
		}
	})
	return cs
}
