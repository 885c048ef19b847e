package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ddpgo/ddpgo/launch"
)

// readyTimeout bounds ready's all-reduce: every rank reaches it once it has
// created its output files, well under a second after the job starts.
const readyTimeout = 2 * time.Minute

// ready tells every rank of an mpi job whether some rank failed to get
// ready to train (setup != nil on that rank), through launch.Agree.
// Without it, a rank that cannot create its -trace or -save file would
// return while its peers wait for it in the Reducer's first collective,
// and then itself wait for them in MPI_Finalize: the job would hang until
// the backend's timeout. A rank whose setup failed writes its error to
// standard error before the agreement and returns an error saying so; a
// rank whose own setup succeeded returns an error naming a failed rank.
func (g *group) ready(ctx context.Context, setup error) error {
	if !g.mpi || g.comms[0].Size() == 1 {
		return setup
	}
	c := g.comms[0]
	status := 0
	if setup != nil {
		// Said now, before the agreement: once it completes, a peer may
		// exit, and mpirun then ends this process before it could say it.
		fmt.Fprintln(os.Stderr, "digits:", setup)
		setup = fmt.Errorf("rank %d of %d failed before training (its error is above)", c.Rank(), c.Size())
		status = 1
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	failed, _, err := launch.Agree(ctx, c, status)
	if err != nil {
		return errors.Join(setup, err)
	}
	if setup == nil && failed >= 0 {
		setup = fmt.Errorf("rank %d: rank %d of %d failed before training (its error is beside this one)", c.Rank(), failed, c.Size())
	}
	return setup
}
