package ddp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ddpgo/ddpgo/comm"
)

// JoinMode selects how the Reducer handles ranks with fewer batches than
// their peers (uneven inputs): PyTorch's Join, Horovod's hvd.join.
type JoinMode uint8

const (
	// JoinOff: no join protocol. A synced step costs nothing extra, and
	// Join fails with ErrOptions. A rank that runs out of batches must
	// not stop taking steps while its peers go on.
	JoinOff JoinMode = iota
	// JoinWorld: a rank that has run out of batches calls Join, which
	// shadows its peers' synced steps with zero gradients until every
	// rank has joined; the average still divides by the group size, so a
	// joined rank counts as a zero gradient (PyTorch's default,
	// divide_by_initial_world_size=True).
	JoinWorld
	// JoinActive: as JoinWorld, but the average divides by the number of
	// ranks still active, so it is the mean over the ranks that had data.
	JoinActive
	// JoinThrow: a rank that calls Join ends every rank promptly: the
	// peers' synced step and the joined rank's Join fail with ErrJoined,
	// naming the rank (PyTorch's throw_on_early_termination).
	JoinThrow
)

func (m JoinMode) String() string {
	switch m {
	case JoinOff:
		return "JoinOff"
	case JoinWorld:
		return "JoinWorld"
	case JoinActive:
		return "JoinActive"
	case JoinThrow:
		return "JoinThrow"
	}
	return fmt.Sprintf("JoinMode(%d)", uint8(m))
}

// ErrJoined: with JoinThrow, a rank ran out of batches and joined; the
// error names it and the step.
var ErrJoined = errors.New("ddp: a rank ran out of inputs")

// The join protocol.
//
// Every rank must know, at each synced step, which ranks are still
// active, so that the joined ones issue exactly the collectives their
// peers issue, in the same order. With Options.Join set, every synced
// step therefore begins with one small all-reduce, the flag: a vector of
// one float32 per rank, each rank contributing 1 at its own index if it
// has joined and 0 otherwise; the sum is the set of joined ranks. (Float32
// rather than an integer type: every backend sums it natively, and exactly,
// since each element sums at most one 1.) An active rank issues it in
// Begin, before anything can complete a bucket, so it precedes the step's
// buffers and buckets on the wire; the finisher reads it before it
// finishes bucket 0, or, when there are buffers, whose root it decides,
// the launcher reads it before it broadcasts them. Nobody waits for it
// otherwise: the price of Join is one tiny collective per synced step on
// the wire ahead of the buckets, paid only when Options.Join asks for it.
//
// A joined rank (Join) exchanges the flag first and waits for it: if
// every rank has joined, Join returns; otherwise it runs the step its
// peers run, as a shadow step with zero gradients, through the same
// launcher and finisher, so the buffers' broadcast, the buckets and the
// first step's rebuild come in the same order as on the active ranks.
//
// Buffers are broadcast from the lowest active rank, since a joined
// rank's model no longer trains. Every rank sees every flag, so every
// rank knows which ranks joined in the last round, and Join returns the
// lowest of them: the last rank to join, whose model saw every step.

// joinState is the protocol's memory and what the last flag said.
type joinState struct {
	buf     comm.Buffer // the flag: Size float32s of pool memory
	up      []float32   // what this rank contributes
	down    []float32   // the flag's value, downloaded
	prev    []float32   // the previous round's value
	w       comm.Work   // the last flag issued
	pending bool        // w is a joined rank's flag, not complete yet
	active  int         // ranks active in the current step
}

// prepareJoin takes the flag's memory.
func (r *Reducer) prepareJoin() error {
	o := &r.o
	switch o.Join {
	case JoinOff:
		return nil
	case JoinWorld, JoinActive, JoinThrow:
	default:
		return fmt.Errorf("%w: rank %d: Options.Join %v", ErrOptions, r.c.Rank(), o.Join)
	}
	if o.Join == JoinActive && !r.host {
		for i, p := range r.params {
			if p.DType == comm.Float64 {
				return fmt.Errorf("%w: rank %d: JoinActive rescales parameter %d (%q, double) by N/active, which a device pool's kernels do in float32 precision; use JoinWorld", ErrOptions, r.c.Rank(), i, p.Name)
			}
		}
	}
	n := r.c.Size()
	blk, err := r.pool.Get(4 * n)
	if err != nil {
		return fmt.Errorf("ddp: rank %d: memory for the join flag: %w", r.c.Rank(), err)
	}
	r.bufs.blocks = append(r.bufs.blocks, blk) // released with the buffers
	j := &r.join
	j.buf = r.region(blk, 0, n, comm.Float32)
	j.up, j.down, j.prev = make([]float32, n), make([]float32, n), make([]float32, n)
	j.active = n
	return nil
}

// sendFlag issues this step's flag: 1 at this rank's index if it has
// joined. An active rank's flag (from Begin) goes to the finisher, ahead of
// the step's buffers and buckets; a joined rank's (from Join) is waited
// for by Join itself, and pending says so until it completes.
func (r *Reducer) sendFlag(joined bool) {
	j := &r.join
	j.up[r.c.Rank()] = 0
	if joined {
		j.up[r.c.Rank()] = 1
	}
	r.kern.Upload(j.buf, asBytes(j.up))
	j.w = r.c.AllReduce(j.buf, j.buf, comm.Sum)
	if joined {
		j.pending = true
		return
	}
	r.fifo <- inflight{w: j.w, kind: kindJoin}
}

// readFlag takes an active rank's flag once it has completed (err is its
// result): the ranks still active (JoinActive's divisor, the buffers'
// root) or, with JoinThrow, the step's failure. One goroutine reads it, the
// one the step's sequence names (see sequence). It reports whether the
// step may go on.
func (r *Reducer) readFlag(err error) bool {
	if err != nil {
		r.fail(fmt.Errorf("ddp: rank %d step %d: exchanging the join flag: %w", r.c.Rank(), r.stepNo, err))
		r.signal()
		return false
	}
	if joined := r.takeFlag(); joined > 0 && r.o.Join == JoinThrow {
		r.fail(fmt.Errorf("%w: %s at step %d, so rank %d stops too (Options.Join is JoinThrow)", ErrJoined, r.joinedRanks(), r.stepNo, r.c.Rank()))
		r.signal()
		return false
	}
	return true
}

// takeFlag reads the completed flag, sets the step's active ranks and the
// buffers' root, and returns how many ranks have joined.
func (r *Reducer) takeFlag() int {
	j := &r.join
	copy(j.prev, j.down)
	r.kern.Download(asBytes(j.down), j.buf)
	joined := 0
	r.bufRoot = -1
	for rank, v := range j.down {
		if v != 0 {
			joined++
		} else if r.bufRoot < 0 {
			r.bufRoot = rank
		}
	}
	if r.bufRoot < 0 {
		r.bufRoot = 0
	}
	j.active = len(j.down) - joined
	r.cur.Active = j.active
	return joined
}

// joinedRanks names the ranks the last flag says have joined.
func (r *Reducer) joinedRanks() string {
	var names []string
	for rank, v := range r.join.down {
		if v != 0 && r.join.prev[rank] == 0 {
			names = append(names, fmt.Sprint(rank))
		}
	}
	if len(names) == 1 {
		return "rank " + names[0] + " ran out of inputs and joined"
	}
	return "ranks " + strings.Join(names, ", ") + " ran out of inputs and joined"
}

// Join is what a rank calls once it has run out of batches, with
// Options.Join set: every rank calls it after its last step. Until every
// rank has joined, it takes part in each synced step its peers still take,
// contributing zero gradients (and nothing else), so that they keep
// training instead of waiting for it; then it returns, on every rank, the
// rank that joined last (the lowest of those that joined in the last
// round), whose model saw every step: Broadcast from it to make the models
// equal again, since a joined rank's optimizer stopped. With JoinThrow,
// Join fails with ErrJoined instead, as do the peers' steps, unless every
// rank joins at the same step.
//
// While some rank is inside Join, the others may only take steps (synced
// or not) and call Join: Broadcast, BroadcastParameters and Close issue
// collectives, or abort, that a joined rank does not match. Join is
// collective, must be called between steps, honours ctx and
// Options.Timeout for each round, and on failure makes the Reducer fail
// as Wait does. Gradients read after Join hold the last step's average.
func (r *Reducer) Join(ctx context.Context) (int, error) {
	if r.o.Shard != ShardOff {
		return -1, fmt.Errorf("%w: rank %d: Join with Options.Shard: call JoinEach, whose each steps this rank's part of every bucket and gathers it", ErrOptions, r.c.Rank())
	}
	return r.joinEach(ctx, nil)
}

// JoinEach is Join that, in every step it shadows, reports each reduced
// bucket to each on the calling goroutine, as WaitEach does. With
// Options.Shard a joined rank still owns its part of every bucket, and
// its peers wait for it: each must step that part (Reduced.Owned, with
// the average of the active ranks' gradients) and Gather it, as in a
// step of the rank's own, and JoinEach then waits for the gathers, as
// WaitGather does. The joined rank's parameters thus keep training with
// its peers' (PyTorch's ZeroRedundancyOptimizer join hook steps the
// optimizer likewise). A bucket each does not gather fails the Reducer
// with ErrGather, since the peers would wait for it. Without Shard, each
// may step a joined rank's optimizer, or do nothing.
func (r *Reducer) JoinEach(ctx context.Context, each func(Reduced)) (int, error) {
	return r.joinEach(ctx, each)
}

// joinEach is Join, reporting the buckets of shadowed steps to each if it is
// not nil.
func (r *Reducer) joinEach(ctx context.Context, each func(Reduced)) (int, error) {
	if err := r.enter(callJoin); err != nil {
		return -1, err
	}
	defer r.leave()
	if r.o.Join == JoinOff {
		return -1, fmt.Errorf("%w: rank %d: Join needs Options.Join (JoinWorld, JoinActive or JoinThrow) on every rank", ErrOptions, r.c.Rank())
	}
	switch r.state.Load() {
	case syncing:
		return -1, fmt.Errorf("%w: rank %d: Join during synced step %d: call %s first", ErrStepInProgress, r.c.Rank(), r.stepNo, r.stepEnd())
	case local:
		r.finish()
	}
	j := &r.join
	n := r.c.Size()
	for {
		cctx, cancel, explain := bounded(ctx, r.o.Timeout)
		r.sendFlag(true)
		err := explain(j.w.Wait(cctx))
		cancel()
		if err != nil {
			err = r.fail(fmt.Errorf("ddp: rank %d joined after step %d: exchanging the join flag: %w", r.c.Rank(), r.stepNo, err))
			if done, _ := j.w.Test(); !done {
				return -1, err // Close settles the flag's memory
			}
			j.pending = false
			return -1, err
		}
		j.pending = false
		if r.takeFlag() == n {
			last := 0
			for rank, v := range j.prev {
				if v == 0 {
					last = rank
					break
				}
			}
			clear(j.down) // a new epoch starts with every rank active
			j.active = n
			return last, nil
		}
		if r.o.Join == JoinThrow {
			return -1, r.fail(fmt.Errorf("%w: %s after step %d (Options.Join is JoinThrow)", ErrJoined, r.joinedRanks(), r.stepNo))
		}
		if err := r.shadow(ctx, each); err != nil {
			return -1, err
		}
	}
}

// shadow runs one synced step of a joined rank: every gradient marked as
// zero, reduced with the peers' through the usual launcher and finisher,
// each bucket reported to each (if not nil) and, with Options.Shard,
// gathered.
func (r *Reducer) shadow(ctx context.Context, each func(Reduced)) error {
	active := r.join.active
	if err := r.open(true, true); err != nil {
		return err
	}
	r.cur.Active = active
	L := r.lay.Load()
	for i := range r.params {
		if L.sched.claim(i) == nil {
			// Stale since open: the launcher zeroes it before the
			// bucket is launched.
			r.arrive(L, i, true)
		}
	}
	if err := r.wait(ctx, each); err != nil || L.shard == nil {
		return err
	}
	if err := r.notGathered(L); err != nil {
		return r.fail(err) // the peers wait for this rank's gathers
	}
	return r.endGathers(ctx, L)
}

// rescale turns bucket b's average over the group into JoinActive's
// average over the active ranks.
func (r *Reducer) rescale(b comm.Buffer) {
	n, a := r.c.Size(), r.join.active
	if r.o.Join != JoinActive || a == n || a == 0 {
		return
	}
	if b.DType == comm.Float64 && r.host {
		// Kernels.Scale's factor is a float32: N/a in float64 here.
		f := float64(n) / float64(a)
		v := b.AsFloat64()
		for i := range v {
			v[i] *= f
		}
		return
	}
	r.kern.Scale(b, float32(n)/float32(a))
}
