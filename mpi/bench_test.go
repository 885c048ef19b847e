//go:build mpi && cgo

package mpi_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/mpi"
)

// The all-reduce sweep is an SPMD measurement, not a Go benchmark: the
// ranks must run the same number of iterations, which b.N, chosen by each
// process on its own, does not guarantee. It times every iteration on
// every rank and takes, per iteration, the slowest rank's time, then the
// median over iterations: the method of scripts/peers/mpi_allreduce.c,
// so that the two are compared row by row.
//
//	go test -c -tags mpi -o /tmp/mpi.test ./mpi/
//	mpirun -np 2 --oversubscribe --mca btl self,vader /tmp/mpi.test -test.run TestSweep -mpi.sweep=blocking,nonblocking -mpi.csv=/tmp/ddpgo_mpi.csv
var (
	sweepModes  = flag.String("mpi.sweep", "", "run the all-reduce sweep for these progress modes (blocking, nonblocking, raw: blocking MPI calls made back to back by the owner, the backend's floor, or shared: blocking, on buffers from the communicator's shared memory; comma-separated)")
	sweepDirect = flag.Int("mpi.directmin", 0, "with -mpi.sweep=shared, the size from which all-reduces read and write the buffers in place rather than staged (0: the backend's)")
	sweepNTMin  = flag.Int("mpi.ntmin", -1, "with -mpi.sweep=shared, the size of a rank's slice from which two ranks' out-of-place all-reduces stream their outputs past the cache (-1: the backend's)")
	sweepFloor  = flag.Bool("mpi.floor", false, "with -mpi.sweep=shared, time staged sizes without the API (post, wait and finish on the segment, back to back); below 16 KiB only")
	sweepTouch  = flag.Bool("mpi.touch", false, "rewrite each rank's input before every timed all-reduce (untimed), as a backward pass writes its gradients: in place, the buffers then no longer stay in this core's cache from one call to the next")
	sweepCSV    = flag.String("mpi.csv", "", "append the sweep's rows to this CSV file (rank 0)")
	sweepLabel  = flag.String("mpi.label", "", "label of the sweep's CSV rows")
	sweepBudget = flag.Duration("mpi.budget", 300*time.Millisecond, "time per size and mode")
	sweepMax    = flag.Int("mpi.maxbytes", 64<<20, "largest message of the sweep")
	sweepBytes  = flag.String("mpi.bytes", "", "message sizes of the sweep, comma-separated (default 4 KiB to -mpi.maxbytes by 4x)")
)

func TestSweep(t *testing.T) {
	if *sweepModes == "" {
		t.Skip("no -mpi.sweep")
	}
	var sizes []int
	for b := 4 << 10; b <= *sweepMax; b *= 4 {
		sizes = append(sizes, b)
	}
	if *sweepBytes != "" {
		sizes = nil
		for _, f := range strings.Split(*sweepBytes, ",") {
			b, err := strconv.Atoi(f)
			if err != nil || b < 4 {
				t.Fatalf("-mpi.bytes: %q is not a size in bytes", f)
			}
			sizes = append(sizes, b)
		}
	}
	var rows []string
	rank := 0
	for _, mode := range strings.Split(*sweepModes, ",") {
		if mode == "shared" && *sweepDirect > 0 {
			defer mpi.SetDirectMin(mpi.SetDirectMin(*sweepDirect))
		}
		if mode == "shared" && *sweepNTMin >= 0 {
			defer mpi.SetNTMin(mpi.SetNTMin(*sweepNTMin))
		}
		c, err := mpi.Open(mpi.Options{Blocking: mode == "blocking" || mode == "raw" || mode == "shared"})
		if err != nil {
			t.Fatal(err)
		}
		rank = c.Rank()
		get := alloc
		if mode == "shared" {
			src := comm.HostSourceOf(c)
			if src == nil {
				t.Fatalf("-mpi.sweep=shared: the communicator offers no shared memory (Info.SharedMemory %v)", mpi.LibraryInfo().SharedMemory)
			}
			get = allocFrom(newPool(t, src))
		}
		for _, inPlace := range []bool{false, true} {
			for _, bytes := range sizes {
				med, iters := sweepOne(t, c, get, bytes, inPlace, mode == "raw")
				n := c.Size()
				busbw := comm.BusBW(comm.KindAllReduce, n, int64(bytes), med)
				pl := "outofplace"
				if inPlace {
					pl = "inplace"
				}
				row := fmt.Sprintf("ddpgo-mpi,%s%s,float32,%s,%d,%d,%d,%d,%.3f,%.4f",
					mode, *sweepLabel, pl, n, bytes, bytes/4, iters, float64(med.Nanoseconds())/1e3, busbw)
				if c.Rank() == 0 {
					fmt.Printf("%-12s %-10s %10d %6d %10.2f us %8.3f GB/s busbw\n", mode, pl, bytes, iters, float64(med.Nanoseconds())/1e3, busbw)
				}
				rows = append(rows, row)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if *sweepCSV != "" && len(rows) > 0 && rank == 0 {
		f, err := os.OpenFile(*sweepCSV, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := f.Stat(); st.Size() == 0 {
			fmt.Fprintln(f, "impl,label,dtype,mode,world,bytes,count,iters,median_us,busbw_GBps")
		}
		fmt.Fprintln(f, strings.Join(rows, "\n"))
		f.Close()
	}
}

// sweepOne times an all-reduce of bytes of float32 and returns the median
// over iterations of the slowest rank's time.
// sweepOne times bytes' all-reduces on c, through the backend or, raw,
// as MPI calls made one after another by the owner goroutine.
func sweepOne(t *testing.T, c comm.Communicator, alloc func(testing.TB, int, comm.DType) comm.Buffer, bytes int, inPlace, raw bool) (time.Duration, int) {
	count := bytes / 4
	send := alloc(t, count, comm.Float32)
	recv := send
	if !inPlace {
		recv = alloc(t, count, comm.Float32)
	}
	f := send.AsFloat32()
	for i := range f {
		f[i] = float32(c.Rank() + 1)
	}
	ctx := context.Background()
	// One monotonic clock reading per timestamp, as mpi_allreduce.c takes
	// (clock_gettime(CLOCK_MONOTONIC)): time.Now reads the wall clock too,
	// which costs several times as much on some virtual machines.
	base := time.Now()
	run := func() time.Duration {
		t0 := time.Since(base)
		if err := c.AllReduce(send, recv, comm.Sum).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return time.Since(base) - t0
	}
	warm := 10
	if bytes >= 64<<20 {
		warm = 2
	}
	for range warm {
		if inPlace {
			for i := range f {
				f[i] = float32(c.Rank() + 1)
			}
		}
		run()
	}
	// Calibrate on the slowest rank, as mpi_allreduce.c does.
	est := (run() + run() + run()) / 3
	iters := agree(t, c, int64(*sweepBudget/max(est, 1)), comm.Min)
	iters = min(max(iters, 5), 2000)
	testutil.MustWaitAll(t, c.Barrier())
	times := alloc(t, int(iters), comm.Float64)
	tf := times.AsFloat64()
	if raw {
		if err := mpi.RawAllReduceTimes(c, send.Addr, recv.Addr, count, tf); err != nil {
			t.Fatal(err)
		}
	} else if *sweepFloor {
		if err := mpi.RawStagedTimes(c, send.Addr, recv.Addr, count, tf); err != nil {
			t.Fatal(err)
		}
	} else {
		for i := range tf {
			if *sweepTouch {
				for j := range f {
					f[j] = float32(c.Rank() + 1)
				}
			}
			tf[i] = run().Seconds()
		}
	}
	testutil.MustWaitAll(t, c.AllReduce(times, times, comm.Max))
	slices.Sort(tf)
	med := tf[len(tf)/2]
	if len(tf)%2 == 0 {
		med = (tf[len(tf)/2-1] + tf[len(tf)/2]) / 2
	}
	return time.Duration(med * 1e9), int(iters)
}

// agree returns the op (Min or Max) of x over the ranks.
func agree(t *testing.T, c comm.Communicator, x int64, op comm.Op) int64 {
	b := alloc(t, 1, comm.Int64)
	b.AsInt64()[0] = x
	testutil.MustWaitAll(t, c.AllReduce(b, b, op))
	return b.AsInt64()[0]
}

// BenchmarkRoundTrip measures the backend's own cost per collective: a
// 4 KiB all-reduce in a 1-rank world, where MPI copies at most, issued and
// waited for; staged, through a segment of its own (the shared
// memory path's issue, post, completion and wait, with no peer to wait
// for). It needs a 1-rank world (a benchmark's iteration count is each
// process's own), so it is skipped under mpirun.
func BenchmarkRoundTrip(b *testing.B) {
	if underMpirun() {
		b.Skip("1-rank world only")
	}
	for _, mode := range []string{"blocking", "nonblocking", "staged"} {
		b.Run(mode, func(b *testing.B) {
			defer mpi.SetStagedAlone(mpi.SetStagedAlone(mode == "staged"))
			c, err := mpi.Open(mpi.Options{Blocking: mode != "nonblocking"})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := alloc(b, 1024, comm.Float32)
			ctx := context.Background()
			for b.Loop() {
				if err := c.AllReduce(buf, buf, comm.Sum).Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "us/op")
			if got := mpi.StagedOps(c); (got > 0) != (mode == "staged") {
				b.Fatalf("%d all-reduces staged", got)
			}
		})
	}
}
