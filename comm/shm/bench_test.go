package shm

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// BenchmarkStagedPair takes both ranks of a staged float32 sum
// all-reduce through every step of the protocol from one goroutine:
// the engine's own cost per all-reduce (publish with the copy of the
// input, look, judge, reduce in rank order), with no cross-core transfer
// and no waiting. What a backend adds is its waits and the cache lines
// that move between the ranks' cores.
func BenchmarkStagedPair(b *testing.B) {
	for _, size := range []int{16, 4 << 10, 16 << 10} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			seg, err := NewHeap(Layout{Ranks: 2, Stage: 32 << 10})
			if err != nil {
				b.Fatal(err)
			}
			eps := []*Endpoint{seg.Endpoint(0), seg.Endpoint(1)}
			n := size / 4
			in := [][]float32{make([]float32, n), make([]float32, n)}
			out := [][]float32{make([]float32, n), make([]float32, n)}
			c := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum, DType: comm.Float32, Count: n}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			k := uint64(0)
			for b.Loop() {
				k++
				c.Seq = k
				for r, e := range eps {
					e.Publish(k, c, Staged, unsafe.Pointer(&in[r][0]), nil)
				}
				for r, e := range eps {
					if e.Lagging(k, Called, 0) != 2 || e.Judge(k) != nil {
						b.Fatal("not published, or not agreed")
					}
					e.FinishStaged(k, unsafe.Pointer(&out[r][0]))
				}
			}
		})
	}
}
