package ddp

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestScheduleLaunchOrder(t *testing.T) {
	// Each op is "m<p>" (mark parameter p, expect the bucket it completes
	// or -1) or "l" (launch everything launchable, expect that list).
	type op struct {
		mark     int // parameter to mark, or -1 for a launch
		complete int // bucket completed by the mark, or -1
		launches []int
		err      error
	}
	m := func(p, c int) op { return op{mark: p, complete: c} }
	l := func(ks ...int) op { return op{mark: -1, launches: ks} }
	tests := []struct {
		name     string
		bucketOf []int
		nb       int
		ops      []op
	}{
		{"in order", []int{0, 0, 1, 1}, 2, []op{m(0, -1), l(), m(1, 0), l(0), m(2, -1), m(3, 1), l(1), l()}},
		{"reverse waits for bucket 0", []int{0, 0, 1, 1}, 2, []op{m(3, -1), m(2, 1), l(), m(1, -1), l(), m(0, 0), l(0, 1)}},
		{"out of order completion", []int{0, 1, 2}, 3, []op{m(2, 2), m(1, 1), l(), m(0, 0), l(0, 1, 2), l()}},
		{"interleaved", []int{1, 0, 2, 1, 0}, 3, []op{m(1, -1), m(4, 0), l(0), m(2, 2), l(), m(0, -1), m(3, 1), l(1, 2)}},
		{"double mark", []int{0, 0}, 1, []op{m(0, -1), {mark: 0, complete: -1, err: errMarked}, m(1, 0), l(0)}},
		{"single bucket", []int{0}, 1, []op{l(), m(0, 0), l(0), l()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSchedule(tt.bucketOf, tt.nb)
			for round := 0; round < 2; round++ { // the second round checks reset
				for i, o := range tt.ops {
					if o.mark >= 0 {
						c, err := s.mark(o.mark)
						if !errors.Is(err, o.err) || c != o.complete {
							t.Fatalf("round %d op %d: mark(%d) = %d, %v; want %d, %v", round, i, o.mark, c, err, o.complete, o.err)
						}
						continue
					}
					var got []int
					for k := s.launch(); k >= 0; k = s.launch() {
						got = append(got, k)
					}
					if !slices.Equal(got, o.launches) {
						t.Fatalf("round %d op %d: launched %v, want %v", round, i, got, o.launches)
					}
				}
				if s.launched() != tt.nb {
					t.Fatalf("round %d: launched %d of %d buckets", round, s.launched(), tt.nb)
				}
				s.reset()
			}
		})
	}
}

func TestScheduleClaimArrive(t *testing.T) {
	s := newSchedule([]int{0, 0}, 1)
	if err := s.claim(1); err != nil {
		t.Fatal(err)
	}
	if !s.isMarked(1) || s.isMarked(0) {
		t.Fatal("isMarked disagrees with claim")
	}
	if k := s.launch(); k != -1 {
		t.Fatalf("launched %d before any arrival", k)
	}
	if c, _ := s.mark(0); c != -1 {
		t.Fatalf("bucket completed with a claimed parameter not arrived")
	}
	if c := s.arrive(1); c != 0 {
		t.Fatalf("arrive(1) = %d, want 0", c)
	}
	if int(s.nmarked.Load()) != 2 {
		t.Fatalf("nmarked = %d", s.nmarked.Load())
	}
}

// FuzzSchedule marks parameters in an arbitrary order with launch attempts
// interleaved, and checks that buckets launch exactly once each, in index
// order, and only when complete.
func FuzzSchedule(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, []byte{3, 2, 1, 0}, uint8(2))
	f.Add([]byte{5, 0, 0, 9}, []byte{1, 0, 3, 2}, uint8(7))
	f.Fuzz(func(t *testing.T, assign, order []byte, every uint8) {
		np := min(len(assign), 64)
		if np == 0 {
			return
		}
		// Buckets are the distinct values of assign, renumbered densely.
		ids := map[byte]int{}
		bucketOf := make([]int, np)
		for p := range np {
			v := assign[p] % 8
			if _, ok := ids[v]; !ok {
				ids[v] = len(ids)
			}
			bucketOf[p] = ids[v]
		}
		nb := len(ids)
		s := newSchedule(bucketOf, nb)
		// The mark order: order's bytes pick among the unmarked parameters.
		left := make([]int, np)
		for p := range left {
			left[p] = p
		}
		marked := make([]bool, np)
		var launched []int
		tryLaunch := func() {
			for k := s.launch(); k >= 0; k = s.launch() {
				if k != len(launched) {
					t.Fatalf("launched bucket %d after %v", k, launched)
				}
				for p, b := range bucketOf {
					if b == k && !marked[p] {
						t.Fatalf("bucket %d launched before parameter %d was marked", k, p)
					}
				}
				launched = append(launched, k)
			}
		}
		for i := 0; len(left) > 0; i++ {
			j := 0
			if i < len(order) {
				j = int(order[i]) % len(left)
			}
			p := left[j]
			left = append(left[:j], left[j+1:]...)
			if _, err := s.mark(p); err != nil {
				t.Fatal(err)
			}
			marked[p] = true
			if _, err := s.mark(p); err == nil {
				t.Fatalf("second mark of %d succeeded", p)
			}
			if every == 0 || i%int(every) == 0 {
				tryLaunch()
			}
		}
		tryLaunch()
		if len(launched) != nb {
			t.Fatalf("launched %v of %d buckets", launched, nb)
		}
	})
}

// runSequence plays a step of n buckets through sequence q as the launcher
// and the finisher do, and returns what happens, in order: "L:flag" (the
// launcher reads the flag), "L:buf<g>" (it broadcasts buffer group g),
// "hold", "skip", "wait:<item>", "read", "finish:<item>".
func runSequence(q sequence, n int) []string {
	name := func(e inflight) string {
		switch e.kind {
		case kindJoin:
			return "flag"
		case kindBuffers:
			return fmt.Sprintf("buf%d", e.k)
		}
		return fmt.Sprintf("b%d", e.k)
	}
	var out []string
	var fifo []inflight
	items := q.items(n)
	if q.flag {
		fifo = append(fifo, items[0]) // Begin issues it
		items = items[1:]
	}
	if q.launcherReadsFlag() {
		out = append(out, "L:flag")
	}
	for range q.prefix() {
		out = append(out, "L:"+name(items[0]))
		fifo, items = append(fifo, items[0]), items[1:]
	}
	fifo = append(fifo, items...)
	held := false
	for _, e := range fifo {
		switch q.arrival(e.kind) {
		case arriveSkip:
			out = append(out, "skip")
			continue
		case arriveHold:
			out, held = append(out, "hold"), true
			continue
		}
		out = append(out, "wait:"+name(e))
		if held {
			out, held = append(out, "read"), false
		}
		if e.kind == kindJoin {
			out = append(out, "read")
			continue
		}
		out = append(out, "finish:"+name(e))
	}
	return out
}

// TestSequence is the table of a step's order and of who reads the join
// flag when, for each kind of step.
func TestSequence(t *testing.T) {
	tests := []struct {
		name                string
		join, throw, shadow bool
		buffers, buckets    int
		want                string
	}{
		{"plain", false, false, false, 0, 2, "wait:b0 finish:b0 wait:b1 finish:b1"},
		{"buffers", false, false, false, 2, 1, "L:buf0 L:buf1 wait:buf0 finish:buf0 wait:buf1 finish:buf1 wait:b0 finish:b0"},
		{"join: the flag is read with bucket 0", true, false, false, 0, 2, "hold wait:b0 read finish:b0 wait:b1 finish:b1"},
		{"join with buffers: the launcher reads the flag", true, false, false, 1, 1, "L:flag L:buf0 skip wait:buf0 finish:buf0 wait:b0 finish:b0"},
		{"throw: the flag is read as it completes", true, true, false, 0, 1, "wait:flag read wait:b0 finish:b0"},
		{"throw with buffers", true, true, false, 1, 1, "L:flag L:buf0 skip wait:buf0 finish:buf0 wait:b0 finish:b0"},
		{"shadow step: no flag of its own", true, false, true, 1, 1, "L:buf0 wait:buf0 finish:buf0 wait:b0 finish:b0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newSequence(tt.join, tt.throw, tt.shadow, tt.buffers)
			if got := strings.Join(runSequence(q, tt.buckets), " "); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// FuzzSequence plays every kind of step and checks the sequence's
// promises: every rank's collectives in one order (flag, buffers, buckets),
// the flag read exactly once, before any bucket is finished and before the
// buffers are broadcast when there are any (their root depends on it), and
// every other collective finished exactly once, in issue order.
func FuzzSequence(f *testing.F) {
	f.Add(true, false, false, uint8(2), uint8(3))
	f.Add(true, true, false, uint8(0), uint8(1))
	f.Fuzz(func(t *testing.T, join, throw, shadow bool, buffers, buckets uint8) {
		nbuf, n := int(buffers%4), int(buckets%6)+1
		q := newSequence(join, throw, shadow, nbuf)
		items := q.items(n)
		rank := map[uint8]int{kindJoin: 0, kindBuffers: 1, kindBucket: 2} // issue order
		if !slices.IsSortedFunc(items, func(a, b inflight) int { return rank[a.kind] - rank[b.kind] }) {
			t.Fatalf("items out of order: %v", items)
		}
		trace := runSequence(q, n)
		reads, firstFinish, firstBuf, readAt := 0, -1, -1, -1
		finished := []string{}
		for i, s := range trace {
			switch {
			case s == "L:flag" || s == "read":
				reads++
				readAt = i
			case strings.HasPrefix(s, "L:buf") && firstBuf < 0:
				firstBuf = i
			case strings.HasPrefix(s, "finish:b") && firstFinish < 0:
				firstFinish = i
			}
			if strings.HasPrefix(s, "finish:") {
				finished = append(finished, strings.TrimPrefix(s, "finish:"))
			}
		}
		wantReads := 0
		if join && !shadow {
			wantReads = 1
		}
		if reads != wantReads {
			t.Fatalf("flag read %d times, want %d: %v", reads, wantReads, trace)
		}
		if reads == 1 && (readAt > firstFinish || firstBuf >= 0 && readAt > firstBuf) {
			t.Fatalf("flag read after a bucket was finished or the buffers broadcast: %v", trace)
		}
		var want []string
		for g := range nbuf {
			want = append(want, fmt.Sprintf("buf%d", g))
		}
		for k := range n {
			want = append(want, fmt.Sprintf("b%d", k))
		}
		if !slices.Equal(finished, want) {
			t.Fatalf("finished %v, want %v", finished, want)
		}
	})
}

// TestScheduleGathers: under Options.Shard the gathers launch in bucket
// order, published or not in that order, and only once every bucket has
// launched for its reduction, so every rank's wire carries the step's
// reductions first whatever the timing of its optimizer.
func TestScheduleGathers(t *testing.T) {
	s := newSchedule([]int{0, 1, 2}, 3)
	s.shard()
	for p := range 3 {
		if _, err := s.mark(p); err != nil {
			t.Fatal(err)
		}
	}
	s.launch()
	for _, step := range []struct {
		publish  int // -1: none
		launch   bool
		ready    int
		gathered []int
	}{
		{publish: 1, ready: 0}, // bucket 0 not published
		{publish: 0, ready: 0}, // buckets 1 and 2 not launched for reduction
		{publish: -1, launch: true, ready: 2, gathered: []int{0, 1}},
		{publish: 2, ready: 1, gathered: []int{2}},
	} {
		if step.publish >= 0 {
			if err := s.publish(step.publish); err != nil {
				t.Fatal(err)
			}
		}
		if step.launch {
			s.launch()
			s.launch()
		}
		if got := s.gatherReady(); got != step.ready {
			t.Fatalf("after publishing %d: %d gathers ready, want %d", step.publish, got, step.ready)
		}
		for _, want := range step.gathered {
			if got := s.launchGather(); got != want {
				t.Fatalf("launched gather %d, want %d", got, want)
			}
		}
		if got := s.launchGather(); got != -1 {
			t.Fatalf("launched gather %d, want none", got)
		}
	}
	if err := s.publish(2); err == nil {
		t.Fatal("published bucket 2 twice")
	}
	if s.gathersLaunched() != 3 {
		t.Fatalf("%d gathers launched, want 3", s.gathersLaunched())
	}
	s.reset()
	if s.isPublished(0) || s.gathersLaunched() != 0 {
		t.Fatal("reset kept the gathers")
	}
}
