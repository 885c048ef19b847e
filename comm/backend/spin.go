package backend

import (
	"runtime"
	"time"
)

// Spinning: a wait first polls PureSpins times, then yields the processor
// between polls for up to SpinTime, then parks. (Polling longer without
// yielding is slower on a loaded machine: the goroutine the waiter waits
// for may need this processor.)
const (
	PureSpins = 64
	SpinTime  = 50 * time.Microsecond
)

// Spinner paces one busy wait; its zero value starts one.
type Spinner struct {
	// Brief makes the wait park after the first PureSpins polls, without
	// yielding: for a wait that expects nothing soon.
	Brief bool

	i     int
	start time.Time
}

// Spin is called after each poll that found nothing; it returns false
// once the caller should park.
func (s *Spinner) Spin() bool {
	s.i++
	switch {
	case s.i < PureSpins:
		return true
	case s.Brief:
		return false
	case s.i == PureSpins:
		s.start = time.Now()
	case s.i%16 == 0 && time.Since(s.start) >= SpinTime:
		return false
	}
	runtime.Gosched()
	return true
}

// Started returns when the spinner began to yield: the start of the wait,
// to within the pure spins, once Spin has returned false.
func (s *Spinner) Started() time.Time { return s.start }
