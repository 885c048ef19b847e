//go:build cgo

package nccl

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// TestParkedWaitCompletes: a Wait that has parked on the ring is
// completed by the watchdog, which polls the events while a Wait sleeps
// (the ring's Parker), not only every Config.PollInterval: here an hour.
func TestParkedWaitCompletes(t *testing.T) {
	standInOnly(t)
	c := newGroup(t, 1, func(cfg *Config) { cfg.PollInterval = time.Hour })[0]
	var open sync.Once
	gate := si.Gate(c.stream)
	t.Cleanup(func() { open.Do(gate.Open) })

	b := floats(t, 4, 1)
	w := c.AllReduce(b, b, comm.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- w.Wait(ctx) }()
	for c.ops.Waiting() == 0 {
		runtime.Gosched()
	}
	open.Do(gate.Open)
	if err := <-res; err != nil {
		t.Fatalf("a parked Wait after its operation completed on the stream: %v", err)
	}
}

// TestGroupBeyondRing: a group holds at most backend.RingSize operations
// (they take ring slots, and are launched only at GroupEnd): one more
// fails at once with ErrInvalid instead of waiting for a slot that only
// the group's own launch would free; the group itself launches and
// completes.
func TestGroupBeyondRing(t *testing.T) {
	c := newGroup(t, 1, nil)[0]
	b := floats(t, 4, 1)
	c.GroupStart()
	ws := make([]comm.Work, backend.RingSize)
	for i := range ws {
		ws[i] = c.AllReduce(b, b, comm.Sum)
	}
	over := c.AllReduce(b, b, comm.Sum)
	if done, err := over.Test(); !done || !errors.Is(err, comm.ErrInvalid) {
		t.Errorf("operation %d of a group: done %v, %v; want ErrInvalid at once", backend.RingSize+1, done, err)
	}
	if err := c.GroupEnd(); err != nil {
		t.Fatalf("GroupEnd: %v", err)
	}
	waitOK(t, ws...)
	// The ring goes on past the group.
	waitOK(t, c.AllReduce(b, b, comm.Sum))
}
