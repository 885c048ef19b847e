package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ddpgo/ddpgo/launch"
)

// agree tells every rank of a launched job whether some rank failed to
// get ready (setup != nil on that rank: a --metrics-addr it cannot bind,
// memory it cannot map), through launch.Agree, before the first
// collective of the run. Without it the failed rank would return
// and wait in MPI_Finalize while its peers wait for it in the reducer's
// first collective: the job would end only at --timeout, with the
// rank's error never printed.
//
// A rank whose setup failed writes its error, naming itself, to w before
// the all-reduce (once it completes a peer may exit, and mpirun then ends
// this process before it could say it), and every rank returns a
// rankError with the failed rank's exit status (launch.Agree says which,
// if several failed), which only rank 0 of the others mentions, at once.
func (g *group) agree(ctx context.Context, setup error, timeout time.Duration, w io.Writer, args []string) error {
	if !g.launched || g.size == 1 {
		return setup
	}
	var code int
	if setup != nil {
		var line string
		line, code = report(ctx, setup, args)
		code = max(code, 1)
		fmt.Fprintf(w, "ddpbench: rank %d of %d: %s\n", g.rank, g.size, line)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	failed, fcode, err := launch.Agree(ctx, g.comms[0], code)
	switch {
	case err != nil:
		return errors.Join(setup, err)
	case setup != nil:
		return rankError{rank: g.rank, size: g.size, code: code, said: true, err: setup}
	case failed >= 0:
		err := fmt.Errorf("rank %d failed before the run started (its error is above); every rank stops", failed)
		if g.rank == 0 {
			// Said now, not on the way out: the failed rank may leave
			// MPI_Finalize first, and mpirun then ends this process.
			fmt.Fprintf(w, "ddpbench: rank %d of %d: %v\n", g.rank, g.size, err)
		}
		return rankError{rank: g.rank, size: g.size, code: fcode, said: true, err: err}
	}
	return nil
}
