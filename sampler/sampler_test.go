package sampler

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestShards checks, for many sizes, rank counts and both remainders
// policies, that the shards have Len indices each, are a deterministic
// function of (seed, epoch), and together are the epoch's order cut to a
// multiple of the ranks, or padded with its first indices: every index
// once, plus the padding, and nothing else.
func TestShards(t *testing.T) {
	for n := 0; n <= 23; n++ {
		for ranks := 1; ranks <= 5; ranks++ {
			for _, o := range []Options{{}, {DropLast: true}, {Shuffle: true, Seed: 9}, {Shuffle: true, Seed: 9, DropLast: true}} {
				t.Run(fmt.Sprintf("n=%d/ranks=%d/%+v", n, ranks, o), func(t *testing.T) {
					shards := make([][]int, ranks)
					for r := range ranks {
						s, err := New(n, ranks, r, o)
						if err != nil {
							t.Fatal(err)
						}
						shards[r] = s.Epoch(3, nil)
						if len(shards[r]) != s.Len() {
							t.Fatalf("rank %d: %d indices, Len %d", r, len(shards[r]), s.Len())
						}
						if again := s.Epoch(3, make([]int, 0, 1)); !slices.Equal(again, shards[r]) {
							t.Fatalf("rank %d: epoch 3 twice gave %v and %v", r, shards[r], again)
						}
					}
					// Interleave the shards back into the epoch's order.
					var order []int
					for k := range len(shards[0]) {
						for r := range ranks {
							order = append(order, shards[r][k])
						}
					}
					total := (n + ranks - 1) / ranks * ranks
					if o.DropLast {
						total = n / ranks * ranks
					}
					if len(order) != total {
						t.Fatalf("%d indices in all, want %d", len(order), total)
					}
					seen := map[int]int{}
					for _, i := range order {
						if i < 0 || i >= n {
							t.Fatalf("index %d out of [0, %d)", i, n)
						}
						seen[i]++
					}
					head := order[:min(n, len(order))]
					for p, i := range order {
						if p >= n && i != order[p-n] {
							t.Fatalf("padding at %d is %d, want the order's %d", p, i, order[p-n])
						}
					}
					if u := len(seen); o.DropLast && u != total || !o.DropLast && u != n {
						t.Fatalf("%d distinct indices of %d", u, n)
					}
					if !o.Shuffle && !slices.IsSorted(head) {
						t.Fatalf("without Shuffle the order is %v", head)
					}
				})
			}
		}
	}
}

// TestShuffle: the order changes with the epoch and the seed, and is the
// same on every rank (the ranks' shards of one epoch never overlap).
func TestShuffle(t *testing.T) {
	const n = 100
	epoch := func(seed uint64, e, rank int) []int {
		s, _ := New(n, 1, 0, Options{Shuffle: true, Seed: seed})
		if rank >= 0 {
			s, _ = New(n, 4, rank, Options{Shuffle: true, Seed: seed})
		}
		return s.Epoch(e, nil)
	}
	if slices.Equal(epoch(1, 0, -1), epoch(1, 1, -1)) || slices.Equal(epoch(1, 0, -1), epoch(2, 0, -1)) {
		t.Fatal("the order does not change with the epoch or the seed")
	}
	all := epoch(1, 5, -1)
	for r := range 4 {
		for k, i := range epoch(1, 5, r) {
			if want := all[4*k+r]; i != want {
				t.Fatalf("rank %d position %d: %d, want %d from the one-rank order", r, k, i, want)
			}
		}
	}
}

func TestArgs(t *testing.T) {
	for _, c := range [][3]int{{-1, 1, 0}, {5, 0, 0}, {5, 2, 2}, {5, 2, -1}} {
		if _, err := New(c[0], c[1], c[2], Options{}); !errors.Is(err, ErrArgs) {
			t.Errorf("New(%v) = %v, want ErrArgs", c, err)
		}
	}
}

// Each of 3 ranks takes its shard of 10 examples; the order is padded
// with its first index so that the shards are equal.
func Example() {
	for rank := range 3 {
		s, err := New(10, 3, rank, Options{})
		if err != nil {
			panic(err)
		}
		fmt.Println(rank, s.Epoch(0, nil))
	}
	// Output:
	// 0 [0 3 6 9]
	// 1 [1 4 7 0]
	// 2 [2 5 8 1]
}
