package backend

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Waiters is a set of parked goroutines that Notify wakes. Each waiter has
// a channel of its own, kept for reuse, so parking allocates nothing once
// warm; Notify costs one atomic load while nobody is parked. The zero
// value is an empty set.
type Waiters struct {
	n     atomic.Int32
	mu    sync.Mutex
	chans []chan struct{}
	spare []chan struct{}
}

// Add registers a waiter and returns the channel Notify signals. The
// waiter must look at what it waits for after Add and before each
// receive, and call Drop when done.
func (w *Waiters) Add() chan struct{} {
	w.mu.Lock()
	var ch chan struct{}
	if n := len(w.spare); n > 0 {
		ch = w.spare[n-1]
		w.spare = w.spare[:n-1]
	} else {
		ch = make(chan struct{}, 1)
	}
	w.chans = append(w.chans, ch)
	w.n.Add(1)
	w.mu.Unlock()
	return ch
}

// Drop unregisters the waiter of ch and keeps ch for reuse. It panics if
// ch is not registered (dropped twice, or not from Add): kept twice, the
// channel would later be handed to two waiters, and Notify would wake
// only one of them.
func (w *Waiters) Drop(ch chan struct{}) {
	w.mu.Lock()
	i := slices.Index(w.chans, ch)
	if i < 0 {
		w.mu.Unlock()
		panic("backend: Waiters.Drop of a channel not registered (dropped twice, or not from Add)")
	}
	last := len(w.chans) - 1
	w.chans[i] = w.chans[last]
	w.chans[last] = nil
	w.chans = w.chans[:last]
	select {
	case <-ch:
	default:
	}
	w.spare = append(w.spare, ch)
	w.n.Add(-1)
	w.mu.Unlock()
}

// Notify wakes every registered waiter. While there are none it costs one
// atomic load, inlined.
func (w *Waiters) Notify() {
	if w.n.Load() != 0 {
		w.notify()
	}
}

func (w *Waiters) notify() {
	w.mu.Lock()
	for _, ch := range w.chans {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	w.mu.Unlock()
}

// Len returns the number of registered waiters.
func (w *Waiters) Len() int { return int(w.n.Load()) }
