package bench

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// A run's communicators are either every rank of the group, each driven
// by a goroutine of this process (inproc), or the one rank this process
// runs of a job launched with a process per rank (mpirun). In the second
// case the statistics that cover all ranks are gathered through the
// communicator itself: a small AllGather in pool memory, outside the
// timed region, never through files.

// worldOf returns the number of ranks of the group comms belong to, and
// whether this process runs only one of them.
func worldOf(comms []comm.Communicator) (size int, launched bool, err error) {
	if len(comms) == 0 {
		return 0, false, fmt.Errorf("%w: no ranks", ErrConfig)
	}
	size = comms[0].Size()
	switch {
	case len(comms) == size:
		return size, false, nil
	case len(comms) == 1:
		return size, true, nil
	}
	return 0, false, fmt.Errorf("%w: %d communicators of a group of %d ranks: give every rank (one process) or one (a process per rank)", ErrConfig, len(comms), size)
}

// exchange gathers k float64 values from every rank of a group with one
// AllGather over the group's own communicator, in pool memory.
type exchange struct {
	c          comm.Communicator
	k, n       int
	pool       *allocator.Pool
	sendB      allocator.Block
	recvB      allocator.Block
	send, recv []float64
	leaked     bool // an AllGather may still write recv: never return it
	// dog, where watched, reports a gather that waits past its stall
	// interval and ends it at its timeout, as the reducer does its
	// collectives: a peer that stops between steps is reported too.
	dog     comm.Watchdog
	watched bool
	detail  string
}

func newExchange(c comm.Communicator, k int) (*exchange, error) {
	n := c.Size()
	pool, err := allocator.New(allocator.Options{SlabSize: 1 << 20, Limit: 4 << 20})
	if err != nil {
		return nil, fmt.Errorf("bench: rank %d: a CommPool for gathering statistics: %w", c.Rank(), err)
	}
	e := &exchange{c: c, k: k, n: n, pool: pool}
	if e.sendB, err = pool.Get(8 * k); err == nil {
		e.recvB, err = pool.Get(8 * k * n)
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("bench: rank %d: %d statistics of %d ranks: %w", c.Rank(), k, n, err)
	}
	e.send = unsafe.Slice((*float64)(e.sendB.Addr()), k)
	e.recv = unsafe.Slice((*float64)(e.recvB.Addr()), k*n)
	return e, nil
}

// watch has gather report its stalls and end at the timeout of d (with
// its defaults filled in), saying detail of what it gathers.
func (e *exchange) watch(d comm.Watchdog, detail string) {
	e.dog, e.watched, e.detail = d.WithDefaults(), true, detail
}

// gather sends vals (k of them) and returns every rank's, rank r's at
// [r*k, (r+1)*k). The result is valid until the next gather.
func (e *exchange) gather(ctx context.Context, vals ...float64) ([]float64, error) {
	copy(e.send, vals)
	w := e.c.AllGather(comm.HostBuffer(e.sendB.Addr(), e.k, comm.Float64), comm.HostBuffer(e.recvB.Addr(), e.k*e.n, comm.Float64))
	var err error
	if e.watched {
		err = e.dog.Wait(ctx, e.c, w, comm.Stall{Rank: e.c.Rank(), Seq: w.ID(), Kind: comm.KindAllGather, Detail: e.detail})
	} else {
		err = w.Wait(ctx)
	}
	if err != nil {
		if done, _ := w.Test(); !done {
			e.leaked = true
		}
		return nil, fmt.Errorf("bench: rank %d: gathering statistics from %d ranks: %w", e.c.Rank(), e.n, err)
	}
	return e.recv, nil
}

func (e *exchange) close() {
	if e.leaked {
		return // the pool stays mapped: the backend may still write it
	}
	e.pool.Put(e.sendB)
	e.pool.Put(e.recvB)
	e.pool.Close()
}

// Host is where one rank of a group runs.
type Host struct {
	Rank int
	Name string // host name, at most HostNameMax bytes
	PID  int
}

// HostNameMax is the longest host name Hosts reports (longer ones are
// cut).
const HostNameMax = 48

// Hosts returns the host name and process id of every rank of c's group,
// gathered through c (a collective: every rank calls it). name and pid are
// this rank's.
func Hosts(ctx context.Context, c comm.Communicator, name string, pid int) ([]Host, error) {
	const k = 1 + HostNameMax/8
	e, err := newExchange(c, k)
	if err != nil {
		return nil, err
	}
	defer e.close()
	vals := make([]float64, k)
	vals[0] = float64(pid)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&vals[1])), HostNameMax)
	copy(raw, name)
	all, err := e.gather(ctx, vals...)
	if err != nil {
		return nil, err
	}
	out := make([]Host, c.Size())
	for r := range out {
		row := all[r*k : (r+1)*k]
		b := unsafe.Slice((*byte)(unsafe.Pointer(&row[1])), HostNameMax)
		end := 0
		for end < len(b) && b[end] != 0 {
			end++
		}
		out[r] = Host{Rank: r, Name: string(b[:end]), PID: int(row[0])}
	}
	return out, nil
}
