package hier_test

import (
	"slices"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/checked"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/comm/hier"
	"github.com/ddpgo/ddpgo/inproc"
)

// layouts are the shapes the tests run: even hosts, uneven hosts, one
// host, one rank per host, and a numbering that is not host-major.
var layouts = []struct {
	name string
	l    hier.Layout
}{
	{"2x2", hier.PerHost(2, 2)},
	{"3+1", hier.PerHost(3, 1)},
	{"1x4", hier.PerHost(4)},
	{"4x1", hier.PerHost(1, 1, 1, 1)},
	{"2+2+1", hier.PerHost(2, 2, 1)},
	// Round robin: rank r on host r%2.
	{"2x2rr", hier.Layout{{0, 0}, {1, 0}, {0, 1}, {1, 1}}},
	// Uneven and not host-major: rank 1 alone on host 1.
	{"3+1mixed", hier.Layout{{0, 0}, {1, 0}, {0, 1}, {0, 2}}},
}

// levels are the inproc groups one job's composite is made of, by global
// rank.
type levels struct {
	local, cross, world []*inproc.Comm
}

// newLevels builds, in one process, the groups a job of layout l runs on:
// one inproc group per host, one per local rank across the hosts that have
// it, and a world group.
func newLevels(t testing.TB, l hier.Layout, o inproc.Options) levels {
	t.Helper()
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	hosts := 0
	for _, p := range l {
		hosts = max(hosts, p.Host+1)
	}
	onHost := make([][]int, hosts) // onHost[h][j]: the global rank of local rank j of host h
	for r, p := range l {
		for len(onHost[p.Host]) <= p.Local {
			onHost[p.Host] = append(onHost[p.Host], -1)
		}
		onHost[p.Host][p.Local] = r
	}
	group := func(n int) []*inproc.Comm {
		cs, err := inproc.NewGroupWith(n, o)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	lv := levels{local: make([]*inproc.Comm, len(l)), cross: make([]*inproc.Comm, len(l)), world: group(len(l))}
	for _, ranks := range onHost {
		g := group(len(ranks))
		for j, r := range ranks {
			lv.local[r] = g[j]
		}
	}
	for j := 0; ; j++ {
		var members []int
		for _, ranks := range onHost {
			if j < len(ranks) {
				members = append(members, ranks[j])
			}
		}
		if len(members) == 0 {
			break
		}
		g := group(len(members))
		for i, r := range members {
			lv.cross[r] = g[i]
		}
	}
	return lv
}

// newJob returns the composite communicators of a job of layout l, by
// global rank; the caller closes them.
func newJob(t testing.TB, l hier.Layout, o inproc.Options) []*hier.Comm {
	return newChunkedJob(t, l, o, 0)
}

// newChunkedJob is newJob with Config.ChunkBytes set to chunk.
func newChunkedJob(t testing.TB, l hier.Layout, o inproc.Options, chunk int) []*hier.Comm {
	t.Helper()
	lv := newLevels(t, l, o)
	cs := make([]*hier.Comm, len(l))
	for r := range l {
		c, err := hier.New(hier.Config{Layout: l, Rank: r, Local: lv.local[r], Cross: lv.cross[r], World: lv.world[r], ChunkBytes: chunk})
		if err != nil {
			t.Fatal(err)
		}
		cs[r] = c
	}
	return cs
}

// halfULPs is how far a half-precision sum may be from the single
// rounding of the exact sum: each host's partial sum is rounded once, and
// the sum of the H partials once more. For positive inputs (the suite's)
// each partial is at most the total, so its rounding error is at most
// half a unit in the last place of the total: (H+1)/2 units in all.
func halfULPs(l hier.Layout) int {
	hosts := 0
	for _, p := range l {
		hosts = max(hosts, p.Host+1)
	}
	return (hosts + 1) / 2
}

// TestConformance runs the conformance suite over the composite, built
// from inproc groups, for every layout. Abort reaches the peers: the
// aborting rank's levels fail their peers, which abort their own other
// levels in turn.
func TestConformance(t *testing.T) {
	for _, tc := range layouts {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.l)
			h := halfULPs(tc.l)
			commtest.Run(t, func(t *testing.T, size int) []comm.Communicator {
				if size != n {
					t.Fatalf("layout %s has %d ranks; the suite asked for %d", tc.name, n, size)
				}
				out := make([]comm.Communicator, n)
				for r, c := range newJob(t, tc.l, inproc.Options{}) {
					out[r] = c
				}
				return out
			}, commtest.Ranks(n), commtest.AbortReachesPeers(), commtest.HalfTolerance(h, h+1), commtest.Large(1<<20, n))
		})
	}
}

// TestConformanceChunked runs the suite with all-reduces of more than
// 8 KiB cut into 4 KiB chunks, so that the 4 KiB+3-element cases run the
// pipeline of chunks (four to eight of them), with a leftover chunk and
// shards that the ranks do not divide evenly.
func TestConformanceChunked(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    hier.Layout
	}{layouts[0], layouts[1], {"3+2", hier.PerHost(3, 2)}} {
		t.Run(tc.name, func(t *testing.T) {
			n, h := len(tc.l), halfULPs(tc.l)
			commtest.Run(t, func(t *testing.T, size int) []comm.Communicator {
				return asComms(newChunkedJob(t, tc.l, inproc.Options{}, 4<<10))
			}, commtest.Ranks(n), commtest.AbortReachesPeers(), commtest.HalfTolerance(h, h+1), commtest.Large(0))
		})
	}
}

// TestSPMD runs the suite one rank's side per goroutine, as ranks in
// separate processes would: every rank issues on its own schedule.
func TestSPMD(t *testing.T) {
	for _, tc := range []int{0, 1, 4} { // 2x2, 3+1, 2+2+1
		l := layouts[tc].l
		t.Run(layouts[tc].name, func(t *testing.T) {
			h := halfULPs(l)
			commtest.RunGoroutines(t, len(l), func(t *testing.T, size int) []comm.Communicator {
				return asComms(newJob(t, l, inproc.Options{}))
			}, commtest.AbortReachesPeers(), commtest.HalfTolerance(h, h+1), commtest.Large(1<<20))
		})
	}
}

// TestConformanceChecked runs the suite over the composite wrapped by
// comm/checked on the uneven 3+1 layout, mismatch checks included: the
// composite cannot name a disagreement itself (its levels see only parts
// of the job), and the wrapper's fingerprint exchange runs through it.
func TestConformanceChecked(t *testing.T) {
	l := hier.PerHost(3, 1)
	h := halfULPs(l)
	commtest.Run(t, func(t *testing.T, size int) []comm.Communicator {
		out := make([]comm.Communicator, size)
		for r, c := range newJob(t, l, inproc.Options{}) {
			w, err := checked.Wrap(c, checked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			out[r] = w
		}
		return out
	}, commtest.Ranks(len(l)), commtest.AbortReachesPeers(), commtest.HalfTolerance(h, h+1), commtest.Large(0))
}

func TestNewChecksLevels(t *testing.T) {
	l := hier.PerHost(2, 1)
	lv := newLevels(t, l, inproc.Options{})
	for _, tc := range []struct {
		name string
		cfg  hier.Config
	}{
		{"swapped levels", hier.Config{Layout: l, Rank: 1, Local: lv.cross[1], Cross: lv.local[1]}},
		{"other rank's local", hier.Config{Layout: l, Rank: 0, Local: lv.local[1], Cross: lv.cross[0]}},
		{"no cross", hier.Config{Layout: l, Rank: 0, Local: lv.local[0]}},
		{"rank out of range", hier.Config{Layout: l, Rank: 3, Local: lv.local[0], Cross: lv.cross[0]}},
		{"world of the wrong size", hier.Config{Layout: l, Rank: 2, Local: lv.local[2], Cross: lv.cross[2], World: lv.local[0]}},
	} {
		if _, err := hier.New(tc.cfg); err == nil {
			t.Errorf("%s: New succeeded", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	for _, c := range append(append(lv.local, lv.cross...), lv.world...) {
		c.Close()
	}
}

func TestFromHosts(t *testing.T) {
	got := hier.FromHosts([]string{"b", "a", "b", "c", "a", "b"})
	want := hier.Layout{{0, 0}, {1, 0}, {0, 1}, {2, 0}, {1, 1}, {0, 2}}
	if !slices.Equal(got, want) {
		t.Errorf("FromHosts = %v, want %v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Error(err)
	}
}

func TestLayoutValidate(t *testing.T) {
	for _, tc := range []struct {
		l  hier.Layout
		ok bool
	}{
		{hier.PerHost(3, 1), true},
		{hier.Layout{{1, 0}, {0, 0}}, true},
		{nil, false},
		{hier.Layout{{0, 0}, {0, 0}}, false}, // local rank 0 twice
		{hier.Layout{{0, 0}, {2, 0}}, false}, // host 1 has no rank
		{hier.Layout{{0, 1}, {0, 2}}, false}, // no local rank 0
		{hier.Layout{{0, 0}, {-1, 0}}, false},
	} {
		err := tc.l.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("Validate(%v) = %v, want ok %v", tc.l, err, tc.ok)
		}
	}
}
