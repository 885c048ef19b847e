package hooks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// psgdBucket is one rank's bucket of tensors in pool memory, with the
// scratch the hook asks for.
type psgdBucket struct {
	b     *Bucket
	g     []float32
	puts  []allocator.Block
	shape [][]int
}

func newPSGDBucket(pool *allocator.Pool, h Hook, index int, shapes [][]int) (*psgdBucket, error) {
	pb := &psgdBucket{shape: shapes}
	var ts []Tensor
	off := 0
	for p, s := range shapes {
		n := 1
		for _, d := range s {
			n *= d
		}
		ts = append(ts, Tensor{Param: p, Offset: off, Shape: s})
		off += n
	}
	blk, err := pool.Get(4 * max(off, 1))
	if err != nil {
		return nil, err
	}
	pb.puts = append(pb.puts, blk)
	pb.g = blk.Float32s()[:off]
	pb.b = &Bucket{Index: index, Buf: comm.Float32s(pb.g), Tensors: ts}
	pb.b.Buf = comm.HostBuffer(blk.Addr(), off, comm.Float32)
	if need := ScratchFor(h, pb.b); need > 0 {
		s, err := pool.Get(need)
		if err != nil {
			return nil, err
		}
		pb.puts = append(pb.puts, s)
		pb.b.Scratch = comm.HostBuffer(s.Addr(), need, comm.Uint8)
	}
	return pb, nil
}

func (pb *psgdBucket) free(pool *allocator.Pool) {
	for _, b := range pb.puts {
		pool.Put(b)
	}
}

// psgdGroup runs f on every rank of an n-rank in-process group, each with
// its own pool and a PowerSGD hook of options o (per rank: opts(rank)).
func psgdGroup(t *testing.T, n int, opts func(rank int) PowerSGDOptions, f func(rank int, h *PowerSGDHook, pool *allocator.Pool) error) []error {
	t.Helper()
	cs, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() {
			pool, err := allocator.New(allocator.Options{})
			if err != nil {
				errs[r] = err
				return
			}
			defer pool.Close()
			o := opts(r)
			o.Pool = pool
			h := PowerSGD(o)
			if err := h.Setup(c, comm.HostKernels()); err != nil {
				errs[r] = err
				return
			}
			errs[r] = f(r, h, pool)
			if errs[r] != nil {
				c.Abort(errs[r])
			}
			errs[r] = errors.Join(errs[r], h.Close())
			if st := pool.Stats(); st.InUse != 0 && errs[r] == nil {
				errs[r] = fmt.Errorf("rank %d: %d bytes still in use after Close", r, st.InUse)
			}
		})
	}
	wg.Wait()
	return errs
}

func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// lowRankish returns an n×m matrix with singular values decaying as
// 1/(k+1)^2, plus a little noise: gradients of real layers look so.
func lowRankish(rng *rand.Rand, n, m int) []float32 {
	out := make([]float32, n*m)
	for k := range min(n, m) {
		s := 1 / float64((k+1)*(k+1))
		u := make([]float64, n)
		v := make([]float64, m)
		for i := range u {
			u[i] = rng.NormFloat64()
		}
		for j := range v {
			v[j] = rng.NormFloat64()
		}
		for i := range n {
			for j := range m {
				out[i*m+j] += float32(s * u[i] * v[j])
			}
		}
	}
	for i := range out {
		out[i] += float32(0.001 * rng.NormFloat64())
	}
	return out
}

func reduceBucket(h Hook, b *Bucket) error {
	w, err := h.Launch(b)
	if err != nil {
		return err
	}
	if err := w.Wait(context.Background()); err != nil {
		return err
	}
	return h.Finish(b)
}

func TestPowerSGDSmoke(t *testing.T) {
	const n = 2
	rng := rand.New(rand.NewPCG(1, 2))
	g := [][]float32{lowRankish(rng, 32, 48), lowRankish(rng, 32, 48)}
	out := make([][]float32, n)
	errs := psgdGroup(t, n, func(int) PowerSGDOptions {
		o := DefaultPowerSGDOptions()
		o.StartIter, o.Rank = 0, 4
		return o
	}, func(rank int, h *PowerSGDHook, pool *allocator.Pool) error {
		pb, err := newPSGDBucket(pool, h, 0, [][]int{{32, 48}, {32}})
		if err != nil {
			return err
		}
		defer pb.free(pool)
		copy(pb.g, g[rank])
		if err := reduceBucket(h, pb.b); err != nil {
			return err
		}
		out[rank] = append([]float32(nil), pb.g...)
		return nil
	})
	noErrors(t, errs)
	var num, den float64
	for i := range 32 * 48 {
		avg := (float64(g[0][i]) + float64(g[1][i])) / 2
		d := float64(out[0][i]) - avg
		num += d * d
		den += avg * avg
		if out[0][i] != out[1][i] {
			t.Fatalf("elem %d: ranks differ", i)
		}
	}
	t.Logf("relative error %.3g", math.Sqrt(num/den))
	_ = strings.Contains
}
