package ddp

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// The communication goroutines of a rank. The launcher takes buckets in
// index order as they complete (and as the window allows) and launches each
// through the hook: zeroing of stale gradients, compression, the
// collective; several buckets complete at once launch as one group
// (comm.Grouper). The finisher waits for the collectives in the same order
// and finishes each (decompression, the copy back with CopyGrads). Between
// them, fifo holds the collectives in flight: bucket k+1 is on the wire
// while k still is. Neither goroutine ever runs a hook phase concurrently
// with the same phase of another bucket. What precedes the buckets (the
// join flag, the buffers' broadcasts) and who reads the flag when is the
// step's sequence (schedule.go), which both goroutines follow.

// inflight is a collective that has been issued: a bucket's (k is its
// index), a group of buffers' (k is the group) or the join flag (kind says
// which; see sequence).
type inflight struct {
	k    int
	w    comm.Work
	kind uint8
}

// pipeline is the state of a rank's two communication goroutines: the
// launcher takes complete buckets in index order and launches them
// through the hook; the finisher waits for their collectives in the same
// order and finishes them. fifo carries the collectives in flight between
// them, in the order seq, the step's sequence, gives.
type pipeline struct {
	window   int
	seq      sequence // the current step's order; set by open while no step runs
	fifo     chan inflight
	head     inflight // the finisher's collective in flight, if headSet
	headSet  bool
	flag     inflight // the join flag the finisher reads with the next collective, if flagHeld
	flagHeld bool
	poke     chan struct{}
	done     chan struct{}
	progress chan struct{} // a bucket was reduced, while watch (WaitEach)
	watch    atomic.Bool
	quit     chan struct{}
	workers  sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc
	timer    *time.Timer
}

func (r *Reducer) startWorkers() {
	r.poke = make(chan struct{}, 1)
	r.done = make(chan struct{}, 1)
	r.progress = make(chan struct{}, 1)
	r.quit = make(chan struct{})
	// A bucket holds at least one parameter, and a step adds the buffer
	// groups and the join flag, and with Options.Shard a gather per
	// bucket: sends never block.
	n := len(r.params) + len(r.bufs.wire) + 1
	if r.o.Shard != ShardOff {
		n += len(r.params)
	}
	r.fifo = make(chan inflight, n)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	r.workers.Add(2)
	go r.launcher()
	go r.finisher()
}

// stopWorkers stops both goroutines. Collectives they left in flight are
// found by pendingWorks.
func (r *Reducer) stopWorkers() {
	if r.quit == nil {
		return
	}
	r.cancel()
	close(r.quit)
	r.workers.Wait()
}

// pendingWorks returns the Works of the buckets still in flight. It runs
// once the communication goroutines have stopped.
func (r *Reducer) pendingWorks() []comm.Work {
	var ws []comm.Work
	if r.join.pending {
		ws = append(ws, r.join.w)
	}
	if r.flagHeld {
		ws = append(ws, r.flag.w)
	}
	if r.headSet {
		ws = append(ws, r.head.w)
	}
	for {
		select {
		case e := <-r.fifo:
			ws = append(ws, e.w)
		default:
			return ws
		}
	}
}

func (r *Reducer) wakeLauncher() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

func (r *Reducer) signal() {
	select {
	case r.done <- struct{}{}:
	default:
	}
}

func (r *Reducer) launcher() {
	defer r.workers.Done()
	for {
		select {
		case <-r.quit:
			return
		case <-r.poke:
		}
		r.launchReady()
	}
}

// launchReady launches, in index order, every bucket that may launch: it is
// complete, every earlier bucket has launched, and fewer than the window's
// buckets are in flight.
func (r *Reducer) launchReady() {
	L := r.lay.Load()
	for !r.failed.Load() {
		n := L.sched.ready(int(r.reduced.Load()) + r.window)
		if n == 0 {
			if L.shard != nil {
				r.launchGathers(L)
			}
			return
		}
		if L.sched.launched() == 0 && !r.launchPrefix() {
			return
		}
		if n > 1 {
			comm.GroupStart(r.c)
		}
		ok := true
		for range n {
			if ok = r.launchOne(L, L.sched.launch()); !ok {
				break
			}
		}
		if n > 1 {
			if err := comm.GroupEnd(r.c); err != nil && ok {
				r.fail(fmt.Errorf("ddp: rank %d step %d: launching %d buckets as a group: %w", r.c.Rank(), r.stepNo, n, err))
				r.signal()
				return
			}
		}
		if !ok {
			return
		}
	}
}

// launchOne launches bucket k and hands it to the finisher.
func (r *Reducer) launchOne(L *layout, k int) bool {
	s := &r.cur.Buckets[k]
	hb := &L.hb[k]
	s.Launch = time.Since(r.start)
	r.zeroStale(L, k, s)
	s.CompressStart = time.Since(r.start)
	w, err := r.hook.Launch(hb)
	s.CompressEnd = time.Since(r.start)
	s.CollectiveStart = s.CompressEnd
	s.WireBytes = hb.WireBytes
	if err != nil {
		r.fail(fmt.Errorf("ddp: rank %d step %d: launching bucket %d (%s): %w", r.c.Rank(), r.stepNo, k, L.describe(k, r.params), err))
		r.signal()
		return false
	}
	L.works[k] = w
	L.issued.Store(int32(k + 1))
	r.fifo <- inflight{k: k, w: w}
	return true
}

// launchPrefix launches what precedes bucket 0 in the step's sequence,
// before the step's first launch: it reads the join flag first where the
// sequence gives it to the launcher, then broadcasts the buffers. It
// reports whether the launch may go on.
func (r *Reducer) launchPrefix() bool {
	if r.seq.launcherReadsFlag() {
		if ok, _ := r.awaitFlag(r.join.w); !ok {
			return false
		}
	}
	for g := range r.seq.prefix() {
		r.fifo <- inflight{k: g, w: r.c.Broadcast(r.bufs.wire[g], r.bufRoot), kind: kindBuffers}
	}
	return true
}

func (r *Reducer) finisher() {
	defer r.workers.Done()
	for {
		var e inflight
		select {
		case <-r.quit:
			return
		case e = <-r.fifo:
		}
		switch r.seq.arrival(e.kind) {
		case arriveSkip:
			continue
		case arriveHold:
			r.flag, r.flagHeld = e, true
			continue
		}
		r.head, r.headSet = e, true
		err := e.w.Wait(r.ctx)
		if err != nil {
			if done, _ := e.w.Test(); !done {
				// The Reducer failed or is closing, and the collective
				// may still write its memory: Close settles it.
				<-r.quit
				return
			}
		}
		r.headSet = false
		if r.flagHeld {
			ok, inFlight := r.awaitFlag(r.flag.w)
			if inFlight {
				<-r.quit // as above; pendingWorks finds the held flag
				return
			}
			r.flagHeld = false
			if !ok {
				continue
			}
		}
		r.finishItem(e, err)
	}
}

// awaitFlag waits for the join flag w and reads it, on the goroutine the
// step's sequence gives it to. It reports whether the step may go on (not
// when the flag failed or, with JoinThrow, says a rank joined), and
// whether the flag is still in flight because the Reducer is failing or
// closing (Close then settles its memory).
func (r *Reducer) awaitFlag(w comm.Work) (ok, inFlight bool) {
	err := w.Wait(r.ctx)
	if err != nil {
		if done, _ := w.Test(); !done {
			return false, true
		}
	}
	return r.readFlag(err), false
}

// finishItem finishes collective e, which has completed with err.
func (r *Reducer) finishItem(e inflight, err error) {
	switch e.kind {
	case kindBucket:
		r.finishOne(e.k, err)
	case kindJoin:
		r.readFlag(err)
	case kindGather:
		r.finishGather(e.k, err)
	case kindBuffers:
		if err != nil {
			r.fail(fmt.Errorf("ddp: rank %d step %d: broadcasting the %s buffers from rank %d: %w", r.c.Rank(), r.stepNo, r.bufs.groups[e.k].DType, r.bufRoot, err))
			r.signal()
		}
	}
}

// finishOne completes bucket k, whose collective has completed with err.
func (r *Reducer) finishOne(k int, err error) {
	L := r.lay.Load()
	s := &r.cur.Buckets[k]
	hb := &L.hb[k]
	s.CollectiveEnd = time.Since(r.start)
	if err == nil {
		err = r.hook.Finish(hb)
	}
	if err != nil {
		r.fail(fmt.Errorf("ddp: rank %d step %d: bucket %d (%s): %w", r.c.Rank(), r.stepNo, k, L.describe(k, r.params), err))
		r.signal()
		return
	}
	s.Overflows = hb.Overflows
	if L.shard == nil {
		r.rescale(hb.Buf)
	} else {
		r.rescale(hb.Part(r.c.Rank(), r.c.Size())) // the rest is undefined
	}
	s.DecompressEnd = time.Since(r.start)
	if r.copies != nil {
		if L.shard == nil {
			for _, p := range L.buckets[k].Tensors {
				r.kern.Copy(r.copies[p], L.bufs[p])
			}
		} else {
			for _, pt := range L.shard.owned[k] {
				r.kern.Copy(r.copies[pt.Param].Slice(pt.Lo, pt.Hi-pt.Lo), L.bufs[pt.Param].Slice(pt.Lo, pt.Hi-pt.Lo))
			}
		}
	}
	s.Done = time.Since(r.start)
	if int(r.reduced.Add(1)) == len(L.buckets) {
		r.signal()
	} else if r.watch.Load() {
		select { // WaitEach reports the bucket
		case r.progress <- struct{}{}:
		default:
		}
	}
	r.wakeLauncher() // the window has room again
}
