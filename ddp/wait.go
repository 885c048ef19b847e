package ddp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/invariants"
)

// Wait returns when every bucket of the synced step is reduced: each
// gradient then holds the average over ranks. In a no-sync step it only
// ends the step. It fails with ErrUnready (naming the parameters) if some
// parameters were never marked ready and FindUnusedParameters is off; the
// step then stays open, so the caller may mark them and call Wait again.
// Wait honours ctx and Options.Timeout (a step already finished when ctx
// ends stands); on expiry, or when a collective fails, the Reducer aborts
// the group, and it and every later call return that error until Close.
// A Close from another goroutine ends a blocked Wait with ErrClosed.
//
// One goroutine at a time may be in Wait, WaitEach, Join or Broadcast: a
// second fails at once with ErrConcurrent, naming both calls.
func (r *Reducer) Wait(ctx context.Context) error {
	if err := r.enter(callWait); err != nil {
		return err
	}
	defer r.leave()
	return r.wait(ctx, nil)
}

// Reduced reports a bucket whose reduction has completed: the gradients
// of its parameters hold the average over ranks.
type Reduced struct {
	Bucket int   // index in the current layout
	Params []int // its parameters: the Reducer's own slice, valid until the next Begin; do not modify
	// Owned is the bucket's part this rank owns under Options.Shard
	// (Owned(Bucket)): the only elements whose gradients hold the
	// average. nil without Shard.
	Owned []Part
}

// WaitEach is Wait that also calls each, on the calling goroutine, once
// per bucket of a synced step as soon as that bucket's reduction has
// completed, in completion order (which is bucket index order), with the
// bucket's parameter indices. each may read the bucket's gradients with
// Grad and update the parameters (an optimizer step per bucket) while
// later buckets are still on the wire, which hides the optimizer behind
// the remaining communication. The Reducer's goroutines never wait for
// each: they only signal, and each runs while WaitEach waits.
//
// WaitEach returns when every bucket is reduced and each has been called
// for every one, or with Wait's errors; after an error no further bucket
// is reported. Options.Timeout bounds the whole call, each included. In
// a no-sync step WaitEach only ends the step and never calls each. each
// must not call Begin, Wait or WaitEach (they fail with ErrConcurrent),
// nor Close.
func (r *Reducer) WaitEach(ctx context.Context, each func(Reduced)) error {
	if err := r.enter(callWaitEach); err != nil {
		return err
	}
	defer r.leave()
	return r.wait(ctx, each)
}

// wait is Wait, reporting each bucket to each if it is not nil.
func (r *Reducer) wait(ctx context.Context, each func(Reduced)) error {
	if err := r.usable(); err != nil {
		return err
	}
	if r.gathering.Load() {
		return fmt.Errorf("%w: rank %d: Wait in step %d, whose buckets are reduced already: Gather each and call WaitGather", ErrStepInProgress, r.c.Rank(), r.stepNo)
	}
	switch r.state.Load() {
	case idle:
		return fmt.Errorf("%w: rank %d: Wait without a step (the last was step %d): call Begin first", ErrNoStep, r.c.Rank(), r.stepNo)
	case local:
		r.finish()
		return nil
	}
	L := r.lay.Load()
	if int(L.sched.nmarked.Load()) < len(r.params) {
		if err := r.handleUnready(L); err != nil {
			return err
		}
	}
	if err := r.waitDone(ctx, L, each); err != nil {
		return err
	}
	if err := r.usable(); err != nil {
		return err
	}
	if r.o.StaticGraph && !r.staticOK {
		copy(r.static, r.isUnused)
		r.staticOK = true
	}
	if L.shard != nil {
		// The step goes on until WaitGather; Shard keeps the layout.
		r.gathering.Store(true)
		return nil
	}
	first := !r.rebuilt
	r.finish()
	if first {
		r.rebuilt = true
		if !r.o.KeepLayout {
			if err := r.rebuild(ctx); err != nil {
				return r.fail(err)
			}
		}
	}
	return nil
}

// handleUnready deals with parameters not marked ready when Wait starts.
func (r *Reducer) handleUnready(L *layout) error {
	if r.o.FindUnusedParameters || (r.o.StaticGraph && !r.staticOK) {
		for i := range r.params {
			if !L.sched.isMarked(i) {
				if err := r.heldWrite("Wait", i); err != nil {
					return err
				}
			}
		}
		for i := range r.params {
			if !L.sched.isMarked(i) {
				r.markUnused(L, i)
			}
		}
		return nil
	}
	var names []string
	for i, p := range r.params {
		if !L.sched.isMarked(i) && len(names) < 10 {
			names = append(names, fmt.Sprintf("%d %q (bucket %d)", i, p.Name, L.bucketOf[i]))
		}
	}
	missing := len(r.params) - int(L.sched.nmarked.Load())
	list := strings.Join(names, ", ")
	if missing > len(names) {
		list += fmt.Sprintf(" and %d more", missing-len(names))
	}
	return fmt.Errorf("%w: rank %d step %d: %d of %d parameters got no Ready before Wait: %s; "+
		"buckets are reduced only once all their parameters are ready, so this step cannot finish. "+
		"Call Ready (or SetGrad) for every parameter, including those with a zero gradient, or, if these "+
		"parameters really take no part in this step's loss, set Options.FindUnusedParameters "+
		"(or Options.StaticGraph when the set never changes). The step stays open: mark them and call Wait again",
		ErrUnready, r.c.Rank(), r.stepNo, missing, len(r.params), list)
}

// waitDone blocks until the finisher has reduced the last bucket, calling
// each (if not nil) for every bucket reduced meanwhile, in index order.
func (r *Reducer) waitDone(ctx context.Context, L *layout, each func(Reduced)) error {
	watch := r.dog.Start(time.Now())
	next := 0 // the next bucket to report to each
	report := func() {
		for n := int(r.reduced.Load()); next < n && !r.failed.Load(); next++ {
			var owned []Part
			if L.shard != nil {
				owned = L.shard.owned[next]
			}
			each(Reduced{Bucket: next, Params: L.buckets[next].Tensors, Owned: owned})
		}
	}
	if each != nil {
		// The finisher signals progress only while watched. It adds to
		// reduced before it looks at watch, and report reads reduced
		// after watch is set, so no bucket goes unreported.
		r.watch.Store(true)
		defer r.watch.Store(false)
	}
	for {
		if each != nil {
			report()
		}
		r.timer.Reset(max(watch.Next(time.Now()), time.Nanosecond))
		select {
		case <-r.done:
			r.timer.Stop()
			if each != nil {
				report()
			}
			return nil
		case <-r.progress:
			r.timer.Stop()
		case <-ctx.Done():
			r.timer.Stop()
			select {
			case <-r.done: // the step finished as ctx ended: it stands
				return nil
			default:
			}
			k := int(r.reduced.Load())
			return r.fail(fmt.Errorf("ddp: rank %d step %d: waiting for bucket %d of %d (%s): %w", r.c.Rank(), r.stepNo, k, len(L.buckets), L.describe(k, r.params), ctxErr(ctx)))
		case <-r.timer.C:
			now := time.Now()
			report, expired := watch.Check(now)
			if !report && !expired {
				continue
			}
			s := r.stall(L, int(r.reduced.Load()), watch.Waited(now))
			if report {
				r.dog.Report(s)
			}
			if expired {
				select {
				case <-r.done:
					return nil
				default:
				}
				if r.completedUnreported(L) {
					// The collective has just completed, failed by a
					// peer's abort, say: the finisher reports it, with
					// the cause, which names the ranks this rank's own
					// timeout could no longer find missing.
					t := time.NewTimer(time.Second)
					select {
					case <-r.done:
						t.Stop()
						return nil
					case <-t.C:
					}
				}
				return r.fail(fmt.Errorf("ddp: %w", s.TimeoutError()))
			}
		}
	}
}

// completedUnreported reports whether the oldest bucket not yet reduced
// is on the wire and its collective has completed: the finisher is about
// to report it.
func (r *Reducer) completedUnreported(L *layout) bool {
	k := int(r.reduced.Load())
	if k >= len(L.buckets) || int(L.issued.Load()) <= k {
		return false
	}
	done, _ := L.works[k].Test()
	return done
}

// stall describes the wait for bucket k: the ranks missing from its
// collective (as far as the backend can tell) once it is on the wire, or
// this rank's own parameters that have not been marked ready.
func (r *Reducer) stall(L *layout, k int, waited time.Duration) comm.Stall {
	rank := r.c.Rank()
	s := comm.Stall{Rank: rank, Waited: waited}
	if k >= len(L.buckets) {
		s.Detail = fmt.Sprintf("ddp step %d: every bucket reduced, finishing", r.stepNo)
		return s
	}
	where := fmt.Sprintf("ddp step %d, bucket %d of %d (%s)", r.stepNo, k, len(L.buckets), L.describe(k, r.params))
	if int(L.issued.Load()) > k {
		w := L.works[k]
		s.Seq = w.ID()
		s.Missing = comm.MissingRanks(r.c, w)
		s.Detail = where + ": its collective is on the wire"
		return s
	}
	var names []string
	for _, p := range L.buckets[k].Tensors {
		if !L.sched.isMarked(p) {
			names = append(names, fmt.Sprintf("%q", r.params[p].Name))
		}
	}
	s.Missing = []int{rank}
	if len(names) == 0 {
		s.Detail = where + ": complete, waiting for earlier buckets to launch"
	} else {
		s.Detail = where + ": waiting for this rank to mark " + strings.Join(names, ", ") + " ready"
	}
	return s
}

// finish ends the running step: statistics become final and visible
// through Stats.
func (r *Reducer) finish() {
	s := r.cur
	if invariants.Enabled && s.Sync && !r.failed.Load() {
		L := r.lay.Load()
		if n := len(L.buckets); L.sched.launched() != n || int(r.reduced.Load()) != n || int(L.sched.nmarked.Load()) != len(r.params) {
			panic(fmt.Sprintf("ddp: invariant: step %d finished with %d of %d buckets launched, %d reduced, %d of %d parameters marked",
				r.stepNo, L.sched.launched(), n, r.reduced.Load(), L.sched.nmarked.Load(), len(r.params)))
		}
		if n := len(L.buckets); L.shard != nil && (L.sched.gathersLaunched() != n || int(r.gathered.Load()) != n) {
			panic(fmt.Sprintf("ddp: invariant: sharded step %d finished with %d of %d gathers launched, %d complete",
				r.stepNo, L.sched.gathersLaunched(), n, r.gathered.Load()))
		}
		for i := range r.fresh {
			if r.isStale(i) {
				panic(fmt.Sprintf("ddp: invariant: step %d finished with parameter %d (%q) stale (generation %d, current %d)",
					r.stepNo, i, r.params[i].Name, r.fresh[i].Load(), r.gen.Load()))
			}
		}
	}
	s.Wall = time.Since(r.start)
	s.finalize(r.lay.Load(), r.isUnused)
	if err := r.dropRetired(); err != nil {
		r.fail(fmt.Errorf("ddp: rank %d step %d: returning the replaced layout's memory: %w", r.c.Rank(), r.stepNo, err))
	}
	r.cur, r.last = r.last, r.cur
	r.state.Store(idle)
}
