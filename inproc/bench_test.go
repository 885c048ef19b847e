package inproc_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/internal/reduce"
)

func benchGroup(b *testing.B, n int) []comm.Communicator {
	cs, err := inproc.NewGroup(n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	out := make([]comm.Communicator, n)
	for r, c := range cs {
		out[r] = c
	}
	return out
}

// BenchmarkAllReduce reports bus bandwidth and time per operation of an
// in-place float32 sum all-reduce, as nccl-tests' all_reduce_perf does.
func BenchmarkAllReduce(b *testing.B) {
	for _, dt := range []comm.DType{comm.Float32, comm.Float16, comm.BFloat16} {
		for _, n := range []int{2, 3, 4} {
			for _, size := range []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20} {
				if dt != comm.Float32 && n != 2 {
					continue
				}
				b.Run(fmt.Sprintf("%s/%dranks/%s", name(dt), n, commtest.SizeName(size)), func(b *testing.B) {
					commtest.Bench(b, benchGroup(b, n), comm.KindAllReduce, dt, size)
				})
			}
		}
	}
}

// BenchmarkCollectives covers the other collectives on two ranks.
func BenchmarkCollectives(b *testing.B) {
	kinds := []comm.Kind{comm.KindBroadcast, comm.KindReduce, comm.KindAllGather, comm.KindReduceScatter}
	for _, k := range kinds {
		for _, size := range []int{4 << 10, 16 << 20} {
			b.Run(fmt.Sprintf("%s/float32/2ranks/%s", k, commtest.SizeName(size)), func(b *testing.B) {
				commtest.Bench(b, benchGroup(b, 2), k, comm.Float32, size)
			})
		}
	}
	b.Run("barrier/2ranks", func(b *testing.B) {
		commtest.Bench(b, benchGroup(b, 2), comm.KindBarrier, comm.Float32, 0)
	})
}

func name(dt comm.DType) string {
	switch dt {
	case comm.Float32:
		return "float32"
	case comm.Float16:
		return "float16"
	}
	return dt.String()
}

// BenchmarkRoofline is the baseline for BenchmarkAllReduce/float32/2ranks:
// the same memory traffic (two goroutines, each summing half of two
// vectors into both) with no synchronisation beyond a WaitGroup. Compare
// the two in the same run; the machine's memory bandwidth varies with load.
func BenchmarkRoofline(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("float32/2ranks/%s", commtest.SizeName(size)), func(b *testing.B) {
			n := size / 4
			x, y := make([]float32, n), make([]float32, n)
			var wg sync.WaitGroup
			for b.Loop() {
				for p := range 2 {
					lo, hi := p*n/2, (p+1)*n/2
					wg.Go(func() { reduce.SumFloat32Twice(x[lo:hi], y[lo:hi], x[lo:hi], y[lo:hi]) })
				}
				wg.Wait()
			}
			d := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(comm.BusBW(comm.KindAllReduce, 2, int64(size), d), "busbw-GB/s")
			b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
		})
	}
}
