package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// readyTimeout bounds ready's all-reduce: every rank reaches it once it has
// created its output files, well under a second after the job starts.
const readyTimeout = 2 * time.Minute

// ready tells every rank of an mpi job whether some rank failed to get
// ready to train (setup != nil on that rank), through an all-reduce of one
// flag. Without it, a rank that cannot create its -trace or -save file
// would return while its peers wait for it in the Reducer's first
// collective, and then itself wait for them in MPI_Finalize: the job would
// hang until the backend's timeout. A rank whose setup failed writes its
// error to standard error before the all-reduce and returns an error
// saying so; a rank whose own setup succeeded returns an error naming the
// highest failed rank (a maximum names no more).
func (g *group) ready(ctx context.Context, setup error) error {
	if !g.mpi || g.comms[0].Size() == 1 {
		return setup
	}
	c := g.comms[0]
	// Collectives take pool memory, never the Go heap.
	pool, err := allocator.New(allocator.Options{Limit: 1 << 20, SlabSize: 64 << 10})
	if err != nil {
		return errors.Join(setup, err)
	}
	blk, err := pool.Get(8)
	if err != nil {
		return errors.Join(setup, err, pool.Close())
	}
	flag := comm.HostBuffer(blk.Addr(), 1, comm.Int64)
	flag.AsInt64()[0] = 0
	if setup != nil {
		flag.AsInt64()[0] = int64(c.Rank()) + 1
		// Said now, before the all-reduce: once it completes, a peer may
		// exit, and mpirun then ends this process before it could say it.
		fmt.Fprintln(os.Stderr, "digits:", setup)
		setup = fmt.Errorf("rank %d of %d failed before training (its error is above)", c.Rank(), c.Size())
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := c.AllReduce(flag, flag, comm.Max).Wait(ctx); err != nil {
		// MPI may still write the flag: the pool stays mapped, and the
		// job ends with this error.
		return errors.Join(setup, fmt.Errorf("rank %d: agreeing that every rank is ready to train: %w", c.Rank(), err))
	}
	failed := int(flag.AsInt64()[0]) - 1
	err = errors.Join(pool.Put(blk), pool.Close())
	if setup == nil && failed >= 0 {
		setup = fmt.Errorf("rank %d: rank %d of %d failed before training (its error is beside this one)", c.Rank(), failed, c.Size())
	}
	return errors.Join(setup, err)
}
