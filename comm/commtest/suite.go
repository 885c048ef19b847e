package commtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// Option adjusts the suite for a backend.
type Option func(*config)

type config struct {
	ranks        []int
	largeBytes   int
	largeRanks   []int
	mismatch     bool
	halfSumULPs  int
	halfAvgULPs  int
	waitTimeout  time.Duration
	skipP2P      bool
	skipAbortOps bool
}

// Ranks sets the group sizes to test (default 1, 2, 3 and 4).
func Ranks(ns ...int) Option { return func(c *config) { c.ranks = ns } }

// Large sets the size in bytes of the large-message checks (default 8 MiB)
// and the group sizes that run them (default 2 and 3). Zero bytes skips
// them; so does go test -short.
func Large(bytes int, ranks ...int) Option {
	return func(c *config) {
		c.largeBytes = bytes
		if len(ranks) > 0 {
			c.largeRanks = ranks
		}
	}
}

// NoMismatchDetection skips the checks that ranks disagreeing on a
// collective get comm.ErrMismatch, for a backend that cannot see the other
// ranks' calls.
func NoMismatchDetection() Option { return func(c *config) { c.mismatch = false } }

// HalfTolerance sets how many units in the last place a Float16 or
// BFloat16 sum and average may differ from the single rounding of the
// exact result (default 0 and 1): a backend that rounds after every
// pairwise addition needs more.
func HalfTolerance(sumULPs, avgULPs int) Option {
	return func(c *config) { c.halfSumULPs, c.halfAvgULPs = sumULPs, avgULPs }
}

// WaitTimeout bounds every wait of the suite, so that a broken backend
// fails rather than hangs (default 2 minutes).
func WaitTimeout(d time.Duration) Option { return func(c *config) { c.waitTimeout = d } }

// Run runs the conformance suite. newGroup must return n communicators of
// one new group, element r having rank r; the suite closes them.
func Run(t *testing.T, newGroup func(t *testing.T, n int) []comm.Communicator, opts ...Option) {
	cfg := &config{
		ranks:       []int{1, 2, 3, 4},
		largeBytes:  8 << 20,
		largeRanks:  []int{2, 3},
		mismatch:    true,
		halfAvgULPs: 1,
		waitTimeout: 2 * time.Minute,
	}
	for _, o := range opts {
		o(cfg)
	}
	if testing.Short() {
		cfg.largeBytes = 0
	}
	s := &suite{cfg: cfg, newGroup: newGroup}
	for _, n := range cfg.ranks {
		t.Run(fmt.Sprintf("%dranks", n), func(t *testing.T) { s.runRanks(t, n) })
	}
	t.Run("ConcurrentGroups", s.concurrentGroups)
}

type suite struct {
	cfg      *config
	newGroup func(t *testing.T, n int) []comm.Communicator
}

// group builds a group of n ranks, checks its ranks and sizes, and closes
// it when the test ends.
func (s *suite) group(t *testing.T, n int) []comm.Communicator {
	t.Helper()
	cs := s.newGroup(t, n)
	if len(cs) != n {
		t.Fatalf("newGroup(%d) returned %d communicators", n, len(cs))
	}
	for r, c := range cs {
		if c.Rank() != r || c.Size() != n {
			t.Fatalf("communicator %d of %d has Rank %d, Size %d", r, n, c.Rank(), c.Size())
		}
	}
	t.Cleanup(func() {
		for r, c := range cs {
			if err := c.Close(); err != nil {
				t.Errorf("rank %d: Close: %v", r, err)
			}
		}
	})
	return cs
}

func (s *suite) runRanks(t *testing.T, n int) {
	cs := s.group(t, n)
	sizes := []int{0, 1, 7, 4<<10 + 3}
	large := 0
	if s.cfg.largeBytes > 0 {
		for _, m := range s.cfg.largeRanks {
			if m == n {
				large = s.cfg.largeBytes
			}
		}
	}
	t.Run("AllReduce", func(t *testing.T) { s.allReduce(t, cs, sizes, large) })
	t.Run("HalfRounding", func(t *testing.T) { s.halfRounding(t, cs) })
	t.Run("Broadcast", func(t *testing.T) { s.broadcast(t, cs, sizes, large) })
	t.Run("Reduce", func(t *testing.T) { s.reduce(t, cs, sizes, large) })
	t.Run("AllGather", func(t *testing.T) { s.allGather(t, cs, sizes, large) })
	t.Run("ReduceScatter", func(t *testing.T) { s.reduceScatter(t, cs, sizes, large) })
	if n > 1 {
		t.Run("SendRecvRing", func(t *testing.T) { s.sendRecvRing(t, cs, sizes, large) })
		t.Run("WaitDeadline", func(t *testing.T) { s.waitDeadline(t, cs) })
	}
	t.Run("Barrier", func(t *testing.T) { s.barrier(t, cs) })
	t.Run("IssueOrder", func(t *testing.T) { s.issueOrder(t, cs) })
	t.Run("WaitTwice", func(t *testing.T) { s.waitTwice(t, cs) })
	t.Run("Abort", func(t *testing.T) { s.abort(t, n) })
	if s.cfg.mismatch && n > 1 {
		t.Run("Mismatch", func(t *testing.T) { s.mismatchCases(t, n) })
	}
	t.Run("Invalid", func(t *testing.T) { s.invalid(t, n) })
	t.Run("Close", func(t *testing.T) { s.close(t, n) })
}

// wait waits for every Work and returns their errors, failing the test if
// the suite's wait timeout passes.
func (s *suite) wait(t *testing.T, ws []comm.Work) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.waitTimeout)
	defer cancel()
	errs := make([]error, len(ws))
	for i, w := range ws {
		errs[i] = w.Wait(ctx)
		if errors.Is(errs[i], context.DeadlineExceeded) {
			t.Fatalf("operation %d (id %d) did not complete within %v", i, w.ID(), s.cfg.waitTimeout)
		}
	}
	return errs
}

// waitOK waits for every Work and fails the test on any error.
func (s *suite) waitOK(t *testing.T, ws []comm.Work) {
	t.Helper()
	for i, err := range s.wait(t, ws) {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

func sizeName(count, sz int) string {
	if b := count * sz; b >= 1<<20 && b%(1<<20) == 0 {
		return fmt.Sprintf("%dMiB", b>>20)
	}
	return fmt.Sprint(count)
}

// largeCount is the element count of a large message of dt, or 0.
func largeCount(large int, dt comm.DType) int { return large / dt.Size() }
