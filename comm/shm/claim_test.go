package shm

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestClaim: of the goroutines that try to take an offered collective,
// exactly one does; a released one can be taken again; an older or newer
// number is never taken.
func TestClaim(t *testing.T) {
	var c Claim
	if c.Take(1) || c.Offered(1) || c.Taken(1) {
		t.Fatal("the zero Claim holds operation 1")
	}
	for seq := uint64(1); seq <= 50; seq++ {
		c.Offer(seq)
		if c.Take(seq-1) || c.Take(seq+1) {
			t.Fatalf("operation %d offered, another taken", seq)
		}
		var wins atomic.Int32
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c.Take(seq) {
					wins.Add(1)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 || !c.Taken(seq) || c.Offered(seq) {
			t.Fatalf("operation %d: %d takers, taken %v", seq, wins.Load(), c.Taken(seq))
		}
		if seq%2 == 0 {
			c.Release(seq)
			if !c.Offered(seq) || !c.Take(seq) {
				t.Fatalf("operation %d released, not taken again", seq)
			}
		}
	}
}
