//go:build cgo

package nccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/launch"
)

// jobOptions loads the stand-in, with short deadlines.
func jobOptions() JobOptions {
	return JobOptions{Libraries: Libraries{NCCL: si.NCCL, CUDA: si.CUDA}, Config: Config{Timeout: 20 * time.Second, PollInterval: time.Millisecond}}
}

// noLauncher unsets every launcher's variables for the rest of the test.
func noLauncher(t *testing.T) {
	for _, k := range []string{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE",
		"SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

// allReduceRanks all-reduces rank+1 over cs (one goroutine each) and
// checks the sum.
func allReduceRanks(t *testing.T, cs []comm.Communicator) {
	t.Helper()
	n := cs[0].Size()
	bufs := make([][]float32, len(cs))
	ws := make([]comm.Work, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		bufs[i] = []float32{float32(c.Rank() + 1), 1}
		wg.Go(func() { ws[i] = c.AllReduce(comm.Float32s(bufs[i]), comm.Float32s(bufs[i]), comm.Sum) })
	}
	wg.Wait()
	waitOK(t, ws...)
	for i := range cs {
		if want := float32(n * (n + 1) / 2); bufs[i][0] != want || bufs[i][1] != float32(n) {
			t.Errorf("rank %d: %v, want [%v %d]", cs[i].Rank(), bufs[i], want, n)
		}
	}
}

// TestLaunchInProcess: without a launcher, launch.Open("nccl") makes
// Options.Ranks communicators in this process, rank r on device r.
func TestLaunchInProcess(t *testing.T) {
	standInOnly(t)
	noLauncher(t)
	cs, err := launch.Open(context.Background(), "nccl", launch.Options{Ranks: 3, Config: jobOptions()})
	if err != nil {
		t.Fatal(err)
	}
	defer closeComms(t, cs)
	if len(cs) != 3 {
		t.Fatalf("%d communicators, want 3", len(cs))
	}
	for r, c := range cs {
		nc := c.(*Comm)
		if nc.Rank() != r || nc.Size() != 3 || nc.Device() != r || nc.Library().StandIn() == "" {
			t.Errorf("communicator %d: rank %d of %d on device %d, stand-in %q", r, nc.Rank(), nc.Size(), nc.Device(), nc.Library().StandIn())
		}
	}
	allReduceRanks(t, cs)

	o := jobOptions()
	o.Devices = []int{3, 2}
	two, err := launch.Open(context.Background(), "nccl", launch.Options{Ranks: 2, Config: o})
	if err != nil {
		t.Fatal(err)
	}
	defer closeComms(t, two)
	if d0, d1 := two[0].(*Comm).Device(), two[1].(*Comm).Device(); d0 != 3 || d1 != 2 {
		t.Errorf("Devices [3 2]: ranks on devices %d and %d", d0, d1)
	}

	_, err = launch.Open(context.Background(), "nccl", launch.Options{Ranks: 5, Config: jobOptions()})
	if err == nil || !strings.Contains(err.Error(), "device 4 does not exist") || !strings.Contains(err.Error(), "5 ranks need 5 devices") {
		t.Errorf("5 ranks on the stand-in's 4 devices: %v; want an error naming the missing device", err)
	}
}

// TestLaunchTorchrun: two ranks, each with the environment torchrun would
// give its process (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT), meet at a rendezvous store on loopback that rank 0 serves,
// and make one communicator each on the device of their local rank.
func TestLaunchTorchrun(t *testing.T) {
	standInOnly(t)
	testutil.NoLeak(t)
	port := freePort(t)
	const n = 2
	cs := make([]comm.Communicator, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		vars := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": strconv.Itoa(n), "LOCAL_RANK": strconv.Itoa(r),
			"LOCAL_WORLD_SIZE": strconv.Itoa(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(port)}
		env, err := launch.Parse(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var got []comm.Communicator
			got, errs[r] = launch.Open(ctx, "nccl", launch.Options{Env: &env, Config: jobOptions()})
			if errs[r] == nil && len(got) != 1 {
				errs[r] = fmt.Errorf("%d communicators, want 1", len(got))
			}
			if errs[r] == nil {
				cs[r] = got[0]
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer closeComms(t, cs)
	for r, c := range cs {
		if c.Rank() != r || c.Size() != n || c.(*Comm).Device() != r {
			t.Errorf("rank %d: rank %d of %d on device %d", r, c.Rank(), c.Size(), c.(*Comm).Device())
		}
	}
	allReduceRanks(t, cs)
}

// TestLaunchErrors: what goes wrong says what to do.
func TestLaunchErrors(t *testing.T) {
	standInOnly(t)
	noLauncher(t)
	ctx := context.Background()

	o := jobOptions()
	o.Libraries.NCCL = "/nonexistent/lib/libnccl.so.2"
	_, err := launch.Open(ctx, "nccl", launch.Options{Ranks: 2, Config: o})
	for _, want := range []string{"backend nccl", "/nonexistent/lib/libnccl.so.2", "install NCCL", "nvidia-nccl-cu12", EnvNCCL} {
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), want) {
			t.Errorf("no NCCL: %v; want ErrNotFound saying %q", err, want)
		}
	}

	// mpirun's variables, no MPI bootstrap linked, no MASTER_ADDR.
	env := launch.Env{Launcher: "openmpi", Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2}
	_, err = launch.Open(ctx, "nccl", launch.Options{Env: &env, Config: jobOptions()})
	if !errors.Is(err, launch.ErrNoBootstrap) || !strings.Contains(err.Error(), "MASTER_ADDR and MASTER_PORT") {
		t.Errorf("under mpirun without MPI or MASTER_ADDR: %v; want ErrNoBootstrap saying to set MASTER_ADDR and MASTER_PORT", err)
	}

	// A launcher's process runs one rank.
	env = launch.Env{Launcher: "torchrun", Rank: 0, Size: 2, MasterAddr: "127.0.0.1", MasterPort: 1}
	_, err = launch.Open(ctx, "nccl", launch.Options{Env: &env, Ranks: 2, Config: jobOptions()})
	if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), "one rank") {
		t.Errorf("Ranks 2 under torchrun: %v; want ErrInvalid", err)
	}

	_, err = launch.Open(ctx, "nccl", launch.Options{Config: Config{}})
	if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), "nccl.JobOptions") {
		t.Errorf("a Config as Config: %v; want ErrInvalid naming JobOptions", err)
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func closeComms(t *testing.T, cs []comm.Communicator) {
	for _, c := range cs {
		if c == nil {
			continue
		}
		if err := c.Close(); err != nil {
			t.Errorf("rank %d: Close: %v", c.Rank(), err)
		}
	}
}
