package hier_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/hier"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// FuzzLayouts runs the collectives on any layout of up to four hosts of
// one to three ranks, numbered in any order, with any count, and checks
// every rank's result exactly against one computed here, with and
// without all-reduces cut into chunks: int64 all-reduce
// (sum) and reduce (sum), int32 broadcast, all-gather and reduce-scatter
// (max).
func FuzzLayouts(f *testing.F) {
	f.Add([]byte{2, 2}, uint64(0), uint16(7), uint8(1), uint8(0))
	f.Add([]byte{3, 1}, uint64(1), uint16(1), uint8(3), uint8(1))
	f.Add([]byte{1, 3, 2}, uint64(2), uint16(100), uint8(2), uint8(2))
	f.Add([]byte{2, 2, 1}, uint64(3), uint16(0), uint8(4), uint8(1))
	f.Add([]byte{3, 3}, uint64(4), uint16(8), uint8(0), uint8(2))
	f.Add([]byte{1, 1, 1, 1}, uint64(5), uint16(5), uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, sizes []byte, shuffle uint64, count uint16, root, chunk uint8) {
		if len(sizes) == 0 || len(sizes) > 4 {
			t.Skip()
		}
		hosts := make([]int, len(sizes))
		for h, s := range sizes {
			hosts[h] = 1 + int(s)%3
		}
		n, k := 0, int(count%300)
		for _, s := range hosts {
			n += s
		}
		// Any numbering: a permutation of the host-major one.
		perm := rand.New(rand.NewPCG(shuffle, 1)).Perm(n)
		hm := hier.PerHost(hosts...)
		l := make(hier.Layout, n)
		for i, r := range perm {
			l[r] = hm[i]
		}
		rt := int(root) % n
		// Chunks of the whole, 64 or 256 bytes: 8 or 32 int64s.
		cs := newChunkedJob(t, l, inproc.Options{}, [3]int{0, 64, 256}[chunk%3])
		defer func() {
			for _, c := range cs {
				c.Close()
			}
		}()
		pool, err := allocator.New(allocator.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var blocks []allocator.Block
		defer func() {
			for _, b := range blocks {
				pool.Put(b)
			}
		}()
		get := func(count int, dt comm.DType) comm.Buffer {
			b, err := pool.Get(max(count*dt.Size(), 1))
			if err != nil {
				t.Fatal(err)
			}
			blocks = append(blocks, b)
			return comm.HostBuffer(b.Addr(), count, dt)
		}
		val := func(r, i int) int64 { return int64((r+1)*1000 + i*7%101 - 50) }

		sum, red, bc := make([]comm.Buffer, n), make([]comm.Buffer, n), make([]comm.Buffer, n)
		gs, gr, ss, sr := make([]comm.Buffer, n), make([]comm.Buffer, n), make([]comm.Buffer, n), make([]comm.Buffer, n)
		var ws []comm.Work
		for r, c := range cs {
			sum[r], red[r], bc[r] = get(k, comm.Int64), get(k, comm.Int64), get(k, comm.Int32)
			gs[r], gr[r], ss[r], sr[r] = get(k, comm.Int32), get(n*k, comm.Int32), get(n*k, comm.Int32), get(k, comm.Int32)
			for i := range k {
				sum[r].AsInt64()[i], red[r].AsInt64()[i] = val(r, i), val(r, i)
				bc[r].AsInt32()[i], gs[r].AsInt32()[i] = int32(val(r, i)), int32(val(r, i))
			}
			for i := range n * k {
				ss[r].AsInt32()[i] = int32(val(r, i) * int64(1-2*(i%2)))
			}
			ws = append(ws, c.AllReduce(sum[r], sum[r], comm.Sum), c.Reduce(red[r], red[r], comm.Sum, rt),
				c.Broadcast(bc[r], rt), c.AllGather(gs[r], gr[r]), c.ReduceScatter(ss[r], sr[r], comm.Max))
		}
		testutil.MustWaitAll(t, ws...)
		what := fmt.Sprintf("layout %v, count %d, root %d, chunk %d", l, k, rt, chunk%3)
		for r := range n {
			for i := range k {
				var s int64
				for q := range n {
					s += val(q, i)
				}
				if got := sum[r].AsInt64()[i]; got != s {
					t.Fatalf("%s: rank %d: all_reduce element %d = %d, want %d", what, r, i, got, s)
				}
				if got := red[r].AsInt64()[i]; r == rt && got != s {
					t.Fatalf("%s: rank %d: reduce element %d = %d, want %d", what, r, i, got, s)
				}
				if got, want := bc[r].AsInt32()[i], int32(val(rt, i)); got != want {
					t.Fatalf("%s: rank %d: broadcast element %d = %d, want %d", what, r, i, got, want)
				}
				j := r*k + i
				m := make([]int32, n)
				for q := range n {
					m[q] = int32(val(q, j) * int64(1-2*(j%2)))
				}
				if got, want := sr[r].AsInt32()[i], slices.Max(m); got != want {
					t.Fatalf("%s: rank %d: reduce_scatter element %d = %d, want %d", what, r, i, got, want)
				}
			}
			for q := range n {
				for i := range k {
					if got, want := gr[r].AsInt32()[q*k+i], int32(val(q, i)); got != want {
						t.Fatalf("%s: rank %d: all_gather block %d element %d = %d, want %d", what, r, q, i, got, want)
					}
				}
			}
		}
	})
}
