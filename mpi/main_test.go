//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/mpitest"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/mpi"
)

// The tests are SPMD: under mpirun every rank runs them all, and every
// rank issues the same collectives in the same order. Run outside mpirun,
// the binary is a 1-rank world (MPI's singleton start-up), and
// TestUnderMpirun starts the same binary under mpirun with more ranks.

// TestMain ends MPI through launch.Finalize, as a program that reaches the
// backend only through launch.Open does: without MPI_Finalize, mpirun
// fails the jobs of TestUnderMpirun.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := launch.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "launch.Finalize:", err)
		code = 1
	}
	os.Exit(code)
}

// underMpirun reports whether this process is one rank of an mpirun job.
func underMpirun() bool { return os.Getenv("OMPI_COMM_WORLD_SIZE") != "" }

// TestUnderMpirun runs this test binary under mpirun with the rank counts
// of DDPGO_MPI_NP (default "2,3"), so that a plain go test covers several
// ranks. It is skipped inside such a job, with -short, or without mpirun.
func TestUnderMpirun(t *testing.T) {
	if underMpirun() {
		t.Skip("already a rank of an mpirun job")
	}
	if testing.Short() {
		t.Skip("-short: the multi-rank runs under mpirun are skipped")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun not found (Debian: apt-get install openmpi-bin); only the 1-rank tests ran")
	}
	nps := os.Getenv("DDPGO_MPI_NP")
	if nps == "" {
		nps = "2,3"
	}
	for _, np := range strings.Split(nps, ",") {
		t.Run(np+"ranks", func(t *testing.T) {
			n, err := strconv.Atoi(np)
			if err != nil {
				t.Fatalf("DDPGO_MPI_NP=%s: %v", nps, err)
			}
			args := mpitest.Args(n, mpitest.SharedMemory)
			args = append(args, os.Args[0], "-test.timeout=15m")
			for _, a := range os.Args[1:] {
				// Keep the caller's -run, -v and friends, not its coverage or
				// profile outputs, which the ranks would overwrite.
				if strings.HasPrefix(a, "-test.run") || strings.HasPrefix(a, "-test.v") || strings.HasPrefix(a, "-test.count") || strings.HasPrefix(a, "-test.short") {
					args = append(args, a)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, mpirun, args...)
			cmd.Env = childEnv()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("mpirun -np %s %s: %v\n%s", np, os.Args[0], err, out)
			}
			if testing.Verbose() {
				t.Logf("mpirun -np %s:\n%s", np, out)
			}
		})
	}
}

// childEnv is the environment without what a singleton MPI start-up of
// this process may have added, which would confuse the job's ranks.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OMPI_") || strings.HasPrefix(kv, "PMIX_") || strings.HasPrefix(kv, "OPAL_") || strings.HasPrefix(kv, "ORTE_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// open returns a new communicator, closed when the test ends.
func open(t testing.TB, o mpi.Options) comm.Communicator {
	t.Helper()
	c, err := mpi.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// pool is the tests' source of collective memory (the contract's rule:
// never Go-heap memory).
var pool = func() *allocator.Pool {
	p, err := allocator.New(allocator.Options{Limit: 4 << 30})
	if err != nil {
		panic(err)
	}
	return p
}()

// alloc returns a pool buffer of count elements of dt, returned to the
// pool when the test ends.
func alloc(t testing.TB, count int, dt comm.DType) comm.Buffer {
	t.Helper()
	return allocFrom(pool)(t, count, dt)
}

// childJob runs this test binary's TestChild under mpirun with np ranks
// (or, with np 0, as a single process without mpirun) in the role given by
// DDPGO_MPI_CHILD, and returns its combined output, how long it ran and
// its error.
func childJob(t *testing.T, np int, role string) ([]byte, time.Duration, error) {
	t.Helper()
	return childJobArgs(t, np, role, mpitest.Args(np, mpitest.SharedMemory))
}

// childJobArgs is childJob with the mpirun options given (np > 0).
func childJobArgs(t *testing.T, np int, role string, mpirunOpts []string) ([]byte, time.Duration, error) {
	t.Helper()
	if underMpirun() {
		t.Skip("starts jobs of its own; run outside mpirun")
	}
	name, args := os.Args[0], []string{"-test.run=^TestChild$", "-test.v"}
	if np > 0 {
		mpirun, err := exec.LookPath("mpirun")
		if err != nil {
			t.Skip("mpirun not found (Debian: apt-get install openmpi-bin)")
		}
		name, args = mpirun, append(append(append([]string(nil), mpirunOpts...), "-x", "DDPGO_MPI_CHILD", os.Args[0]), args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(childEnv(), "DDPGO_MPI_CHILD="+role)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	return out, time.Since(t0), err
}

// TestChild is the body of the jobs that childJob starts; it is skipped
// otherwise.
func TestChild(t *testing.T) {
	role := os.Getenv("DDPGO_MPI_CHILD")
	if f, ok := strings.CutPrefix(role, "fault:"); ok {
		name, dir, _ := strings.Cut(f, ":")
		faultChild(t, name, dir)
		return
	}
	switch role {
	case "":
		t.Skip("runs only in a job started by another test")
	case "abort":
		// The last rank aborts while the others wait in a collective it
		// never joins.
		c := open(t, mpi.Options{AbortCode: 7})
		b := alloc(t, 100, comm.Float32)
		if c.Rank() == c.Size()-1 {
			time.Sleep(100 * time.Millisecond)
			c.Abort(errors.New("injected failure"))
			fmt.Println("CHILD: Abort returned")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := c.AllReduce(b, b, comm.Sum).Wait(ctx)
		fmt.Printf("CHILD: rank %d survived the abort: %v\n", c.Rank(), err)
	case "timeout":
		// Rank 0 waits in a collective that the others never join; its
		// watchdog reports the stall, then ends the job at the timeout.
		// Blocking, so that the owner is held in MPI_Allreduce and the
		// watchdog must call MPI_Abort itself.
		c := open(t, mpi.Options{Blocking: true, Timeout: time.Second, StallInterval: 200 * time.Millisecond, OnStall: func(s comm.Stall) {
			fmt.Printf("CHILD: stall reported: rank %d, %s #%d, waited %v\n", s.Rank, s.Kind, s.Seq, s.Waited.Round(time.Millisecond))
		}})
		b := alloc(t, 100, comm.Float32)
		if c.Rank() != 0 {
			time.Sleep(30 * time.Second)
			fmt.Printf("CHILD: rank %d outlived the timeout\n", c.Rank())
			return
		}
		err := c.AllReduce(b, b, comm.Sum).Wait(context.Background())
		fmt.Printf("CHILD: rank 0's collective completed: %v\n", err)
	case "die":
		// The last rank dies (SIGKILL) while the others wait in a
		// collective it never joins.
		c := open(t, mpi.Options{})
		b := alloc(t, 100, comm.Float32)
		if c.Rank() == c.Size()-1 {
			time.Sleep(100 * time.Millisecond)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := c.AllReduce(b, b, comm.Sum).Wait(ctx)
		fmt.Printf("CHILD: rank %d survived its peer's death: %v\n", c.Rank(), err)
	case "tcp":
		// Two ranks over Open MPI's TCP transport (on loopback): what
		// the backend did to the transport's settings (the test checks
		// them against what mpirun was given), then a large all-reduce, in
		// blocking mode as ddp runs it, checked element by element.
		c := open(t, mpi.Options{Blocking: true})
		i := mpi.LibraryInfo()
		if i.TCPFlags < 0 || i.TCPEagerLimit < 0 {
			t.Fatalf("rank %d: MPI does not expose btl_tcp_flags (%d) or btl_tcp_eager_limit (%d)", c.Rank(), i.TCPFlags, i.TCPEagerLimit)
		}
		fmt.Printf("CHILD: rank %d: tuned %v, put %v, eager %d;\n", c.Rank(), i.TCPTuned, i.TCPFlags&mpi.TCPFlagPut != 0, i.TCPEagerLimit)
		const n = 3<<20 + 5 // 12 MiB and a bit: the TCP transport's large-message path
		b := alloc(t, n, comm.Float32)
		v := unsafe.Slice((*float32)(b.Addr), n)
		for k := range v {
			v[k] = float32(c.Rank()+1) * float32(k%1000)
		}
		for range 3 {
			if err := c.AllReduce(b, b, comm.Sum).Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		// The first pass sums the ranks' factors; each later one
		// multiplies the now equal contributions by the rank count.
		f := float32(c.Size()*(c.Size()+1)/2) * float32(c.Size()*c.Size())
		for k := range v {
			if want := float32(k%1000) * f; v[k] != want {
				t.Fatalf("rank %d: element %d is %v; want %v", c.Rank(), k, v[k], want)
			}
		}
		fmt.Printf("CHILD: rank %d: all-reduce over tcp ok\n", c.Rank())
	case "hosts":
		// Ranks on the hosts DDPGO_MPI_HOST names: blocking all-reduces
		// large and small, interleaved (those of 1 MiB and more on the
		// second communicator where the ranks span hosts), each checked
		// element by element; then a second communicator after the first
		// is closed, which must choose the same.
		rank := -1
		for round := range 2 {
			c, err := mpi.Open(mpi.Options{Blocking: true})
			if err != nil {
				t.Fatal(err)
			}
			rank = c.Rank()
			wantRSB, _ := strconv.Atoi(os.Getenv("OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm")) // the user's, or 0
			if alg, seg, rsb, err := mpi.ForcedAllReduce(); err != nil || alg != 0 || seg != 0 || rsb != wantRSB {
				t.Fatalf("rank %d: after Open, Open MPI's all-reduce algorithm is %d, segment size %d, reduce-scatter algorithm %d (%v); want 0, 0 and %d again", c.Rank(), alg, seg, rsb, err, wantRSB)
			}
			i := mpi.LibraryInfo()
			ring := i.LargeAllReduce != ""
			fmt.Printf("CHILD: rank %d: round %d: hosts %d; ring %v; (%s)\n", c.Rank(), round, i.Hosts, ring, i.LargeAllReduce)
			for _, n := range []int{1 << 20, 1000, 1<<18 + 3, 1 << 18, 1<<18 - 1, 7} { // 4 MiB, 4 KB, just over 1 MiB, 1 MiB, just under, 28 B
				b := alloc(t, n, comm.Float32)
				v := unsafe.Slice((*float32)(b.Addr), n)
				for k := range v {
					v[k] = float32(c.Rank()+1) * float32(k%777)
				}
				before := mpi.LargeOps(c)
				if err := c.AllReduce(b, b, comm.Sum).Wait(context.Background()); err != nil {
					t.Fatal(err)
				}
				want := uint64(0)
				if ring && n*4 >= 1<<20 {
					want = 1
				}
				if got := mpi.LargeOps(c) - before; got != want {
					t.Fatalf("rank %d: a %d-byte all-reduce ran %d times on the second communicator, want %d (ring %v)", c.Rank(), n*4, got, want, ring)
				}
				f := float32(c.Size() * (c.Size() + 1) / 2)
				for k := range v {
					if want := float32(k%777) * f; v[k] != want {
						t.Fatalf("rank %d: %d elements: element %d is %v; want %v", c.Rank(), n, k, v[k], want)
					}
				}
			}
			// Reduce-scatters: those whose input (every rank's block) is
			// 1 MiB or more on the second communicator too.
			for _, n := range []int{1 << 18, 1<<17 + 5, 1000, 3} {
				p := c.Size()
				send, recv := alloc(t, n*p, comm.Float32), alloc(t, n, comm.Float32)
				sv := unsafe.Slice((*float32)(send.Addr), n*p)
				for k := range sv {
					sv[k] = float32(c.Rank()+1) * float32(k%777)
				}
				before := mpi.LargeOps(c)
				if err := c.ReduceScatter(send, recv, comm.Sum).Wait(context.Background()); err != nil {
					t.Fatal(err)
				}
				want := uint64(0)
				if ring && n*p*4 >= 1<<20 {
					want = 1
				}
				if got := mpi.LargeOps(c) - before; got != want {
					t.Fatalf("rank %d: a reduce-scatter of %d-byte blocks ran %d times on the second communicator, want %d (ring %v)", c.Rank(), n*4, got, want, ring)
				}
				f := float32(p * (p + 1) / 2)
				for k, v := range unsafe.Slice((*float32)(recv.Addr), n) {
					if want := float32((c.Rank()*n+k)%777) * f; v != want {
						t.Fatalf("rank %d: reduce-scatter of %d-element blocks: element %d is %v; want %v", c.Rank(), n, k, v, want)
					}
				}
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Printf("CHILD: rank %d: all-reduces and reduce-scatters ok\n", rank)
	default:
		t.Fatalf("unknown DDPGO_MPI_CHILD %q", role)
	}
}

// TestAbort: Abort ends the process (alone) and the whole job (under
// mpirun), promptly, with the code given and the cause on standard error.
func TestAbort(t *testing.T) {
	for _, np := range []int{0, 2} {
		t.Run(fmt.Sprintf("np%d", np), func(t *testing.T) {
			out, took, err := childJob(t, np, "abort")
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("job with an aborting rank: %v; want a non-zero exit\n%s", err, out)
			}
			if np == 0 && ee.ExitCode() != 7 {
				t.Errorf("exit code %d; want Options.AbortCode 7", ee.ExitCode())
			}
			if !strings.Contains(string(out), "aborts the job: injected failure") || strings.Contains(string(out), "CHILD:") {
				t.Errorf("output does not name the cause, or a rank went on:\n%s", out)
			}
			t.Logf("the job ended %v after it started (exit code %d)", took.Round(time.Millisecond), ee.ExitCode())
		})
	}
}

// TestPeerDies documents what Open MPI does when a rank dies: its runtime
// sees the process end and kills every other rank of the job, which
// therefore never sees an error of its own.
func TestPeerDies(t *testing.T) {
	out, took, err := childJob(t, 2, "die")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("job with a rank killed: %v; want a non-zero exit\n%s", err, out)
	}
	if strings.Contains(string(out), "survived") {
		t.Errorf("a rank went on after its peer died:\n%s", out)
	}
	t.Logf("the job ended %v after it started (exit code %d):\n%s", took.Round(time.Millisecond), ee.ExitCode(), out)
}

// TestTimeout: a collective that a peer never joins is reported as a
// stall every StallInterval, and at Options.Timeout the job ends.
func TestTimeout(t *testing.T) {
	out, took, err := childJob(t, 2, "timeout")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("job with a stalled rank: %v; want a non-zero exit\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "CHILD: stall reported: rank 0, all_reduce #1") || !strings.Contains(s, "Options.Timeout") || strings.Contains(s, "outlived") || strings.Contains(s, "completed") {
		t.Errorf("want stall reports, then the timeout ending the job:\n%s", s)
	}
	if took > 25*time.Second {
		t.Errorf("the job took %v to end after a 1s timeout", took)
	}
	t.Logf("the job ended %v after it started", took.Round(time.Millisecond))
}

// TestTCPFlags: the backend takes "put" out of Open MPI's TCP transport
// flags and raises its eager limit, each unless mpirun (or the environment)
// set it, and large all-reduces over TCP are exact either way.
func TestTCPFlags(t *testing.T) {
	skipUnlessOpenMPI4(t)
	tcp := func(extra ...string) []string {
		return append(mpitest.Args(2, mpitest.TCP), extra...)
	}
	for _, c := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"ours", nil, "tuned true, put false, eager 300000;"},
		{"users-flags", []string{"--mca", "btl_tcp_flags", "send,put,inplace,need-ack,need-csum,hetero-rdma"}, "tuned true, put true, eager 300000;"},
		{"users-both", []string{"--mca", "btl_tcp_flags", "send,put,inplace,need-ack,need-csum,hetero-rdma", "--mca", "btl_tcp_eager_limit", "65536"}, "tuned false, put true, eager 65536;"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, _, err := childJobArgs(t, 2, "tcp", tcp(c.extra...))
			if err != nil {
				t.Fatalf("job: %v\n%s", err, out)
			}
			s := string(out)
			if strings.Count(s, "all-reduce over tcp ok") != 2 || strings.Count(s, c.want) != 2 {
				t.Fatalf("want both ranks %s and exact:\n%s", c.want, s)
			}
			t.Logf("\n%s", s)
		})
	}
}

// TestRingBetweenHosts: with ranks on two hosts (named by DDPGO_MPI_HOST),
// a blocking communicator of 2 or 3 ranks runs its large all-reduces on
// the segmented ring, every rank or none
// (DDPGO_MPI_ALLREDUCE=mpi on one rank turns it off for all), and the
// results are exact either way; on one host it stays with Open MPI's
// choice.
func TestRingBetweenHosts(t *testing.T) {
	skipUnlessOpenMPI4(t)
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun not found (Debian: apt-get install openmpi-bin)")
	}
	if underMpirun() {
		t.Skip("starts jobs of its own; run outside mpirun")
	}
	file := filepath.Join(t.TempDir(), "rules")
	if err := os.WriteFile(file, []byte("1\n7\n1\n2\n1\n0 1 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rules := "OMPI_MCA_coll_tuned_dynamic_rules_filename=" + file
	for _, c := range []struct {
		name string
		env  [3]string // each rank's environment, beyond DDPGO_MPI_CHILD ("": no such rank)
		want string    // what every rank says of both of its communicators
	}{
		// 1+2 ranks would be hierarchical: kept flat (DDPGO_MPI_HIER=0 on
		// one rank is every rank's choice), the world is the ring's.
		{"two-hosts", [3]string{"DDPGO_MPI_HOST=a", "DDPGO_MPI_HOST=b DDPGO_MPI_HIER=0", "DDPGO_MPI_HOST=b"}, "hosts 2; ring true;"},
		{"opted-out", [3]string{"DDPGO_MPI_HOST=a", "DDPGO_MPI_HOST=b DDPGO_MPI_ALLREDUCE=mpi DDPGO_MPI_HIER=0", "DDPGO_MPI_HOST=b"}, "hosts 2; ring false;"},
		{"one-host", [3]string{"DDPGO_MPI_HOST=a", "DDPGO_MPI_HOST=a", "DDPGO_MPI_HOST=a"}, "hosts 1; ring false;"},
		{"two-ranks", [3]string{"DDPGO_MPI_HOST=a", "DDPGO_MPI_HOST=b"}, "hosts 2; ring true;"},
		// A rules file is the user's choice (this one sets only Bcast's
		// algorithm, for 2 ranks).
		{"rules-file", [3]string{"DDPGO_MPI_HOST=a " + rules, "DDPGO_MPI_HOST=b " + rules}, "hosts 2; ring false;"},
		// A reduce-scatter algorithm of the user's is left alone, and so
		// are the all-reduce's.
		{"own-reduce-scatter", [3]string{"DDPGO_MPI_HOST=a OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm=1", "DDPGO_MPI_HOST=b OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm=1"}, "hosts 2; ring false;"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := mpitest.Args(1, mpitest.SharedMemory)[2:] // the options, without -np
			ranks := 0
			for r, env := range c.env {
				if env == "" {
					break
				}
				ranks++
				if r > 0 {
					args = append(args, ":")
				}
				args = append(append(args, "-np", "1", "env", "DDPGO_MPI_CHILD=hosts"), strings.Fields(env)...)
				args = append(args, os.Args[0], "-test.run=^TestChild$", "-test.v")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, mpirun, args...)
			cmd.Env = childEnv()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("mpirun %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			s := string(out)
			if strings.Count(s, c.want) != 2*ranks || strings.Count(s, "all-reduces and reduce-scatters ok") != ranks {
				t.Fatalf("want every rank to say %q twice, then ok:\n%s", c.want, s)
			}
		})
	}
}

// skipUnlessOpenMPI4 skips a test of what the backend changes only with
// Open MPI 4, the version it was measured with.
func skipUnlessOpenMPI4(t *testing.T) {
	if lib := mpi.LibraryInfo().Library; !strings.HasPrefix(lib, "Open MPI v4.") {
		t.Skipf("the backend tunes Open MPI 4 only; this is %s", lib)
	}
}
