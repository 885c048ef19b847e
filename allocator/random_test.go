package allocator

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestRandomOps drives one pool through random Gets, Puts and Trims under a
// tight limit, checking the whole structure after every step, that live
// blocks never overlap, and that every failure is ErrExhausted.
func TestRandomOps(t *testing.T) {
	for seed := range uint64(4) {
		p, src := newPool(t, Options{SlabSize: 64 * kib, Limit: 1 * mib})
		rng := rand.New(rand.NewPCG(seed, 7))
		var live []Block
		var inUse int64
		for step := range 2000 {
			switch r := rng.IntN(10); {
			case r < 5:
				n := rng.IntN(20 * kib)
				if rng.IntN(20) == 0 {
					n = 64*kib + rng.IntN(200*kib)
				}
				b, err := p.Get(n)
				if err != nil {
					if !errors.Is(err, ErrExhausted) {
						t.Fatalf("seed %d step %d: Get(%d): %v", seed, step, n, err)
					}
					continue
				}
				if b.Size() != roundUp(n, Alignment) {
					t.Fatalf("seed %d step %d: Get(%d).Size() = %d", seed, step, n, b.Size())
				}
				for _, o := range live {
					if overlaps(b, o) {
						t.Fatalf("seed %d step %d: Get(%d) overlaps a live block", seed, step, n)
					}
				}
				live = append(live, b)
				inUse += int64(b.Size())
			case r < 9 && len(live) > 0:
				k := rng.IntN(len(live))
				mustPut(t, p, live[k])
				inUse -= int64(live[k].Size())
				live = append(live[:k], live[k+1:]...)
			case r == 9:
				p.Trim()
			}
			p.mu.Lock()
			p.checkLocked()
			p.mu.Unlock()
			st := p.Stats()
			if st.InUse != inUse || st.Blocks != len(live) || st.Mapped > st.Limit || int(src.live) != st.Slabs {
				t.Fatalf("seed %d step %d: %+v; model in use %d in %d blocks; %d regions live", seed, step, st, inUse, len(live), src.live)
			}
		}
		if st := p.Stats(); st.Exhausted == 0 || st.Trimmed == 0 || st.Hits == 0 {
			t.Errorf("seed %d: the limit, Trim or reuse was never exercised: %+v", seed, st)
		}
		for _, b := range live {
			mustPut(t, p, b)
		}
		p.Trim()
		if st := p.Stats(); st.Mapped != 0 || st.Slabs != 0 || st.InUse != 0 {
			t.Errorf("seed %d: after putting everything and Trim: %+v", seed, st)
		}
	}
}
