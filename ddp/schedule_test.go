package ddp

import (
	"errors"
	"slices"
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
