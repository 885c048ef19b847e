package commtest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// Option adjusts the suite for a backend.
type Option func(*config)

type config struct {
	ranks        []int
	largeBytes   int
	largeRanks   []int // nil: Run's default (2 and 3), every size for RunSPMD
	mismatch     bool
	halfSumULPs  int
	halfAvgULPs  int
	waitTimeout  time.Duration
	abortPeers   bool
	abortEndsRun bool
}

// Ranks sets the group sizes Run tests (default 1, 2, 3 and 4). RunSPMD
// tests the one group its callers form.
func Ranks(ns ...int) Option { return func(c *config) { c.ranks = ns } }

// Large sets the size in bytes of the large-message checks (default 8 MiB)
// and the group sizes that run them (default 2 and 3 for Run, any size for
// RunSPMD). Zero bytes skips them; so does go test -short.
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
// ranks' calls. They are skipped too for a backend whose Caps do not claim
// MismatchDetection.
func NoMismatchDetection() Option { return func(c *config) { c.mismatch = false } }

// HalfTolerance sets how many units in the last place a Float16 or
// BFloat16 sum and average may differ from the single rounding of the
// exact result (default 0 and 1): a backend that rounds after every
// pairwise addition needs more.
func HalfTolerance(sumULPs, avgULPs int) Option {
	return func(c *config) { c.halfSumULPs, c.halfAvgULPs = sumULPs, avgULPs }
}

// WaitTimeout bounds every wait of the suite, so that a broken backend
// fails rather than hangs (default 2 minutes). A Wait that ignores its
// context is abandoned half a timeout after its deadline. RunSPMD's waits
// on its control communicator allow four timeouts, since a peer may reach
// them only after waiting out its own deadlines.
func WaitTimeout(d time.Duration) Option { return func(c *config) { c.waitTimeout = d } }

// AbortReachesPeers declares a backend whose Abort on one rank also fails
// the pending and later operations of the other ranks of its group (inproc,
// whose ranks share memory). The abort check then requires it: each peer's
// pending collective fails with an error wrapping comm.ErrAborted and the
// cause, and its later ones with comm.ErrAborted. Without this option only
// the aborting rank is checked, as the contract's local Abort promises.
func AbortReachesPeers() Option { return func(c *config) { c.abortPeers = true } }

// AbortEndsProcess declares a backend whose Abort ends the process (an MPI
// backend that calls MPI_Abort): the suite then skips the abort check and
// does not close a communicator while one of its collectives is pending.
func AbortEndsProcess() Option { return func(c *config) { c.abortEndsRun = true } }

func newConfig(opts []Option) *config {
	cfg := &config{
		ranks:       []int{1, 2, 3, 4},
		largeBytes:  8 << 20,
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
	return cfg
}

// Run runs the conformance suite with every rank's side driven from the
// calling goroutine: each check issues every rank's calls before it waits
// for any of them. newGroup must return n communicators of one new group,
// element r having rank r; the suite closes them.
func Run(t *testing.T, newGroup func(t *testing.T, n int) []comm.Communicator, opts ...Option) {
	cfg := newConfig(opts)
	if cfg.largeRanks == nil {
		cfg.largeRanks = []int{2, 3}
	}
	if len(cfg.ranks) == 0 || slices.Min(cfg.ranks) < 1 {
		t.Fatalf("commtest.Run: group sizes %v; want at least one, each at least 1", cfg.ranks)
	}
	mem := newMemory(t, cfg, slices.Max(cfg.ranks))
	for _, n := range cfg.ranks {
		t.Run(fmt.Sprintf("%dranks", n), func(t *testing.T) {
			d := &together{n: n, newGroup: newGroup}
			tm := newTeam(cfg, n, d.ranks(), d, mem)
			tm.cs = tm.group(t)
			t.Cleanup(func() { tm.closeMain(t) })
			runSuite(t, tm)
		})
	}
	// Groups of every size at once, and two of the first size.
	var sizes []int
	for _, n := range cfg.ranks {
		if n > 1 {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		sizes = []int{1}
	}
	sizes = append(sizes, sizes[0])
	d := &together{n: slices.Max(sizes), newGroup: newGroup, sizes: sizes}
	tm := newTeam(cfg, d.n, d.ranks(), d, mem)
	tm.check(t, "ConcurrentGroups", tm.concurrentGroups)
}

// RunSPMD runs one rank's side of the conformance suite. Every rank of a
// group calls it, with the same options: one process per rank (mpirun), or
// one goroutine per rank (RunGoroutines). newComm is collective: the suite
// calls it on every rank at the same point, and each call must return this
// rank's communicator of a new group over the same ranks. The first call
// gives the main communicator, the second the control communicator on which
// the ranks agree on every check's outcome, and later calls the fresh
// groups of the checks that break a communicator (abort, close, mismatch,
// invalid arguments) or drive several at once. The suite closes every
// communicator it gets.
//
// Every check ends with the ranks agreeing on its outcome, so a check that
// fails on one rank fails on every rank, naming the ranks that failed, and
// the ranks stay in step for the next check. When an operation failed or
// did not complete, every rank replaces its main communicator before the
// next check.
func RunSPMD(t *testing.T, newComm func(t *testing.T) comm.Communicator, opts ...Option) {
	cfg := newConfig(opts)
	d := &alone{newComm: newComm}
	main := d.first(t)
	n, rank := main.Size(), main.Rank()
	mem := newMemory(t, cfg, 1)
	tm := newTeam(cfg, n, []int{rank}, d, mem)
	tm.cs[rank] = main
	// Cleanups run last in, first out: the main communicator is closed
	// before the control one.
	t.Cleanup(func() { d.closeControl(t) })
	t.Cleanup(func() { tm.closeMain(t) })
	d.control = d.take(t, "the control communicator")
	t.Run(fmt.Sprintf("%dranks", n), func(t *testing.T) {
		runSuite(t, tm)
		tm.check(t, "ConcurrentGroups", tm.concurrentGroups)
	})
}

// RunGoroutines runs RunSPMD on n goroutines of this process, one per
// rank, as the subtests rank0 to rank<n-1> of t. newGroup is as for Run:
// its k-th call serves the k-th newComm call of every rank, which takes its
// own rank's communicator of that group.
func RunGoroutines(t *testing.T, n int, newGroup func(t *testing.T, n int) []comm.Communicator, opts ...Option) {
	rv := &rendezvous{n: n, newGroup: newGroup}
	defer rv.closeUntaken(t)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			t.Run(fmt.Sprintf("rank%d", r), func(t *testing.T) { RunSPMD(t, rv.newComm(r), opts...) })
		})
	}
	wg.Wait()
}

// runSuite runs every check of the suite on tm's group.
func runSuite(t *testing.T, tm *team) {
	n := tm.n
	sizes := []int{0, 1, 7, 4<<10 + 3}
	large := 0
	if tm.cfg.largeBytes > 0 && (tm.cfg.largeRanks == nil || slices.Contains(tm.cfg.largeRanks, n)) {
		large = tm.cfg.largeBytes
	}
	t.Run("AllReduce", func(t *testing.T) { tm.allReduce(t, sizes, large) })
	t.Run("HalfRounding", tm.halfRounding)
	t.Run("Broadcast", func(t *testing.T) { tm.broadcast(t, sizes, large) })
	t.Run("Reduce", func(t *testing.T) { tm.reduce(t, sizes, large) })
	t.Run("AllGather", func(t *testing.T) { tm.allGather(t, sizes, large) })
	t.Run("ReduceScatter", func(t *testing.T) { tm.reduceScatter(t, sizes, large) })
	if n > 1 {
		t.Run("SendRecvRing", func(t *testing.T) { tm.sendRecvRing(t, sizes, large) })
		tm.check(t, "WaitDeadline", tm.waitDeadline)
	}
	tm.check(t, "Barrier", tm.barrier)
	tm.check(t, "IssueOrder", tm.issueOrder)
	tm.check(t, "WaitTwice", tm.waitTwice)
	tm.check(t, "Abort", tm.abort)
	if tm.cfg.mismatch && n > 1 {
		t.Run("Mismatch", tm.mismatchCases)
	}
	t.Run("Invalid", tm.invalid)
	tm.check(t, "Close", tm.close)
}

func sizeName(count, sz int) string {
	if b := count * sz; b >= 1<<20 && b%(1<<20) == 0 {
		return fmt.Sprintf("%dMiB", b>>20)
	}
	return fmt.Sprint(count)
}

// largeCount is the element count of a large message of dt, or 0.
func largeCount(large int, dt comm.DType) int { return large / dt.Size() }
