package ddptrain

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ddpgo/ddpgo/ddp"
)

// A failure travels with the gradients. The Reducer's last parameter is
// the trainer's own: a float32 vector with one element per rank, which
// every rank writes in every synced step (zeros, and 1 in its own element
// if it failed) and marks ready first. After the step each rank reads the
// average: an element that is not zero names a rank that failed. This
// costs 4 bytes a rank in the first bucket, and works on every backend,
// whether or not it can tell its peers about an Abort (package mpi's
// Abort ends the job). A rank that fails therefore still completes the
// step's collectives: it marks every parameter ready (their values do not
// matter: no rank applies the step) and waits, so that its peers fail in
// the same step instead of waiting for it.

// writeStatus writes this rank's status into the trainer's parameter and
// marks it ready.
func (t *Trainer) writeStatus(failed bool) error {
	s, err := t.r.Grad(t.status)
	if err != nil {
		return err
	}
	clear(s)
	if failed {
		s[t.c.Rank()] = 1
	}
	return t.ready(t.status)
}

// readStatus records the ranks whose element of the averaged status is
// not zero.
func (t *Trainer) readStatus() error {
	s, err := t.r.Grad(t.status)
	if err != nil {
		return err
	}
	for r, x := range s {
		if x != 0 {
			t.failed = append(t.failed, r)
		}
	}
	return nil
}

// tellPeers completes a synced step that tells every rank that this one
// failed with cause, and returns cause. mode is the step in progress: a
// synced one is completed as it is; otherwise (a no-sync step, or a synced
// step already over) a synced step of its own is begun, which matches the
// peers' next one.
func (t *Trainer) tellPeers(ctx context.Context, mode ddp.SyncMode, cause error) error {
	if mode != ddp.Sync {
		if err := t.r.Begin(ddp.Sync); err != nil {
			return errors.Join(cause, err)
		}
		clear(t.marked)
	}
	if t.marked[t.status] {
		// This rank already said it was well, and its status may be on
		// the wire: too late to tell the peers through it. Abort the
		// group instead (a backend that shares memory fails the peers,
		// naming this rank; package mpi ends the job).
		t.c.Abort(cause)
		return cause
	}
	errs := []error{t.writeStatus(true)}
	for i, m := range t.marked {
		if !m {
			errs = append(errs, t.ready(i))
		}
	}
	t.failed = t.failed[:0]
	if err := t.r.Wait(ctx); err != nil {
		errs = append(errs, err)
	} else if t.shard {
		// The peers step and gather their variables before they read
		// the status: gather this rank's, as they were.
		t.outErr = nil
		errs = append(errs, t.gather(ctx))
	}
	return errors.Join(append([]error{cause}, errs...)...)
}

// rankList names ranks: "rank 1", "ranks 1, 2".
func rankList(ranks []int) string {
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s, ", ")
}
