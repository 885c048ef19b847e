package comm

import (
	"context"
	"fmt"
	"log"
	"runtime"
	"time"
)

// The watchdog's defaults, PyTorch's and NCCL's orders of magnitude: a
// stall is worth a line in the log after a minute, and a collective that
// has not completed in ten minutes will not.
const (
	DefaultStallInterval = 60 * time.Second
	DefaultTimeout       = 10 * time.Minute
)

// Watchdog says how a wait for peers is watched: after StallInterval the
// waiter reports a Stall, and again after every further interval; after
// Timeout the wait fails with ErrTimeout (what then happens to the group,
// an abort for most waiters, is the waiter's decision). The zero value
// gives the defaults. Backends (inproc's waits, a cgo backend's progress
// loop) and the reducer share it, so every wait in ddpgo reports and gives
// up alike.
//
// Watchdog is configuration; Start returns the Watch of one wait, which
// holds no goroutine and reads no clock: the waiter passes the time to
// Check and parks until Next, so the logic is deterministic under test.
type Watchdog struct {
	// StallInterval is how long a wait lasts before a stall is reported,
	// and then how often the report repeats. Zero means
	// DefaultStallInterval.
	StallInterval time.Duration
	// Timeout is how long a wait lasts before it fails with ErrTimeout.
	// Zero means DefaultTimeout.
	Timeout time.Duration
	// OnStall receives stall reports, on the waiting goroutine; it must
	// not block for long. Nil logs them with the standard logger.
	OnStall func(Stall)
}

// Validate reports a negative StallInterval or Timeout as ErrInvalid,
// naming the field and its value.
func (d Watchdog) Validate() error {
	switch {
	case d.StallInterval < 0:
		return fmt.Errorf("%w: watchdog StallInterval %v is negative", ErrInvalid, d.StallInterval)
	case d.Timeout < 0:
		return fmt.Errorf("%w: watchdog Timeout %v is negative", ErrInvalid, d.Timeout)
	}
	return nil
}

// WithDefaults returns d with a zero (or negative) StallInterval or
// Timeout replaced by its default.
func (d Watchdog) WithDefaults() Watchdog {
	if d.StallInterval <= 0 {
		d.StallInterval = DefaultStallInterval
	}
	if d.Timeout <= 0 {
		d.Timeout = DefaultTimeout
	}
	return d
}

// Report hands s to OnStall, or logs it when OnStall is nil.
func (d Watchdog) Report(s Stall) {
	if d.OnStall != nil {
		d.OnStall(s)
		return
	}
	log.Print(s.String())
}

// Start begins watching a wait that began at now.
func (d Watchdog) Start(now time.Time) Watch {
	d = d.WithDefaults()
	return Watch{dog: d, start: now, report: now.Add(d.StallInterval), deadline: now.Add(d.Timeout)}
}

// Watch is the state of one watched wait (see Watchdog.Start). Its zero
// value is not usable.
type Watch struct {
	dog                     Watchdog
	start, report, deadline time.Time
}

// Check returns what is due at now. report is true when a stall report is
// due; the next one is then scheduled a StallInterval later, past now, so
// a waiter that woke late reports once, not once per missed interval.
// expired is true once Timeout has passed since the start. Both can be
// true at once: a waiter that reports when report is set and fails when
// expired is set therefore reports a stall before every timeout whenever
// StallInterval is not longer than Timeout, however late it wakes.
func (w *Watch) Check(now time.Time) (report, expired bool) {
	if !now.Before(w.report) {
		report = true
		for !now.Before(w.report) {
			w.report = w.report.Add(w.dog.StallInterval)
		}
	}
	return report, !now.Before(w.deadline)
}

// Next returns how long after now the next stall report or the deadline
// falls, whichever is first; zero if one is already due.
func (w *Watch) Next(now time.Time) time.Duration {
	next := w.report
	if w.deadline.Before(next) {
		next = w.deadline
	}
	return max(next.Sub(now), 0)
}

// Waited returns how long the wait has lasted at now.
func (w *Watch) Waited(now time.Time) time.Duration { return now.Sub(w.start) }

// Watchdog returns the configuration the wait is watched with, defaults
// filled in, for its Report.
func (w *Watch) Watchdog() Watchdog { return w.dog }

// Wait polls a Work, yielding the processor between polls, for up to
// pollTime and pollMax polls before it waits on the Work with a deadline:
// a short collective then costs no timer and no allocation. The count
// bounds the polling where the clock stands still while goroutines run
// (testing/synctest).
const (
	pollTime = 50 * time.Microsecond
	pollMax  = 4096
)

// Wait waits for w, an operation of c, under the watchdog. After every
// StallInterval it reports the Stall s, which the caller has filled with
// what it knows (its rank, the sequence number and kind of the operation
// it waits for, a Detail), with Waited set and, when s.Missing is nil,
// with the ranks c reports missing from w (MissingRanks). After Timeout it
// returns that Stall's TimeoutError; it does not abort c, which is the
// caller's decision. It returns w's error when w completes, or ctx's,
// wrapped, when ctx ends first (w then stays pending and its memory the
// backend's).
func (d Watchdog) Wait(ctx context.Context, c Communicator, w Work, s Stall) error {
	start := time.Now()
	for i := 0; ; i++ {
		if done, err := w.Test(); done {
			return err
		}
		if i == pollMax || i%16 == 15 && time.Since(start) > pollTime {
			break
		}
		runtime.Gosched()
	}
	watch := d.Start(start)
	for {
		now := time.Now()
		report, expired := watch.Check(now)
		if report || expired {
			s := s
			s.Waited = watch.Waited(now)
			if s.Missing == nil {
				s.Missing = MissingRanks(c, w)
			}
			if report {
				watch.dog.Report(s)
			}
			if expired {
				if done, err := w.Test(); done {
					return err
				}
				return s.TimeoutError()
			}
		}
		wctx, cancel := context.WithTimeout(ctx, watch.Next(time.Now()))
		err := w.Wait(wctx)
		interrupted := wctx.Err() != nil
		cancel()
		if !interrupted {
			return err
		}
		if done, werr := w.Test(); done {
			return werr
		}
		if ctx.Err() != nil {
			return fmt.Errorf("comm: rank %d waiting %s: %w", s.Rank, s.what(), context.Cause(ctx))
		}
	}
}
