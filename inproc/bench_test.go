package inproc_test

import (
	"context"
	"fmt"
	"slices"
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
			for _, size := range []int{4, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20} {
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

// BenchmarkAllReducePerRank times an in-place float32 sum all-reduce with
// every rank driven from its own goroutine, issuing and waiting in a loop
// as an MPI process does (BenchmarkAllReduce drives every rank from one
// goroutine). us/op is the loop time per operation, as ddpbench
// collective reports it; median-us times every iteration on its own and
// takes, per iteration, the slowest rank's time, then the median over
// iterations, as the Open MPI comparison program (mpi_allreduce.c) does:
// on a loaded machine it leaves out the iterations in which the operating
// system took a rank's processor away.
func BenchmarkAllReducePerRank(b *testing.B) {
	for _, size := range []int{4, 4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("float32/2ranks/%s", commtest.SizeName(size)), func(b *testing.B) {
			cs := benchGroup(b, 2)
			bufs := []comm.Buffer{comm.Float32s(make([]float32, size/4)), comm.Float32s(make([]float32, size/4))}
			ctx := context.Background()
			times := [][]time.Duration{nil, nil}
			// One monotonic clock reading per timestamp, as
			// mpi_allreduce.c takes: time.Now reads the wall clock too,
			// which costs several times as much on some virtual machines.
			base := time.Now()
			run := func(iters int) {
				var wg sync.WaitGroup
				for r, c := range cs {
					times[r] = slices.Grow(times[r][:0], iters)[:iters]
					wg.Go(func() {
						t := times[r]
						for i := range iters {
							start := time.Since(base)
							if err := c.AllReduce(bufs[r], bufs[r], comm.Sum).Wait(ctx); err != nil {
								b.Error(err)
								return
							}
							t[i] = time.Since(base) - start
						}
					})
				}
				wg.Wait()
			}
			run(100) // warm up
			b.ResetTimer()
			run(b.N)
			b.StopTimer()
			d := b.Elapsed() / time.Duration(b.N)
			worst := make([]time.Duration, b.N)
			for i := range worst {
				worst[i] = max(times[0][i], times[1][i])
			}
			slices.Sort(worst)
			b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
			b.ReportMetric(float64(worst[b.N/2].Nanoseconds())/1e3, "median-us")
		})
	}
}
