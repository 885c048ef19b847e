package ddp

import (
	"context"
	"fmt"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// The communication goroutines of a rank. The launcher takes buckets in
// index order as they complete (and as the window allows) and launches each
// through the hook: zeroing of stale gradients, compression, the
// collective; several buckets complete at once launch as one group
// (comm.Grouper). The finisher waits for the collectives in the same order
// and finishes each bucket (decompression, the copy back with CopyGrads).
// Between them, fifo holds the buckets in flight: bucket k+1 is on the wire
// while k still is. Neither goroutine ever runs a hook phase concurrently
// with the same phase of another bucket.

// inflight is a collective that has been issued: a bucket's (k is its
// index), a group of buffers' (k is the group) or the join flag.
type inflight struct {
	k    int
	w    comm.Work
	kind uint8
}

// Kinds of inflight.
const (
	kindBucket uint8 = iota
	kindBuffers
	kindJoin
)

func (r *Reducer) startWorkers() {
	r.poke = make(chan struct{}, 1)
	r.done = make(chan struct{}, 1)
	r.progress = make(chan struct{}, 1)
	r.quit = make(chan struct{})
	// A bucket holds at least one parameter, and a step adds the buffer
	// groups and the join flag: sends never block.
	r.fifo = make(chan inflight, len(r.params)+len(r.bufs.wire)+1)
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
			return
		}
		if L.sched.launched() == 0 {
			// The step's first launch: what precedes bucket 0 in every
			// rank's sequence comes first.
			if !r.flagForBuffers() {
				return
			}
			r.launchBuffers()
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
	r.fifo <- inflight{k: k, w: w}
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
		if e.kind == kindJoin {
			if r.launcherReadsFlag() {
				continue
			}
			if r.o.Join != JoinThrow {
				// Read with bucket 0, which the collectives' order puts
				// after it: by then it has completed, and waiting for it
				// now would cost the finisher a wake-up per step.
				r.flag, r.flagHeld = e, true
				continue
			}
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
			ferr := r.flag.w.Wait(r.ctx)
			if ferr != nil {
				if done, _ := r.flag.w.Test(); !done {
					<-r.quit
					return
				}
			}
			r.flagHeld = false
			if !r.readFlag(ferr) {
				continue
			}
		}
		switch e.kind {
		case kindBucket:
			r.finishOne(e.k, err)
		case kindJoin:
			r.readFlag(err)
		case kindBuffers:
			if err != nil {
				r.fail(fmt.Errorf("ddp: rank %d step %d: broadcasting the %s buffers from rank %d: %w", r.c.Rank(), r.stepNo, r.bufs.groups[e.k].DType, r.bufRoot, err))
				r.signal()
			}
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
	r.rescale(hb.Buf)
	s.DecompressEnd = time.Since(r.start)
	if r.copies != nil {
		for _, p := range L.buckets[k].Tensors {
			r.kern.Copy(r.copies[p], L.bufs[p])
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
