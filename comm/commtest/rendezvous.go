package commtest

import (
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

// rendezvous serves the newComm calls of RunGoroutines' ranks: the k-th
// call of every rank takes that rank's communicator of the k-th group,
// which the first rank to make its k-th call builds with newGroup. No rank
// waits here for another: a rank that needs its peers waits for them in a
// collective, under the suite's deadline.
type rendezvous struct {
	n        int
	newGroup func(t *testing.T, n int) []comm.Communicator

	mu     sync.Mutex
	groups [][]comm.Communicator // by call
	taken  [][]bool              // by call and rank
}

// newComm returns rank r's newComm.
func (rv *rendezvous) newComm(r int) func(t *testing.T) comm.Communicator {
	calls := 0
	return func(t *testing.T) comm.Communicator {
		t.Helper()
		k := calls
		calls++
		rv.mu.Lock()
		defer rv.mu.Unlock()
		for len(rv.groups) <= k {
			rv.groups = append(rv.groups, nil)
			rv.taken = append(rv.taken, make([]bool, rv.n))
		}
		if rv.groups[k] == nil {
			cs := rv.newGroup(t, rv.n)
			rv.groups[k] = cs
			if len(cs) != rv.n {
				t.Fatalf("newGroup(%d) returned %d communicators", rv.n, len(cs))
			}
		}
		rv.taken[k][r] = true
		return rv.groups[k][r]
	}
}

// closeUntaken closes the communicators that no rank took: those of ranks
// that stopped before they asked for them. RunSPMD closes the others.
func (rv *rendezvous) closeUntaken(t *testing.T) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	for k, g := range rv.groups {
		for r, c := range g {
			if r < rv.n && rv.taken[k][r] || c == nil {
				continue
			}
			if err := c.Close(); err != nil {
				t.Errorf("closing rank %d's communicator of group %d, which it never took: %v", r, k, err)
			}
		}
	}
}
