package inproc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

// TestRandomSequences drives each rank from its own goroutine through the
// same random sequence of collectives, mixing the one-rank and parallel
// paths, kinds and roots, and waiting at random points, and checks every
// result against a direct computation.
func TestRandomSequences(t *testing.T) {
	const ops = 300
	for _, n := range []int{2, 3, 4} {
		rng := rand.New(rand.NewPCG(uint64(n), 99))
		type step struct {
			kind  comm.Kind
			count int
			root  int
			op    comm.Op
		}
		steps := make([]step, ops)
		for i := range steps {
			count := []int{0, 1, 5, 300, 5000, 20000}[rng.IntN(6)]
			kinds := []comm.Kind{comm.KindAllReduce, comm.KindBroadcast, comm.KindReduce, comm.KindAllGather, comm.KindReduceScatter, comm.KindBarrier}
			steps[i] = step{kinds[rng.IntN(len(kinds))], count, rng.IntN(n), comm.Ops[rng.IntN(len(comm.Ops))]}
		}
		val := func(r, i, e int) int64 { return int64((r*7+i*13+e)%101) - 50 }
		cs := testGroup(t, n, Options{})
		var wg sync.WaitGroup
		for r, c := range cs {
			wg.Go(func() {
				wr := rand.New(rand.NewPCG(uint64(r), 7))
				type pending struct {
					w     comm.Work
					check func() string
					i     int
				}
				var queue []pending
				flush := func() bool {
					for _, p := range queue {
						if err := p.w.Wait(context.Background()); err != nil {
							if !errors.Is(err, comm.ErrAborted) {
								t.Errorf("%d ranks, rank %d, step %d: %v", n, r, p.i, err)
								c.Abort(err)
							}
							return false
						}
						if msg := p.check(); msg != "" {
							t.Errorf("%d ranks, rank %d, step %d (%v): %s", n, r, p.i, steps[p.i], msg)
							c.Abort(errors.New(msg)) // release the other ranks
							return false
						}
					}
					queue = queue[:0]
					return true
				}
				for i, s := range steps {
					in := make([]int64, s.count)
					for e := range in {
						in[e] = val(r, i, e)
					}
					// reduced returns element e of the reduction over ranks.
					reduced := func(e int) int64 {
						x := val(0, i, e)
						for q := 1; q < n; q++ {
							v := val(q, i, e)
							switch s.op {
							case comm.Sum, comm.Avg:
								x += v
							case comm.Max:
								x = max(x, v)
							case comm.Min:
								x = min(x, v)
							}
						}
						if s.op == comm.Avg {
							x /= int64(n)
						}
						return x
					}
					var w comm.Work
					var check func() string
					bad := func(what string, e int, got, want int64) string {
						return fmt.Sprintf("%s: element %d = %d, want %d", what, e, got, want)
					}
					switch s.kind {
					case comm.KindAllReduce:
						w = c.AllReduce(comm.Int64s(in), comm.Int64s(in), s.op)
						check = func() string {
							for e, got := range in {
								if want := reduced(e); got != want {
									return bad("all_reduce", e, got, want)
								}
							}
							return ""
						}
					case comm.KindBroadcast:
						w = c.Broadcast(comm.Int64s(in), s.root)
						check = func() string {
							for e, got := range in {
								if want := val(s.root, i, e); got != want {
									return bad("broadcast", e, got, want)
								}
							}
							return ""
						}
					case comm.KindReduce:
						out := make([]int64, s.count)
						w = c.Reduce(comm.Int64s(in), comm.Int64s(out), s.op, s.root)
						check = func() string {
							if r != s.root {
								return ""
							}
							for e, got := range out {
								if want := reduced(e); got != want {
									return bad("reduce", e, got, want)
								}
							}
							return ""
						}
					case comm.KindAllGather:
						out := make([]int64, n*s.count)
						w = c.AllGather(comm.Int64s(in), comm.Int64s(out))
						check = func() string {
							for e, got := range out {
								if want := val(e/max(s.count, 1), i, e%max(s.count, 1)); got != want {
									return bad("all_gather", e, got, want)
								}
							}
							return ""
						}
					case comm.KindReduceScatter:
						m := s.count / n
						send := make([]int64, n*m)
						for e := range send {
							send[e] = val(r, i, e)
						}
						out := make([]int64, m)
						w = c.ReduceScatter(comm.Int64s(send), comm.Int64s(out), s.op)
						check = func() string {
							for e, got := range out {
								if want := reduced(r*m + e); got != want {
									return bad("reduce_scatter", e, got, want)
								}
							}
							return ""
						}
					case comm.KindBarrier:
						w = c.Barrier()
						check = func() string { return "" }
					}
					queue = append(queue, pending{w, check, i})
					if wr.IntN(4) == 0 && !flush() {
						return
					}
				}
				flush()
			})
		}
		wg.Wait()
	}
}
