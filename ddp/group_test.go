package ddp

import (
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

// newTestGroup returns n communicators of one group for a test.
func newTestGroup(t *testing.T, n int) (*fakeGroup, []comm.Communicator) {
	t.Helper()
	return newFakeGroup(n)
}
