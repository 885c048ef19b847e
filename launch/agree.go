package launch

import (
	"context"
	"errors"
	"fmt"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// Agree tells every rank of a launched job whether some rank failed to get
// ready, in one all-reduce of one word over c, before the job's first
// collective. status is this rank's: 0 if it is ready, else the exit
// status (1 to 255) it fails with. Every rank gets the same answer: a
// failed rank and its status (the highest status, and of the ranks that
// failed with it the highest), or -1 and 0 when every rank is ready.
//
// Without it, a rank whose setup fails (an output file it cannot create, a
// port it cannot bind) would return and wait in MPI_Finalize while its
// peers wait for it in their first collective, until a deadline, its error
// unprinted. A rank that fails should write its error before Agree: once
// the all-reduce completes, a peer may exit, and the launcher may then end
// this process before it could say anything. For the same reason a rank
// that learns of another's failure should say so at once, not on its way
// out.
//
// The word lives in pool memory of its own, not on the Go heap. If the
// all-reduce fails or ctx ends first, the error names the rank, and the
// memory stays mapped (the backend may still write it).
func Agree(ctx context.Context, c comm.Communicator, status int) (failed, code int, err error) {
	if status < 0 || status > 255 {
		return -1, 0, fmt.Errorf("launch: rank %d: Agree: status %d, want 0 (ready) or an exit status 1-255", c.Rank(), status)
	}
	const rankBits = 20 // ranks below 2^20, statuses below 2^8
	if c.Size() >= 1<<rankBits {
		return -1, 0, fmt.Errorf("launch: rank %d: Agree: %d ranks, at most %d", c.Rank(), c.Size(), 1<<rankBits-1)
	}
	pool, err := allocator.New(allocator.Options{Limit: 1 << 20, SlabSize: 64 << 10})
	if err != nil {
		return -1, 0, fmt.Errorf("launch: rank %d: memory for agreeing that every rank is ready: %w", c.Rank(), err)
	}
	blk, err := pool.Get(8)
	if err != nil {
		return -1, 0, errors.Join(fmt.Errorf("launch: rank %d: memory for agreeing that every rank is ready: %w", c.Rank(), err), pool.Close())
	}
	word := comm.HostBuffer(blk.Addr(), 1, comm.Int64)
	word.AsInt64()[0] = 0
	if status != 0 {
		word.AsInt64()[0] = int64(status)<<rankBits | int64(c.Rank()+1)
	}
	if err := c.AllReduce(word, word, comm.Max).Wait(ctx); err != nil {
		return -1, 0, fmt.Errorf("launch: rank %d of %d: agreeing that every rank is ready: %w", c.Rank(), c.Size(), err)
	}
	w := word.AsInt64()[0]
	err = errors.Join(pool.Put(blk), pool.Close())
	if w == 0 {
		return -1, 0, err
	}
	return int(w&(1<<rankBits-1)) - 1, int(w >> rankBits), err
}
