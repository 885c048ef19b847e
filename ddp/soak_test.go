package ddp

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// soakParams is a small model of mixed sizes (98,406 float32 elements),
// bucketed by the caps of TestSoak into several buckets.
var soakParams = func() []Param {
	var ps []Param
	for i, shape := range [][]int{{64, 3, 3, 3}, {64}, {128, 64, 3}, {128}, {256, 128}, {256}, {7}, {}, {100, 100}, {10, 256}, {10}, {0, 5}} {
		ps = append(ps, Param{Name: fmt.Sprintf("p%d", i), Shape: shape})
	}
	return ps
}()

// TestSoak runs many steps of 4 in-process ranks and checks, every step
// and on every rank, that each reduced gradient is bit for bit the
// sequential average that the Avg hook documents for a power-of-two
// world (every contribution times 1/4, added in rank order); over the run,
// that the Go heap and the pool's use stay flat, that steps allocate
// nothing, and that no goroutine is left after Close. DDPGO_SOAK_STEPS sets
// the step count (make soak: 10,000); the default keeps make test quick.
func TestSoak(t *testing.T) {
	steps := 60
	if s := os.Getenv("DDPGO_SOAK_STEPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 20 {
			t.Fatalf("DDPGO_SOAK_STEPS=%q: want a step count of at least 20", s)
		}
		steps = n
	}
	testutil.NoLeak(t)
	const n = 4
	pool, err := allocator.New(allocator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	cs := newTestGroup(t, n)
	params := soakParams
	// Every rank's input of the current step, written before its Ready;
	// ranks meet at a barrier before the next step overwrites them.
	inputs := make([][][]float32, n)
	for r := range inputs {
		inputs[r] = make([][]float32, len(params))
		for i, p := range params {
			inputs[r][i] = make([]float32, p.Numel())
		}
	}
	bar := newBarrier(n)
	warm := min(steps/4, 200)
	var heap0, heap1, mallocs0, mallocs1 uint64
	var inUse0, inUse1 int64
	var buckets int
	start := time.Now()
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		r, err := New(context.Background(), c, params, Options{Pool: pool, BucketCap: 64 << 10, FirstBucketCap: 16 << 10, Timeout: time.Minute})
		if err != nil {
			return err
		}
		defer r.Close()
		if rank == 0 {
			buckets = len(r.Buckets())
		}
		state := uint64(rank + 1)
		for step := range steps {
			if step == warm || step == steps-1 {
				if bar.wait(); rank == 0 {
					runtime.GC()
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					if step == warm {
						heap0, mallocs0, inUse0 = ms.HeapAlloc, ms.Mallocs, pool.Stats().InUse
					} else {
						heap1, mallocs1, inUse1 = ms.HeapAlloc, ms.Mallocs, pool.Stats().InUse
					}
				}
				bar.wait()
			}
			if err := r.Begin(Sync); err != nil {
				return err
			}
			// Backward order: the last parameter first.
			for i := len(params) - 1; i >= 0; i-- {
				g, in := mustGrad(r, i), inputs[rank][i]
				for j := range g {
					// xorshift64*: full-range mantissas and signs, exponents
					// near 1, so that sums round.
					state ^= state >> 12
					state ^= state << 25
					state ^= state >> 27
					v := state * 2685821657736338717
					in[j] = float32(int32(v>>32)) * 0x1p-28
					g[j] = in[j]
				}
				if err := r.Ready(i); err != nil {
					return err
				}
			}
			if err := r.Wait(context.Background()); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			for i := range params {
				g := mustGrad(r, i)
				for j := range g {
					want := float32(inputs[0][i][j] * 0.25)
					for q := 1; q < n; q++ {
						want = float32(want + float32(inputs[q][i][j]*0.25))
					}
					if g[j] != want {
						return fmt.Errorf("step %d, %s[%d]: %v, want the sequential average %v", step, params[i].Name, j, g[j], want)
					}
				}
			}
			bar.wait() // every rank has checked before inputs are rewritten
		}
		return r.Close()
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	measured := steps - 1 - warm
	if buckets < 4 {
		t.Errorf("%d buckets; the soak wants several", buckets)
	}
	t.Logf("%d steps of %d ranks (%d parameters, %d buckets) in %v (%.2f ms/step with the checks); "+
		"over the last %d steps: heap %d -> %d bytes, %d allocations, pool in use %d -> %d bytes",
		steps, n, len(params), buckets, took.Round(time.Millisecond), float64(took.Microseconds())/1e3/float64(steps),
		measured, heap0, heap1, mallocs1-mallocs0, inUse0, inUse1)
	if inUse1 != inUse0 {
		t.Errorf("pool in use %d bytes after %d steps, %d before: the steps leak pool memory", inUse1, measured, inUse0)
	}
	// The runtime and the test harness allocate a little on their own;
	// a step that allocated would add thousands.
	if a := mallocs1 - mallocs0; a > uint64(measured)/10+100 {
		t.Errorf("%d allocations over %d steps", a, measured)
	}
	if heap1 > heap0+1<<20 {
		t.Errorf("heap grew from %d to %d bytes over %d steps", heap0, heap1, measured)
	}
}

// barrier is a reusable barrier for a fixed number of goroutines.
type barrier struct {
	mu    sync.Mutex
	cond  *sync.Cond
	n     int
	count int
	gen   uint64
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	gen := b.gen
	if b.count++; b.count == b.n {
		b.count, b.gen = 0, gen+1
		b.cond.Broadcast()
		return
	}
	for gen == b.gen {
		b.cond.Wait()
	}
}
