package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// agree tells every rank of a launched job whether some rank failed to
// get ready (setup != nil on that rank: a --metrics-addr it cannot bind,
// memory it cannot map), through an all-reduce of one word, before the
// first collective of the run. Without it the failed rank would return
// and wait in MPI_Finalize while its peers wait for it in the reducer's
// first collective: the job would end only at --timeout, with the
// rank's error never printed.
//
// A rank whose setup failed writes its error, naming itself, to w before
// the all-reduce (once it completes a peer may exit, and mpirun then ends
// this process before it could say it), and every rank returns a
// rankError with the failed rank's exit status (the highest failed rank's,
// if several failed), which only rank 0 of the others mentions, at once.
func (g *group) agree(ctx context.Context, setup error, timeout time.Duration, w io.Writer, args []string) error {
	if !g.launched || g.size == 1 {
		return setup
	}
	c := g.comms[0]
	const rankBits = 20 // ranks < 2^20, exit statuses < 2^8
	var word int64
	var code int
	if setup != nil {
		var line string
		line, code = report(ctx, setup, args)
		fmt.Fprintf(w, "ddpbench: rank %d of %d: %s\n", g.rank, g.size, line)
		word = int64(code)<<rankBits | int64(g.rank+1)
	}
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
	flag.AsInt64()[0] = word
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.AllReduce(flag, flag, comm.Max).Wait(ctx); err != nil {
		// The backend may still write the flag: the pool stays mapped.
		return errors.Join(setup, fmt.Errorf("rank %d of %d: agreeing that every rank is ready: %w", g.rank, g.size, err))
	}
	word = flag.AsInt64()[0]
	pool.Put(blk)
	pool.Close()
	switch {
	case setup != nil:
		return rankError{rank: g.rank, size: g.size, code: code, said: true, err: setup}
	case word != 0:
		failed := int(word&(1<<rankBits-1)) - 1
		err := fmt.Errorf("rank %d failed before the run started (its error is above); every rank stops", failed)
		if g.rank == 0 {
			// Said now, not on the way out: the failed rank may leave
			// MPI_Finalize first, and mpirun then ends this process.
			fmt.Fprintf(w, "ddpbench: rank %d of %d: %v\n", g.rank, g.size, err)
		}
		return rankError{rank: g.rank, size: g.size, code: int(word >> rankBits), said: true, err: err}
	}
	return nil
}
