package inproc

import (
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

func TestDefaultOptions(t *testing.T) {
	cs := testGroup(t, 2, Options{})
	if o := cs[0].g.dog; o.StallInterval != 60*time.Second || o.Timeout != 10*time.Minute {
		t.Errorf("defaults: stall interval %v, timeout %v; want 60s and 10m", o.StallInterval, o.Timeout)
	}
}

// TestStallReports leaves two of four ranks out of a collective, and one
// rank out of a message, long enough for stall reports; each report names
// the waiting rank and exactly the missing ones, and the operations then
// complete normally once the missing ranks join.
func TestStallReports(t *testing.T) {
	const interval = time.Millisecond
	stalls := make(chan comm.Stall, 1024)
	cs := testGroup(t, 4, Options{StallInterval: interval, Timeout: time.Hour, OnStall: func(s comm.Stall) {
		select {
		case stalls <- s:
		default:
		}
	}})
	bufs := make([][]int32, 4)
	for r := range bufs {
		bufs[r] = []int32{int32(r), 1}
	}
	ws := []comm.Work{cs[0].AllReduce(comm.Int32s(bufs[0]), comm.Int32s(bufs[0]), comm.Sum), cs[1].AllReduce(comm.Int32s(bufs[1]), comm.Int32s(bufs[1]), comm.Sum)}
	for seen := map[int]bool{}; len(seen) < 2; {
		s := <-stalls
		if s.Kind != comm.KindAllReduce || s.Seq != 1 || !slices.Equal(s.Missing, []int{2, 3}) || s.Rank > 1 || s.Waited < interval {
			t.Fatalf("stall report %+v; want rank 0 or 1 waiting at least %v in all_reduce #1 for ranks [2 3]", s, interval)
		}
		if !strings.Contains(s.String(), "[2 3]") {
			t.Errorf("%q does not name the missing ranks", s)
		}
		seen[s.Rank] = true
	}
	ws = append(ws, cs[2].AllReduce(comm.Int32s(bufs[2]), comm.Int32s(bufs[2]), comm.Sum), cs[3].AllReduce(comm.Int32s(bufs[3]), comm.Int32s(bufs[3]), comm.Sum))
	for r, err := range testutil.WaitAll(t, ws...) {
		if err != nil || bufs[r][0] != 6 || bufs[r][1] != 4 {
			t.Fatalf("rank %d after the stall: %v, %v; want nil, [6 4]", r, err, bufs[r])
		}
	}
	for len(stalls) > 0 {
		<-stalls
	}
	msg := []int32{7}
	send := cs[3].Send(comm.Int32s(msg), 1)
	for {
		s := <-stalls
		if s.Rank != 3 {
			continue // a late report of the all-reduce
		}
		if s.Kind != comm.KindSend || s.Seq != 2 || !slices.Equal(s.Missing, []int{1}) {
			t.Fatalf("stall report %+v; want rank 3 waiting in send #2 for rank 1", s)
		}
		break
	}
	got := []int32{0}
	if errs := testutil.WaitAll(t, []comm.Work{send, cs[1].Recv(comm.Int32s(got), 3)}...); errs[0] != nil || errs[1] != nil || got[0] != 7 {
		t.Fatalf("message after the stall: %v, %d", errs, got[0])
	}
}

// TestStallIntervalLongerThanTimeout: with a stall interval longer than
// the timeout there is no stall report, and the timeout error itself names
// the missing rank.
func TestStallIntervalLongerThanTimeout(t *testing.T) {
	reports := 0
	cs := testGroup(t, 2, Options{StallInterval: time.Hour, Timeout: 20 * time.Millisecond, OnStall: func(comm.Stall) { reports++ }})
	err := testutil.WaitAll(t, []comm.Work{cs[0].Barrier()}...)[0]
	if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "for rank(s) [1]") {
		t.Errorf("%v; want ErrTimeout naming rank 1", err)
	}
	if reports != 0 {
		t.Errorf("%d stall reports with a stall interval of an hour", reports)
	}
}

// TestTimeoutReportsStall: a rank that times out reports the stall first
// when the stall interval is not longer than the timeout, however late
// the rank wakes up (here both are due at the same moment).
func TestTimeoutReportsStall(t *testing.T) {
	var reports []comm.Stall
	cs := testGroup(t, 2, Options{StallInterval: 5 * time.Millisecond, Timeout: 5 * time.Millisecond, OnStall: func(s comm.Stall) { reports = append(reports, s) }})
	err := testutil.WaitAll(t, []comm.Work{cs[0].Barrier()}...)[0]
	if !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("%v; want ErrTimeout", err)
	}
	if len(reports) != 1 || reports[0].Rank != 0 || !slices.Equal(reports[0].Missing, []int{1}) || reports[0].Kind != comm.KindBarrier {
		t.Errorf("stall reports %v; want one from rank 0 waiting in barrier #1 for rank 1", reports)
	}
}

// TestMissing asks a group, through comm.Progress, which ranks its
// pending operations wait for: ranks that have not arrived at a
// collective, a rank held back by its own earlier operation, the peer of
// a message; and nothing for completed operations or another rank's.
func TestMissing(t *testing.T) {
	cs := testGroup(t, 3, Options{})
	var c comm.Communicator = cs[0]
	bufs := [][]int32{{1}, {2}, {3}}
	first := []comm.Work{allReduceInPlace(cs[0], comm.Int32s(bufs[0]), comm.Sum), allReduceInPlace(cs[1], comm.Int32s(bufs[1]), comm.Sum)}
	for cs[0].g.seg.Published(0) < 1 || cs[1].g.seg.Published(1) < 1 {
		runtime.Gosched()
	}
	// Rank 0's barrier waits behind its all-reduce, which waits for rank 2;
	// rank 1's message to rank 2 waits behind rank 1's all-reduce and for
	// rank 2's Recv.
	barrier := cs[0].Barrier()
	msg := []int32{9}
	send := cs[1].Send(comm.Int32s(msg), 2)
	for _, tc := range []struct {
		name string
		c    *Comm
		w    comm.Work
		want []int
	}{
		{"all_reduce without rank 2", cs[0], first[0], []int{2}},
		{"all_reduce without rank 2, from rank 1", cs[1], first[1], []int{2}},
		{"barrier behind the all_reduce", cs[0], barrier, []int{0, 1, 2}},
		{"send behind the all_reduce, to a rank that has not received", cs[1], send, []int{1, 2}},
		{"another rank's operation", cs[0], send, nil},
		{"a failed Work", cs[0], comm.FailedWork(comm.ErrClosed), nil},
	} {
		got := comm.MissingRanks(tc.c, tc.w)
		if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s: Missing = %v, want %v", tc.name, got, tc.want)
		}
	}
	last := allReduceInPlace(cs[2], comm.Int32s(bufs[2]), comm.Sum)
	testutil.WaitAll(t, append(first, last)...)
	for cs[1].current.Load() < 2 || cs[0].g.seg.Published(0) < 2 {
		runtime.Gosched() // rank 1's worker has posted the message; rank 0 is in the barrier
	}
	if got := comm.MissingRanks(c, barrier); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("barrier that rank 0 has joined: Missing = %v, want [1 2]", got)
	}
	if got := cs[1].Missing(send); !slices.Equal(got, []int{2}) {
		t.Errorf("send posted by rank 1: Missing = %v, want [2]", got)
	}
	if got := cs[0].Missing(first[0]); got != nil {
		t.Errorf("a completed all_reduce: Missing = %v, want nil", got)
	}
	got := []int32{0}
	ws := []comm.Work{barrier, send, cs[2].Recv(comm.Int32s(got), 1), cs[1].Barrier(), cs[2].Barrier()}
	for i, err := range testutil.WaitAll(t, ws...) {
		if err != nil {
			t.Fatalf("operation %d: %v", i, err)
		}
	}
}
