//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/hier"
	"github.com/ddpgo/ddpgo/internal/mpitest"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/mpi"
)

// hierLayoutEnv makes TestHierarchy a rank of a job whose ranks are
// named onto hosts as the layout says ("2+2": ranks 0 and 1 on one host,
// 2 and 3 on another), through DDPGO_MPI_HOST.
const hierLayoutEnv = "DDPGO_MPI_TEST_LAYOUT"

// hierLabEnv, set to 1, says that TestHierarchy's ranks run on hosts of
// their own, the network lab's (scripts/netfaults.sh runs it so): Open
// tells the hosts apart itself, and each rank checks that it runs on the
// lab host the layout puts it on.
const hierLabEnv = "DDPGO_MPI_TEST_LAB"

// TestHierarchyUnderMpirun runs TestHierarchy as jobs of 4 ranks named
// onto two hosts, 3+1 and 2+2 (the ranks share this machine; only their
// host names differ, so each host's level runs in shared memory and the
// cross-host level over MPI), the 2+2 one with its all-reduces pipelined
// in 64 KiB chunks, and 2+2 jobs whose ranks disagree on the chunk, or one
// of which asks for an invalid one.
func TestHierarchyUnderMpirun(t *testing.T) {
	if underMpirun() {
		t.Skip("already a rank of an mpirun job")
	}
	if testing.Short() {
		t.Skip("-short: the jobs under mpirun are skipped")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun not found (Debian: apt-get install openmpi-bin)")
	}
	// 2+2 runs with 64 KiB chunks only: its small sizes take the unchunked
	// path, its large ones the pipeline, and 3+1 checks the default chunk
	// (the lab's netfaults hier runs 2+2 with it across hosts).
	for _, job := range []struct{ layout, chunk string }{{"3+1", ""}, {"2+2", "64K"}, {"2+2", "mismatch"}, {"2+2", "invalid"}} {
		name := job.layout
		if job.chunk != "" {
			name += ",chunk-" + job.chunk
		}
		t.Run(name, func(t *testing.T) {
			args := append(mpitest.Args(4, mpitest.SharedMemory), os.Args[0], "-test.run=^TestHierarchy$", "-test.count=1", "-test.timeout=10m")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, mpirun, args...)
			cmd.Env = append(childEnv(), hierLayoutEnv+"="+job.layout, hierChunkEnv+"="+job.chunk)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("mpirun -np 4, %s: %v\n%s", name, err, out)
			}
			if strings.Count(string(out), "--- SKIP") > 0 || !strings.Contains(string(out), "PASS") {
				t.Fatalf("%s: TestHierarchy did not run on every rank:\n%s", name, out)
			}
		})
	}
}

// hierChunkEnv gives TestHierarchy's ranks DDPGO_MPI_HIER_CHUNK; with
// "mismatch" rank 0 asks for none ("0") and the others for the default,
// with "invalid" rank 3 asks for "4X", and every rank's Open must fail.
const hierChunkEnv = "DDPGO_MPI_TEST_CHUNK"

// TestHierarchy is a rank of a job of TestHierarchyUnderMpirun, or of
// scripts/netfaults.sh's hier scenario across the network lab's hosts: its
// blocking communicator is hierarchical, and every collective, dtype, op
// and size gives the results of TestBlockingCollectives, on memory of
// the communicator's shared source and on other memory.
func TestHierarchy(t *testing.T) {
	layout := os.Getenv(hierLayoutEnv)
	if layout == "" {
		t.Skip("a rank of TestHierarchyUnderMpirun's jobs")
	}
	rank, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_RANK"))
	if err != nil {
		t.Fatalf("OMPI_COMM_WORLD_RANK: %v", err)
	}
	host, first, alone := 0, 0, false
	for h, f := range strings.Split(layout, "+") {
		n, _ := strconv.Atoi(f)
		if rank >= first && rank < first+n {
			host, alone = h, n == 1
		}
		first += n
	}
	if os.Getenv(hierLabEnv) == "1" {
		// netlab.sh names host i's namespaces and nodes PREFIX-hi.
		if name, err := os.Hostname(); err != nil || !strings.HasSuffix(name, "-h"+strconv.Itoa(host)) {
			t.Fatalf("rank %d: runs on host %q (%v); hosts %s put it on the lab's h%d", rank, name, err, layout, host)
		}
	} else {
		t.Setenv("DDPGO_MPI_HOST", "lab-host-"+strconv.Itoa(host))
	}
	chunk := os.Getenv(hierChunkEnv)
	if chunk == "mismatch" || chunk == "invalid" {
		// Every rank must fail Open, none wait for the others.
		asks := map[string]map[int]string{"mismatch": {0: "0"}, "invalid": {3: "4X"}}[chunk]
		t.Setenv("DDPGO_MPI_HIER_CHUNK", asks[rank])
		c, err := mpi.Open(mpi.Options{Blocking: true})
		if err == nil {
			c.Close()
			t.Fatalf("rank %d: Open with DDPGO_MPI_HIER_CHUNK %v by rank: no error", rank, asks)
		}
		want := map[string]string{"mismatch": "DDPGO_MPI_HIER_CHUNK differs between ranks: from 0 to 1048576 bytes (this rank ",
			"invalid": "DDPGO_MPI_HIER_CHUNK is invalid on another rank"}[chunk]
		if asks[rank] == "4X" {
			want = `DDPGO_MPI_HIER_CHUNK="4X": want bytes`
		}
		if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Fatalf("rank %d: Open: %v; want comm.ErrInvalid saying %q", rank, err, want)
		}
		return
	}
	t.Setenv("DDPGO_MPI_HIER_CHUNK", chunk)
	c := open(t, mpi.Options{Blocking: true})
	hc, ok := c.(*hier.Comm)
	if !ok {
		t.Fatalf("rank %d: a blocking communicator over hosts %s is a %T, not hierarchical", rank, layout, c)
	}
	// A host of one rank has nobody to share memory with.
	wantChunk := map[string]int{"": 1 << 20, "64K": 64 << 10}[chunk]
	if hc.ChunkBytes() != wantChunk {
		t.Fatalf("rank %d: the hierarchy cuts all-reduces into %d-byte chunks, want %d", rank, hc.ChunkBytes(), wantChunk)
	}
	if info := mpi.LibraryInfo(); info.Hierarchy != layout || info.Hosts != 2 || info.SharedMemory == alone || info.HierarchyChunk != wantChunk {
		t.Fatalf("rank %d: Info says hierarchy %q over %d hosts, shared memory %v, chunk %d; want %q over 2, shared memory %v, chunk %d",
			rank, info.Hierarchy, info.Hosts, info.SharedMemory, info.HierarchyChunk, layout, !alone, wantChunk)
	}
	shared := allocFrom(newPool(t, comm.HostSourceOf(c)))
	for _, a := range []struct {
		name  string
		alloc func(testing.TB, int, comm.DType) comm.Buffer
	}{{"other", alloc}, {"shared", shared}} {
		t.Run(a.name, func(t *testing.T) {
			t.Run("AllReduce", func(t *testing.T) { testAllReduceWith(t, c, a.alloc) })
			t.Run("Broadcast", func(t *testing.T) { testBroadcastWith(t, c, a.alloc) })
			t.Run("Reduce", func(t *testing.T) { testReduceWith(t, c, a.alloc) })
			t.Run("AllGather", func(t *testing.T) { testAllGatherWith(t, c, a.alloc) })
			t.Run("ReduceScatter", func(t *testing.T) { testReduceScatterWith(t, c, a.alloc) })
		})
	}
	t.Run("SendRecv", func(t *testing.T) { testSendRecv(t, c) })
	t.Run("Barrier", func(t *testing.T) { testutil.MustWaitAll(t, c.Barrier(), c.Barrier()) })
	// Random float32 sums: every rank gets the same bits (each element is
	// computed once, by its shard's cross-host all-reduce), within the
	// bound of comm/hier of the exact sum.
	const n = 1<<18 + 7
	b := shared(t, n, comm.Float32)
	gather := shared(t, n*c.Size(), comm.Float32)
	exact := make([]float64, n)
	abs := make([]float64, n)
	for q := range c.Size() {
		rng := rand.New(rand.NewPCG(uint64(q)+1, 3))
		for i := range n {
			v := float32(math.Ldexp(rng.Float64()-0.5, rng.IntN(30)-10))
			if q == c.Rank() {
				b.AsFloat32()[i] = v
			}
			exact[i] += float64(v)
			abs[i] += math.Abs(float64(v))
		}
	}
	testutil.MustWaitAll(t, c.AllReduce(b, b, comm.Sum))
	testutil.MustWaitAll(t, c.AllGather(b, gather))
	g := gather.AsFloat32()
	gamma := float64(c.Size()-1) * 0x1p-24 / (1 - float64(c.Size()-1)*0x1p-24)
	for i, v := range b.AsFloat32() {
		for q := range c.Size() {
			if math.Float32bits(g[q*n+i]) != math.Float32bits(v) {
				t.Fatalf("rank %d: element %d is %v here, %v on rank %d", c.Rank(), i, v, g[q*n+i], q)
			}
		}
		if d := math.Abs(float64(v) - exact[i]); d > gamma*abs[i]+0x1p-149 {
			t.Fatalf("rank %d: element %d is %v, %v from the exact sum %v; the bound is %v", c.Rank(), i, v, d, exact[i], gamma*abs[i])
		}
	}
}
