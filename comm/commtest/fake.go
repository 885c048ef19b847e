package commtest

import (
	"context"
	"fmt"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
)

// Solo is a one-rank communicator whose collectives complete at once and
// allocate nothing: with one rank, all-reduce and broadcast leave the
// buffer as it is, and reduce, all-gather and reduce-scatter copy the
// rank's own contribution. Send and Recv fail with comm.ErrInvalid. Tests
// of code above comm embed it and override what they need (a slow or a
// held all-reduce).
type Solo struct{}

func (Solo) Rank() int                                       { return 0 }
func (Solo) Size() int                                       { return 1 }
func (Solo) AllReduce(_, _ comm.Buffer, _ comm.Op) comm.Work { return comm.Work{} }
func (Solo) Broadcast(comm.Buffer, int) comm.Work            { return comm.Work{} }
func (Solo) Reduce(send, recv comm.Buffer, _ comm.Op, _ int) comm.Work {
	copy(recv.AsBytes(), send.AsBytes())
	return comm.Work{}
}
func (Solo) AllGather(send, recv comm.Buffer) comm.Work {
	copy(recv.AsBytes(), send.AsBytes())
	return comm.Work{}
}
func (Solo) ReduceScatter(send, recv comm.Buffer, _ comm.Op) comm.Work {
	copy(recv.AsBytes(), send.AsBytes())
	return comm.Work{}
}
func (Solo) Send(comm.Buffer, int) comm.Work { return comm.FailedWork(comm.ErrInvalid) }
func (Solo) Recv(comm.Buffer, int) comm.Work { return comm.FailedWork(comm.ErrInvalid) }
func (Solo) Barrier() comm.Work              { return comm.Work{} }
func (Solo) Abort(error)                     {}
func (Solo) Close() error                    { return nil }

// FakeGroup is a minimal in-process group for tests of code above comm,
// with failures to inject: each collective completes when every rank has
// issued it, and the last rank to arrive computes the result. It starts
// no goroutine and reads no clock, so it runs inside a testing/synctest
// bubble, where a collective that never completes is seen at once. It
// carries what a Reducer issues (AllReduce Sum and Avg of float32, Sum of
// float16 and bfloat16, Broadcast, AllGather, Barrier); the rest fails
// with comm.ErrInvalid. It is not a backend: it allocates per collective
// and checks little (run a backend against the conformance suite).
type FakeGroup struct {
	n       int
	mu      sync.Mutex
	slots   map[uint64]*fakeSlot
	aborted chan struct{}
	abortE  error
	// FailSeq is a collective (numbered from 1 on every rank) that fails
	// on every rank with comm.ErrAborted; 0: none.
	FailSeq uint64
	// HangSeq is a collective that never completes, until an Abort; 0:
	// none.
	HangSeq uint64
}

type fakeSlot struct {
	kind  comm.Kind
	op    comm.Op
	bufs  []comm.Buffer
	sends []comm.Buffer
	root  int
	n     int
	done  chan struct{}
	err   error
}

type fakeComm struct {
	g    *FakeGroup
	rank int
	seq  uint64
}

// NewFakeGroup returns a group of n ranks and their communicators. Set
// FailSeq and HangSeq before the first collective.
func NewFakeGroup(n int) (*FakeGroup, []comm.Communicator) {
	g := &FakeGroup{n: n, slots: map[uint64]*fakeSlot{}, aborted: make(chan struct{})}
	cs := make([]comm.Communicator, n)
	for r := range cs {
		cs[r] = &fakeComm{g: g, rank: r}
	}
	return g, cs
}

func (c *fakeComm) Rank() int { return c.rank }
func (c *fakeComm) Size() int { return c.g.n }

func (c *fakeComm) issue(k comm.Kind, send, buf comm.Buffer, root int, op comm.Op) comm.Work {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	c.seq++
	s := g.slots[c.seq]
	if s == nil {
		s = &fakeSlot{kind: k, op: op, bufs: make([]comm.Buffer, g.n), sends: make([]comm.Buffer, g.n), root: root, done: make(chan struct{})}
		g.slots[c.seq] = s
	}
	if s.kind != k || s.bufs[0].Count != 0 && s.bufs[0].Count != buf.Count && k != comm.KindAllGather {
		s.err = fmt.Errorf("%w: seq %d", comm.ErrMismatch, c.seq)
	}
	s.bufs[c.rank], s.sends[c.rank] = buf, send
	s.n++
	if s.n == g.n && c.seq != g.HangSeq {
		if c.seq == g.FailSeq {
			s.err = fmt.Errorf("%w: injected failure of collective %d", comm.ErrAborted, c.seq)
		}
		if s.err == nil {
			s.err = s.compute()
		}
		close(s.done)
	}
	return comm.NewWork(c, c.seq)
}

func (s *fakeSlot) compute() error {
	switch s.kind {
	case comm.KindAllReduce:
		b0 := s.bufs[0]
		switch b0.DType {
		case comm.Float32:
			sum := make([]float32, b0.Count)
			for _, b := range s.sends {
				for i, v := range b.AsFloat32() {
					sum[i] += v
				}
			}
			if s.op == comm.Avg {
				for i := range sum {
					sum[i] /= float32(len(s.bufs))
				}
			}
			for _, b := range s.bufs {
				copy(b.AsFloat32(), sum)
			}
		case comm.Float16, comm.BFloat16:
			srcs := make([][]uint16, len(s.bufs))
			for r, b := range s.sends {
				srcs[r] = append([]uint16(nil), b.AsUint16()...)
			}
			out := make([]uint16, b0.Count)
			if b0.DType == comm.Float16 {
				fp16.SumHalf(out, srcs)
			} else {
				fp16.SumBFloat16(out, srcs)
			}
			for _, b := range s.bufs {
				copy(b.AsUint16(), out)
			}
		default:
			return fmt.Errorf("%w: fake all-reduce of %s", comm.ErrInvalid, b0.DType)
		}
	case comm.KindBroadcast:
		src := s.bufs[s.root].AsBytes()
		for r, b := range s.bufs {
			if r != s.root {
				copy(b.AsBytes(), src)
			}
		}
	case comm.KindAllGather:
		for _, b := range s.bufs {
			out := b.AsBytes()
			for r, snd := range s.sends {
				copy(out[r*snd.Bytes():], snd.AsBytes())
			}
		}
	}
	return nil
}

func (c *fakeComm) WaitOp(ctx context.Context, id uint64) error {
	c.g.mu.Lock()
	s := c.g.slots[id]
	c.g.mu.Unlock()
	select {
	case <-s.done:
		return s.err
	case <-c.g.aborted:
		return c.g.abortE
	case <-ctx.Done():
		return fmt.Errorf("fake collective %d: %w", id, ctx.Err())
	}
}

func (c *fakeComm) TestOp(id uint64) (bool, error) {
	c.g.mu.Lock()
	s := c.g.slots[id]
	c.g.mu.Unlock()
	select {
	case <-s.done:
		return true, s.err
	case <-c.g.aborted:
		return true, c.g.abortE
	default:
		return false, nil
	}
}

func (c *fakeComm) AllReduce(send, buf comm.Buffer, op comm.Op) comm.Work {
	if op != comm.Sum && op != comm.Avg {
		return comm.FailedWork(fmt.Errorf("%w: fake supports only sum and avg", comm.ErrInvalid))
	}
	return c.issue(comm.KindAllReduce, send, buf, 0, op)
}
func (c *fakeComm) Broadcast(buf comm.Buffer, root int) comm.Work {
	return c.issue(comm.KindBroadcast, buf, buf, root, 0)
}
func (c *fakeComm) AllGather(send, recv comm.Buffer) comm.Work {
	return c.issue(comm.KindAllGather, send, recv, 0, 0)
}
func (c *fakeComm) Reduce(send, recv comm.Buffer, op comm.Op, root int) comm.Work {
	return comm.FailedWork(comm.ErrInvalid)
}
func (c *fakeComm) ReduceScatter(send, recv comm.Buffer, op comm.Op) comm.Work {
	return comm.FailedWork(comm.ErrInvalid)
}
func (c *fakeComm) Send(buf comm.Buffer, peer int) comm.Work { return comm.FailedWork(comm.ErrInvalid) }
func (c *fakeComm) Recv(buf comm.Buffer, peer int) comm.Work { return comm.FailedWork(comm.ErrInvalid) }
func (c *fakeComm) Barrier() comm.Work {
	return c.issue(comm.KindBarrier, comm.Buffer{}, comm.Buffer{}, 0, 0)
}
func (c *fakeComm) Abort(err error) {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.abortE == nil {
		g.abortE = fmt.Errorf("%w: %w", comm.ErrAborted, err)
		close(g.aborted)
	}
}
func (c *fakeComm) Close() error { return nil }
