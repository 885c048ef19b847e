package ddp

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// fail makes err the Reducer's sticky error, stops the communication
// goroutines' waits, and aborts the group so that peers fail fast instead
// of waiting for a collective this rank will never issue. It returns the
// sticky error.
func (r *Reducer) fail(err error) error {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
		r.failed.Store(true)
		r.mu.Unlock()
		if r.cancel != nil {
			r.cancel()
		}
		r.c.Abort(err)
		// Wake a Wait blocked on another goroutine: the finisher may
		// stop without reducing the last bucket (a collective the
		// backend leaves in flight after Abort), and Wait re-checks
		// usable() after every wake-up.
		r.signal()
		return err
	}
	err = r.err
	r.mu.Unlock()
	return err
}

// Err returns the sticky error that made the Reducer unusable, or nil.
func (r *Reducer) Err() error {
	if !r.failed.Load() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// bounded returns parent limited to Options.Timeout, for the collectives
// the Reducer waits for outside Wait's own loop (New's check, the
// rebuild, BroadcastParameters), and a function that marks an expiry of
// that limit (not of parent) as comm.ErrTimeout.
func bounded(parent context.Context, d time.Duration) (context.Context, context.CancelFunc, func(error) error) {
	ctx, cancel := context.WithTimeout(parent, d)
	explain := func(err error) error {
		if err != nil && parent.Err() == nil && ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w after Options.Timeout %v: %w", comm.ErrTimeout, d, err)
		}
		return err
	}
	return ctx, cancel, explain
}

// ctxErr is ctx's error, with its cause (context.WithCancelCause: the
// signal that interrupted a program, say) where it has one.
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err || errors.Is(cause, err) {
		return cause
	}
	return fmt.Errorf("%w: %w", err, cause)
}

func (r *Reducer) usable() error {
	if r.closed.Load() {
		return ErrClosed
	}
	if r.failed.Load() {
		return r.Err()
	}
	return nil
}

// settle returns blocks to the pool once the collectives in works, which
// may write them, have completed. If some are still pending it aborts the
// group (the contract then bounds how long they take to complete) and
// waits up to Options.DrainTimeout. Blocks whose collectives are pending
// even then are handed to the reaper: kept out of the pool, on purpose,
// until those complete, never reused while they may still write them; the
// error returned (and logged) wraps ErrInFlight and says so.
func (r *Reducer) settle(works []comm.Work, blocks []allocator.Block, what string) error {
	pending := 0
	for _, w := range works {
		if done, _ := w.Test(); !done {
			pending++
		}
	}
	if pending > 0 {
		r.c.Abort(fmt.Errorf("ddp: rank %d: releasing the memory of %s", r.c.Rank(), what))
		ctx, cancel := context.WithTimeout(context.Background(), r.o.DrainTimeout)
		pending = 0
		for _, w := range works {
			if w.Wait(ctx) != nil {
				if done, _ := w.Test(); !done {
					pending++
				}
			}
		}
		cancel()
	}
	if pending > 0 {
		bytes := 0
		for _, b := range blocks {
			bytes += b.Size()
		}
		err := fmt.Errorf("%w: rank %d: %d of %d %s still pending %v after the group was aborted: "+
			"their %d blocks (%d bytes) stay out of the pool until they complete, and are never reused while they may write them",
			ErrInFlight, r.c.Rank(), pending, len(works), what, r.o.DrainTimeout, len(blocks), bytes)
		log.Print(err)
		r.reap.hold(works, blocks, err)
		return err
	}
	var first error
	for _, b := range blocks {
		if err := r.pool.Put(b); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// reaper returns memory held back by settle once its collectives complete,
// on a goroutine of its own that exits when nothing is held. It waits at
// most Options.Timeout for each set; a set whose collectives do not
// complete by then stays out of the pool for good, and an owned pool is
// then never closed (never unmapped while a collective may write it).
type reaper struct {
	r         *Reducer
	mu        sync.Mutex
	sets      []held
	running   bool
	closePend bool // close the owned pool once nothing is held
	gaveUp    bool
}

type held struct {
	works  []comm.Work
	blocks []allocator.Block
	err    error
}

func (rp *reaper) hold(works []comm.Work, blocks []allocator.Block, err error) {
	rp.mu.Lock()
	rp.sets = append(rp.sets, held{works, blocks, err})
	start := !rp.running
	rp.running = true
	rp.mu.Unlock()
	if start {
		go rp.run()
	}
}

func (rp *reaper) run() {
	r := rp.r
	for {
		rp.mu.Lock()
		if len(rp.sets) == 0 {
			rp.running = false
			closePool := rp.closePend && !rp.gaveUp
			rp.closePend = false
			rp.mu.Unlock()
			if closePool {
				r.pool.Close()
			}
			return
		}
		h := rp.sets[0]
		rp.sets = rp.sets[1:]
		rp.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), r.o.Timeout)
		ok := true
		for _, w := range h.works {
			if w.Wait(ctx) != nil {
				if done, _ := w.Test(); !done {
					ok = false
				}
			}
		}
		cancel()
		if !ok {
			log.Printf("%v; still pending after a further %v: that memory stays out of the pool for good", h.err, r.o.Timeout)
			rp.mu.Lock()
			rp.gaveUp = true
			rp.mu.Unlock()
			continue
		}
		for _, b := range h.blocks {
			r.pool.Put(b)
		}
	}
}

// closePool closes the Reducer's own pool, at once if nothing is held,
// else when the reaper is done.
func (rp *reaper) closePool() error {
	rp.mu.Lock()
	if rp.running {
		rp.closePend = true
		rp.mu.Unlock()
		return nil
	}
	gaveUp := rp.gaveUp
	rp.mu.Unlock()
	if gaveUp {
		return nil
	}
	return rp.r.pool.Close()
}
