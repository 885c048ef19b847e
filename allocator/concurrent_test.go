package allocator

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

// liveSet records the address ranges of live blocks and fails the test if
// two of them ever share a byte.
type liveSet struct {
	mu sync.Mutex
	m  map[uintptr]int // start -> size
}

func (s *liveSet) add(t *testing.T, b Block) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := uintptr(b.Addr())
	for y, n := range s.m {
		if x < y+uintptr(n) && y < x+uintptr(b.Size()) {
			t.Errorf("block %#x+%d overlaps live block %#x+%d", x, b.Size(), y, n)
		}
	}
	s.m[x] = b.Size()
}

func (s *liveSet) remove(b Block) {
	s.mu.Lock()
	delete(s.m, uintptr(b.Addr()))
	s.mu.Unlock()
}

// TestConcurrent has goroutines Get blocks of mixed sizes, fill them with a
// pattern of their own, yield, check that the pattern survived, and Put
// them, while a shared set checks that no two live blocks overlap. Run it
// with -race: a block handed to two owners is also a data race.
func TestConcurrent(t *testing.T) {
	p, src := newPool(t, Options{SlabSize: 256 * kib, Limit: 64 * mib})
	sizes := []int{1, 512, 513, 3000, 4 * kib, 40 * kib, 255 * kib, 300 * kib, 1 * mib}
	workers, iters := 8, 300
	if testing.Short() {
		iters = 50
	}
	live := &liveSet{m: map[uintptr]int{}}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var held []Block
			for it := range iters {
				if len(held) < 4 && (len(held) == 0 || rng.IntN(2) == 0) {
					n := sizes[rng.IntN(len(sizes))]
					b, err := p.Get(n)
					if err != nil {
						t.Errorf("worker %d: Get(%d): %v", w, n, err)
						return
					}
					live.add(t, b)
					fill(b, byte(w*31+it))
					held = append(held, b)
				} else {
					k := rng.IntN(len(held))
					b := held[k]
					held = append(held[:k], held[k+1:]...)
					if err := verify(b); err != nil {
						t.Errorf("worker %d: %v", w, err)
					}
					live.remove(b)
					if err := p.Put(b); err != nil {
						t.Errorf("worker %d: Put: %v", w, err)
					}
				}
				runtime.Gosched()
			}
			for _, b := range held {
				if err := verify(b); err != nil {
					t.Errorf("worker %d: %v", w, err)
				}
				live.remove(b)
				if err := p.Put(b); err != nil {
					t.Errorf("worker %d: Put: %v", w, err)
				}
			}
		})
	}
	wg.Wait()
	st := p.Stats()
	if st.InUse != 0 || st.Blocks != 0 || st.Gets != st.Puts || st.Hits+st.Misses != st.Gets {
		t.Errorf("after all workers: %+v", st)
	}
	if st.Peak > st.Mapped+st.Trimmed || int64(src.allocs) != int64(st.Misses) {
		t.Errorf("peak %d, mapped %d, trimmed %d; %d source allocs for %d misses", st.Peak, st.Mapped, st.Trimmed, src.allocs, st.Misses)
	}
}

// fill writes a pattern tagged with v over the whole block.
func fill(b Block, v byte) {
	buf := b.Bytes()
	for i := range buf {
		buf[i] = v + byte(i>>9)
	}
}

func verify(b Block) error {
	buf := b.Bytes()
	v := buf[0]
	for i := range buf {
		if buf[i] != v+byte(i>>9) {
			return fmt.Errorf("block %p+%d: byte %d is %d, want %d: another owner wrote it", b.Addr(), b.Size(), i, buf[i], v+byte(i>>9))
		}
	}
	return nil
}
