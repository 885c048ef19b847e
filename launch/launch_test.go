package launch_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/launch"
)

func TestOpenInproc(t *testing.T) {
	cs, err := launch.Open(context.Background(), "inproc", launch.Options{Ranks: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 3 {
		t.Fatalf("%d communicators, want 3", len(cs))
	}
	ws := make([]comm.Work, 3)
	bufs := make([][]float32, 3)
	for r, c := range cs {
		if c.Rank() != r || c.Size() != 3 {
			t.Fatalf("communicator %d: rank %d of %d", r, c.Rank(), c.Size())
		}
		bufs[r] = []float32{float32(r)}
		ws[r] = c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), comm.Sum)
	}
	for r, w := range ws {
		if err := w.Wait(context.Background()); err != nil || bufs[r][0] != 3 {
			t.Errorf("rank %d: %v, %v; want 3", r, err, bufs[r][0])
		}
	}
	for _, c := range cs {
		c.Close()
	}
}

func TestOpenInprocConfig(t *testing.T) {
	cs, err := launch.Open(context.Background(), "inproc", launch.Options{Config: inproc.Options{StallInterval: -1}})
	if !errors.Is(err, comm.ErrInvalid) || cs != nil {
		t.Errorf("inproc with a negative StallInterval: %v; want ErrInvalid from inproc", err)
	}
	_, err = launch.Open(context.Background(), "inproc", launch.Options{Config: 42})
	if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), "int") {
		t.Errorf("inproc with an int Config: %v; want ErrInvalid naming the type", err)
	}
}

func TestOpenUnknown(t *testing.T) {
	_, err := launch.Open(context.Background(), "nccl", launch.Options{})
	if !errors.Is(err, launch.ErrUnknownBackend) || !strings.Contains(err.Error(), `import _ "github.com/ddpgo/ddpgo/nccl"`) || !strings.Contains(err.Error(), "inproc") {
		t.Errorf("Open(nccl) without the package: %v; want ErrUnknownBackend saying what to import and what is registered", err)
	}
}

// fake is a launched backend that records the job it was given.
var fakeJobs = make(chan launch.Job, 1)

func init() {
	launch.Register(launch.Backend{Name: "fake", Launched: true, Open: func(_ context.Context, job launch.Job) ([]comm.Communicator, error) {
		fakeJobs <- job
		return nil, nil
	}})
}

func TestOpenLaunched(t *testing.T) {
	if !slices.Contains(launch.Backends(), "fake") || !slices.Contains(launch.Backends(), "inproc") {
		t.Fatalf("Backends() = %v", launch.Backends())
	}
	env := launch.Env{Launcher: "openmpi", Rank: 1, Size: 2}
	if _, err := launch.Open(context.Background(), "fake", launch.Options{Env: &env, Config: "x"}); err != nil {
		t.Fatal(err)
	}
	if job := <-fakeJobs; job.Env != env || job.Config != "x" {
		t.Errorf("job %+v; want the given Env and Config", job)
	}

	// From the process's environment: torchrun's variables.
	clearLaunchers(t)
	for k, v := range map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"} {
		t.Setenv(k, v)
	}
	if _, err := launch.Open(context.Background(), "fake", launch.Options{}); err != nil {
		t.Fatal(err)
	}
	if job := <-fakeJobs; job.Env.Launcher != "torchrun" || job.Env.Rank != 1 || job.Env.MasterPort != 29500 {
		t.Errorf("job %+v; want torchrun's rank 1 of 2", job)
	}

	// No launcher: the error names the variables.
	clearLaunchers(t)
	_, err := launch.Open(context.Background(), "fake", launch.Options{})
	if !errors.Is(err, launch.ErrEnv) || !strings.Contains(err.Error(), "OMPI_COMM_WORLD_RANK") || !strings.Contains(err.Error(), "backend fake") {
		t.Errorf("Open without a launcher: %v; want ErrEnv naming the variables and the backend", err)
	}
}

// clearLaunchers unsets every launcher variable for the rest of the test.
func clearLaunchers(t *testing.T) {
	for _, k := range []string{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

func TestRegisterTwice(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a second Register of inproc did not panic")
		}
	}()
	launch.Register(launch.Backend{Name: "inproc", Open: func(context.Context, launch.Job) ([]comm.Communicator, error) { return nil, nil }})
}

func TestBootstrapNone(t *testing.T) {
	_, err := launch.NewBootstrap(context.Background(), launch.Env{Launcher: "torchrun", Size: 2, MasterAddr: "h", MasterPort: 1})
	if !errors.Is(err, launch.ErrNoBootstrap) || !strings.Contains(err.Error(), "MASTER_ADDR") {
		t.Errorf("NewBootstrap under torchrun: %v; want ErrNoBootstrap pointing at MASTER_ADDR", err)
	}
	_, err = launch.NewBootstrap(context.Background(), launch.Env{Launcher: "openmpi", Size: 2})
	if !errors.Is(err, launch.ErrNoBootstrap) || !strings.Contains(err.Error(), "mpi") {
		t.Errorf("NewBootstrap under mpirun without package mpi: %v; want ErrNoBootstrap saying to link mpi", err)
	}
}

// TestOpenChecked: DDPGO_DISTRIBUTED_DEBUG=DETAIL wraps every communicator
// Open returns with package checked, whose exchange of fingerprints fails
// a mismatched collective on every rank before the backend sees it.
func TestOpenChecked(t *testing.T) {
	t.Setenv("DDPGO_DISTRIBUTED_DEBUG", "detail")
	cs, err := launch.Open(context.Background(), "inproc", launch.Options{Ranks: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for r, c := range cs {
		if _, plain := c.(*inproc.Comm); plain {
			t.Fatalf("rank %d: Open returned the bare inproc communicator under DDPGO_DISTRIBUTED_DEBUG=detail", r)
		}
	}
	a, b := make([]float32, 4), make([]float32, 5)
	ws := []comm.Work{
		cs[0].AllReduce(comm.Float32s(a), comm.Float32s(a), comm.Sum),
		cs[1].AllReduce(comm.Float32s(b), comm.Float32s(b), comm.Sum),
	}
	for r, w := range ws {
		if err := w.Wait(context.Background()); !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: all_reduce of 4 against 5 elements: %v; want ErrMismatch", r, err)
		}
	}
}

// either is a backend that runs under a launcher or in this process.
var eitherJobs = make(chan launch.Job, 1)

func init() {
	launch.Register(launch.Backend{Name: "either", Launched: true, InProcess: true, Open: func(_ context.Context, job launch.Job) ([]comm.Communicator, error) {
		eitherJobs <- job
		return nil, nil
	}})
}

// TestOpenEither: an InProcess backend is launched when a launcher started
// the process (or Options.Env says so), runs Options.Ranks ranks when no
// launcher did, and fails on a broken launcher environment.
func TestOpenEither(t *testing.T) {
	ctx := context.Background()
	clearLaunchers(t)
	if _, err := launch.Open(ctx, "either", launch.Options{Ranks: 3}); err != nil {
		t.Fatal(err)
	}
	if job := <-eitherJobs; job.Launched || job.Ranks != 3 {
		t.Errorf("no launcher: job %+v; want 3 ranks in process", job)
	}

	env := launch.Env{Launcher: "openmpi", Rank: 1, Size: 2}
	if _, err := launch.Open(ctx, "either", launch.Options{Env: &env}); err != nil {
		t.Fatal(err)
	}
	if job := <-eitherJobs; !job.Launched || job.Env != env {
		t.Errorf("Options.Env: job %+v; want launched with the given Env", job)
	}

	for k, v := range map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"} {
		t.Setenv(k, v)
	}
	if _, err := launch.Open(ctx, "either", launch.Options{}); err != nil {
		t.Fatal(err)
	}
	if job := <-eitherJobs; !job.Launched || job.Env.Launcher != "torchrun" || job.Env.Size != 2 {
		t.Errorf("torchrun's variables: job %+v; want launched, rank 0 of 2", job)
	}
	if _, err := launch.Open(ctx, "either", launch.Options{Ranks: 2}); !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), "one rank") {
		t.Errorf("Ranks 2 under torchrun: %v; want ErrInvalid", err)
	}

	os.Unsetenv("MASTER_PORT")
	if _, err := launch.Open(ctx, "either", launch.Options{Ranks: 2}); !errors.Is(err, launch.ErrEnv) || !strings.Contains(err.Error(), "MASTER_PORT") {
		t.Errorf("a half-set torchrun environment: %v; want ErrEnv, not a silent in-process job", err)
	}
}

// TestRegistered: the registry is the one description of each backend,
// sorted by name, and Lookup finds what Register put there.
func TestRegistered(t *testing.T) {
	launch.Register(launch.Backend{Name: "zz-described", Launched: true, DeviceMemory: true, About: "a test backend",
		NotBuilt: "not in this binary", Open: func(context.Context, launch.Job) ([]comm.Communicator, error) { return nil, nil }})
	bs := launch.Registered()
	if !slices.IsSortedFunc(bs, func(a, b launch.Backend) int { return strings.Compare(a.Name, b.Name) }) {
		t.Errorf("Registered is not sorted by name: %v", launch.Backends())
	}
	in, ok := launch.Lookup("inproc")
	if !ok || !in.SharedMemory || in.Launched || in.DeviceMemory || in.NotBuilt != "" || in.About == "" {
		t.Errorf("inproc: %+v, %v; want an in-process, shared-memory backend that is built and says how its ranks talk", in, ok)
	}
	d, ok := launch.Lookup("zz-described")
	if !ok || !d.DeviceMemory || d.About != "a test backend" || d.NotBuilt != "not in this binary" {
		t.Errorf("zz-described: %+v, %v; want the fields it registered", d, ok)
	}
	if i := slices.IndexFunc(bs, func(b launch.Backend) bool { return b.Name == "zz-described" }); i != len(bs)-1 {
		t.Errorf("zz-described at %d of %d in Registered", i, len(bs))
	}
	if _, ok := launch.Lookup("no-such-backend"); ok {
		t.Error("Lookup found a backend nobody registered")
	}
}

// Finalize calls every registered backend's Finalize, each time it is
// called, and joins their errors naming the backend.
func TestFinalize(t *testing.T) {
	finalizeRuns++ // names of this run's own: Register refuses a name twice
	a, b := fmt.Sprintf("finalize-a%d", finalizeRuns), fmt.Sprintf("finalize-b%d", finalizeRuns)
	calls := map[string]int{}
	fail := errors.New("finalize failed")
	for _, name := range []string{a, b} {
		launch.Register(launch.Backend{Name: name, Open: func(context.Context, launch.Job) ([]comm.Communicator, error) { return nil, nil },
			Finalize: func() error {
				calls[name]++
				if name == b {
					return fail
				}
				return nil
			}})
	}
	err := launch.Finalize()
	if !errors.Is(err, fail) || !strings.Contains(err.Error(), "backend "+b+":") || strings.Contains(err.Error(), a) {
		t.Errorf("Finalize: %v; want %s's error, naming it", err, b)
	}
	launch.Finalize()
	if calls[a] != 2 || calls[b] != 2 {
		t.Errorf("backends' Finalize called %v times; want 2 each", calls)
	}
}

var finalizeRuns int
