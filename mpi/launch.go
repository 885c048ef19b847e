package mpi

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/launch"
)

// The backend registers itself with package launch in every build; in a
// binary without the mpi tag, opening it says how to build it.
// launch.Finalize calls Finalize.
func init() {
	launch.Register(launch.Backend{Name: "mpi", Launched: true, About: "one process per rank, Open MPI",
		NotBuilt: notBuilt, Open: openJob, Finalize: Finalize})
	launch.RegisterBootstrap("mpi", openBootstrap)
}

// openJob is launch.Open's entry: one communicator over the world, whose
// rank and size must be the launcher's. Config may be an Options value.
func openJob(_ context.Context, job launch.Job) ([]comm.Communicator, error) {
	var o Options
	switch cfg := job.Config.(type) {
	case nil:
	case Options:
		o = cfg
	default:
		return nil, fmt.Errorf("%w: mpi takes mpi.Options as Config, not %T", comm.ErrInvalid, job.Config)
	}
	c, err := Open(o)
	if err != nil {
		return nil, err
	}
	if err := matchEnv(c, job.Env); err != nil {
		c.Close()
		return nil, err
	}
	return []comm.Communicator{c}, nil
}

// matchEnv checks that MPI's world is the job the launcher described.
func matchEnv(c comm.Communicator, env launch.Env) error {
	if c.Rank() == env.Rank && c.Size() == env.Size {
		return nil
	}
	return fmt.Errorf("mpi: MPI's world says rank %d of %d but the launcher's environment says %s: "+
		"a process that no MPI launcher started is a world of 1 (start the job with mpirun, mpiexec or srun --mpi)",
		c.Rank(), c.Size(), env)
}

// bootstrap is a launch.Bootstrap over a communicator of its own.
type bootstrap struct {
	c    comm.Communicator
	pool *allocator.Pool

	mu     sync.Mutex
	broken error // a Broadcast whose buffers MPI may still hold
}

func openBootstrap(_ context.Context, env launch.Env) (launch.Bootstrap, error) {
	c, err := Open(Options{})
	if err != nil {
		return nil, err
	}
	if err := matchEnv(c, env); err != nil {
		c.Close()
		return nil, err
	}
	p, err := allocator.New(allocator.Options{Limit: 64 << 20, SlabSize: 1 << 20})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &bootstrap{c: c, pool: p}, nil
}

// Broadcast sends root's data to every rank: its length, then its bytes,
// through pool memory.
func (b *bootstrap) Broadcast(ctx context.Context, data []byte, root int) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.broken != nil {
		return nil, b.broken
	}
	n, err := b.pool.Get(8)
	if err != nil {
		return nil, err
	}
	nb := comm.HostBuffer(n.Addr(), 1, comm.Int64)
	nb.AsInt64()[0] = int64(len(data))
	if err := b.wait(ctx, b.c.Broadcast(nb, root)); err != nil {
		return nil, err
	}
	size := nb.AsInt64()[0]
	b.pool.Put(n)
	if size < 0 || size > 32<<20 {
		return nil, fmt.Errorf("mpi: bootstrap broadcast of %d bytes from rank %d: want 0..32 MiB", size, root)
	}
	blk, err := b.pool.Get(int(size))
	if err != nil {
		return nil, err
	}
	buf := comm.HostBuffer(blk.Addr(), int(size), comm.Uint8)
	if b.c.Rank() == root && size > 0 {
		copy(buf.AsBytes(), data)
	}
	if err := b.wait(ctx, b.c.Broadcast(buf, root)); err != nil {
		return nil, err
	}
	out := make([]byte, size)
	if size > 0 {
		copy(out, buf.AsBytes())
	}
	b.pool.Put(blk)
	return out, nil
}

// wait waits for w; if ctx ends first, MPI still holds the buffers, which
// are then never returned to the pool, and the bootstrap is unusable.
func (b *bootstrap) wait(ctx context.Context, w comm.Work) error {
	err := w.Wait(ctx)
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		b.broken = fmt.Errorf("mpi: bootstrap: an earlier Broadcast was abandoned while in flight: %w", err)
	}
	return err
}

// Close closes the bootstrap's communicator and pool.
func (b *bootstrap) Close() error {
	err := b.c.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.broken == nil {
		return errors.Join(err, b.pool.Close())
	}
	return err
}
