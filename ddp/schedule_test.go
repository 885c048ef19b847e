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
