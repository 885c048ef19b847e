package launch

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Bootstrap carries the few bytes that a backend's processes must share
// before the backend's own communicator exists: NCCL's unique id, made by
// rank 0 and needed by every rank to create the communicator.
type Bootstrap interface {
	// Broadcast returns root's data on every rank; the data other ranks
	// pass is ignored. It is collective: every rank calls it.
	Broadcast(ctx context.Context, data []byte, root int) ([]byte, error)
	// Close releases the bootstrap. It is idempotent.
	Close() error
}

// ErrNoBootstrap is returned by NewBootstrap where no registered
// bootstrap serves the job: the backend then meets its peers on its own,
// at Env.MasterAddr:Env.MasterPort (torchrun's convention).
var ErrNoBootstrap = errors.New("launch: no bootstrap for this job")

var (
	bootMu     sync.Mutex
	bootstraps = map[string]func(ctx context.Context, env Env) (Bootstrap, error){}
)

// RegisterBootstrap makes a bootstrap available to NewBootstrap under
// name; package mpi registers "mpi". It panics if name is taken.
func RegisterBootstrap(name string, open func(ctx context.Context, env Env) (Bootstrap, error)) {
	bootMu.Lock()
	defer bootMu.Unlock()
	if bootstraps[name] != nil || open == nil {
		panic("launch: RegisterBootstrap called twice, or with nil, for " + name)
	}
	bootstraps[name] = open
}

// NewBootstrap returns a bootstrap for the job env describes: over MPI
// when the job was started by an MPI launcher (mpirun, mpiexec, or srun
// for MPI) and package mpi is registered and built. Otherwise it returns
// an error wrapping ErrNoBootstrap that says why.
func NewBootstrap(ctx context.Context, env Env) (Bootstrap, error) {
	if env.Launcher == "torchrun" {
		return nil, fmt.Errorf("%w: torchrun started the job; meet at MASTER_ADDR:MASTER_PORT", ErrNoBootstrap)
	}
	bootMu.Lock()
	open := bootstraps["mpi"]
	bootMu.Unlock()
	if open == nil {
		return nil, fmt.Errorf("%w: %s started the job but package mpi is not linked (import _ \"github.com/ddpgo/ddpgo/mpi\")", ErrNoBootstrap, env.Launcher)
	}
	b, err := open(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("%w: MPI: %w", ErrNoBootstrap, err)
	}
	return b, nil
}

// BroadcastStore presents a Bootstrap as the Set/Get store that a backend
// exchanging one value from one rank expects (nccl's Connect): Set, on
// Root, broadcasts the value; Get, on every other rank, receives it. Keys
// are not sent: the ranks' calls are matched by their order, so every
// rank must make its Set or Get calls for the same keys in the same order,
// as Connect does (one key per group).
type BroadcastStore struct {
	B    Bootstrap
	Root int
}

// Set broadcasts value from s.Root; call it on s.Root only.
func (s BroadcastStore) Set(ctx context.Context, key string, value []byte) error {
	_, err := s.B.Broadcast(ctx, value, s.Root)
	if err != nil {
		return fmt.Errorf("launch: broadcasting %q from rank %d: %w", key, s.Root, err)
	}
	return nil
}

// Get receives the value s.Root sets.
func (s BroadcastStore) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := s.B.Broadcast(ctx, nil, s.Root)
	if err != nil {
		return nil, fmt.Errorf("launch: receiving %q from rank %d: %w", key, s.Root, err)
	}
	return v, nil
}
