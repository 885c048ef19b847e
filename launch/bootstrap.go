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
