package launch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
)

// Backend is a communicator implementation that Open can start.
type Backend struct {
	// Name is what Open's backend argument calls it ("inproc", "mpi").
	Name string
	// Launched backends run one rank per process: Open gives them the
	// launcher's environment in Job.Env (FromEnv, or Options.Env).
	Launched bool
	// InProcess, on a Launched backend, lets it run either way (nccl):
	// one rank per process when Options.Env is given or a launcher
	// started this process, and otherwise, when FromEnv finds no launcher
	// at all (ErrNoLauncher), Options.Ranks ranks in this process.
	// Job.Launched tells the backend which.
	InProcess bool
	// DeviceMemory: the backend's collectives run on device memory (each
	// rank's communicator supplies it), never staged through the host.
	DeviceMemory bool
	// SharedMemory: the ranks are goroutines of one process and a
	// collective moves no bytes over any wire, so compressing only costs.
	SharedMemory bool
	// About says in a few words how the ranks talk, for listings.
	About string
	// NotBuilt, if not empty, says why this binary cannot run the
	// backend and how to build one that can (package mpi without its
	// build tag); Open then fails with the backend's own error.
	NotBuilt string
	// Open starts the backend for job and returns this process's
	// communicators: one for a launched backend, Job.Ranks otherwise.
	Open func(ctx context.Context, job Job) ([]comm.Communicator, error)
	// Finalize, if not nil, ends the backend in this process once its
	// collectives are done, and is idempotent: mpi's closes its
	// communicators and calls MPI_Finalize, which every process of an MPI
	// job must call before it exits. The package's Finalize calls it.
	Finalize func() error
}

// Job is what Open hands a backend.
type Job struct {
	// Launched: the job runs one rank per process and Env is the
	// launcher's; always so for a Launched backend that is not InProcess.
	Launched bool
	// Env is the launcher's environment (launched jobs only).
	Env Env
	// Ranks is the number of ranks to start in this process (backends
	// that are not launched, such as inproc).
	Ranks int
	// Config is Options.Config: the backend's own options, or nil.
	Config any
}

// Options configures Open.
type Options struct {
	// Ranks is the number of in-process ranks of a backend that is not
	// launched (inproc), or of an InProcess backend that no launcher
	// started (nccl); 0 means 1.
	Ranks int
	// Env overrides the launcher's environment for a launched backend;
	// nil means FromEnv().
	Env *Env
	// Config is passed to the backend as Job.Config: for example an
	// mpi.Options value. Nil means the backend's defaults.
	Config any
}

var (
	regMu    sync.Mutex
	registry = map[string]Backend{}
)

// ErrUnknownBackend is returned by Open for a backend that no package has
// registered.
var ErrUnknownBackend = errors.New("launch: unknown backend")

// Register makes a backend available to Open. Backends register
// themselves from their package's init, so a program links only the ones
// it imports (a blank import is enough: _ "github.com/ddpgo/ddpgo/mpi").
// Register panics if the name is empty, Open is nil, or the name is taken.
func Register(b Backend) {
	regMu.Lock()
	defer regMu.Unlock()
	switch {
	case b.Name == "" || b.Open == nil:
		panic("launch: Register of a backend without a name or an Open function")
	case registry[b.Name].Open != nil:
		panic("launch: Register called twice for backend " + b.Name)
	}
	registry[b.Name] = b
}

// Backends returns the names of the registered backends, sorted.
func Backends() []string {
	var names []string
	for _, b := range Registered() {
		names = append(names, b.Name)
	}
	return names
}

// Registered returns the registered backends, sorted by name: the one
// description of each that programs list (ddpbench info, --backend).
func Registered() []Backend {
	regMu.Lock()
	defer regMu.Unlock()
	bs := make([]Backend, 0, len(registry))
	for _, b := range registry {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, func(a, b Backend) int { return strings.Compare(a.Name, b.Name) })
	return bs
}

// Lookup returns the backend registered under name.
func Lookup(name string) (Backend, bool) {
	regMu.Lock()
	defer regMu.Unlock()
	b, ok := registry[name]
	return b, ok
}

// Open starts the named backend and returns this process's communicators:
// Options.Ranks of them for inproc, one for a launched backend (mpi),
// whose rank and size come from the launcher's environment, and either
// for an InProcess one (nccl), as a launcher started this process or not. With
// DDPGO_DISTRIBUTED_DEBUG=DETAIL in the environment, each is wrapped by
// package checked, so that ranks whose calls disagree fail naming each
// other (PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL).
func Open(ctx context.Context, backend string, o Options) ([]comm.Communicator, error) {
	b, ok := Lookup(backend)
	if !ok {
		hint := ""
		switch backend {
		case "mpi", "nccl":
			hint = fmt.Sprintf(" (import _ \"github.com/ddpgo/ddpgo/%s\" to register it)", backend)
		}
		return nil, fmt.Errorf("%w %q%s; registered: %s", ErrUnknownBackend, backend, hint, strings.Join(Backends(), ", "))
	}
	job := Job{Ranks: max(o.Ranks, 1), Config: o.Config}
	if b.Launched {
		env, err := Env{}, error(nil)
		if o.Env != nil {
			env = *o.Env
		} else {
			env, err = FromEnv()
		}
		switch {
		case err == nil:
			job.Env, job.Launched = env, true
			if b.InProcess && o.Ranks > 1 {
				return nil, fmt.Errorf("%w: backend %s: Options.Ranks %d, but a launcher started this process (%s), which runs one rank",
					comm.ErrInvalid, backend, o.Ranks, env)
			}
		case b.InProcess && errors.Is(err, ErrNoLauncher):
			// No launcher: Ranks ranks in this process.
		case b.InProcess:
			return nil, fmt.Errorf("launch: backend %s: %w", backend, err)
		default:
			return nil, fmt.Errorf("launch: backend %s runs one rank per process: %w", backend, err)
		}
	}
	cs, err := b.Open(ctx, job)
	if err != nil {
		return nil, fmt.Errorf("launch: opening backend %s: %w", backend, err)
	}
	return detailed(backend, cs)
}

// Finalize ends every registered backend that has a Finalize function, at
// the end of a program: mpi's closes its communicators and calls
// MPI_Finalize, which every process of an MPI job must call before it
// exits (mpirun counts an exit without it as a failure), whether the
// program opened MPI through Open or NCCL's bootstrap did. A program that
// reaches its backend only through Open and a blank import defers it
// before Open, so that it runs on every path out, Open's failures included
// (a failed Open may have initialised MPI), and last: deferred calls run
// last in, first out, so a Reducer closed by a later defer is closed
// first.
//
//	defer launch.Finalize()
//	cs, err := launch.Open(ctx, "mpi", launch.Options{})
//	if err != nil {
//		return err
//	}
//
// A backend that was never opened has nothing to end. Communicators of a
// backend without a Finalize (inproc) are left to their own Close. A
// backend may refuse to open after its Finalize, opened before or not (MPI
// cannot be initialised twice in a process). Finalize returns the
// backends' errors joined, and, as theirs, calling it again does nothing
// more.
func Finalize() error {
	var errs []error
	for _, b := range Registered() {
		if b.Finalize == nil {
			continue
		}
		if err := b.Finalize(); err != nil {
			errs = append(errs, fmt.Errorf("launch: finalizing backend %s: %w", b.Name, err))
		}
	}
	return errors.Join(errs...)
}
