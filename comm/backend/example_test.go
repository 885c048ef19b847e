package backend_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/backend"
)

// loopback is a complete backend for a group of one rank, the smallest
// that meets the comm contract: its collectives are copies from send to
// recv (or nothing, in place), run by a worker goroutine in issue order.
// It is where a new backend starts: keep the ring, the rules and the
// issuing; replace run's copy by the transport. TestLoopbackConformance
// runs comm/commtest's suite against it.
type loopback struct {
	mu     sync.Mutex // orders the issues
	closed bool       // under mu
	ops    backend.Ring[op]
	rules  backend.Rules
	queue  chan uint64 // published operations, for the worker
	exited chan struct{}
	failed atomic.Pointer[error] // set by Abort or Close; fails later operations
}

// op is the descriptor of one operation: what the worker needs to run it.
type op struct {
	call       comm.Call
	send, recv comm.Buffer
	err        error // the argument error, if the call is invalid
}

func newLoopback() *loopback {
	c := &loopback{
		rules: backend.Rules{Rank: 0, Size: 1, HostOnly: true},
		// The ring holds at most RingSize pending operations, so the
		// issuer never blocks on the queue.
		queue:  make(chan uint64, backend.RingSize),
		exited: make(chan struct{}),
	}
	// No Config.Hooks: the worker completes every operation on its own,
	// so Test and Wait need no Advancer or Parker.
	c.ops.Init(backend.Config{Backend: "loopback", Rank: 0})
	go c.run()
	return c
}

func (c *loopback) Rank() int { return 0 }
func (c *loopback) Size() int { return 1 }

func (c *loopback) AllReduce(send, recv comm.Buffer, o comm.Op) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindAllReduce, Op: o, Count: send.Count}, send, recv)
}
func (c *loopback) Broadcast(buf comm.Buffer, root int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindBroadcast, Root: root, Count: buf.Count}, buf, buf)
}
func (c *loopback) Reduce(send, recv comm.Buffer, o comm.Op, root int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindReduce, Op: o, Root: root, Count: send.Count}, send, recv)
}
func (c *loopback) AllGather(send, recv comm.Buffer) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindAllGather, Count: send.Count}, send, recv)
}
func (c *loopback) ReduceScatter(send, recv comm.Buffer, o comm.Op) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindReduceScatter, Op: o, Count: recv.Count}, send, recv)
}

// Send and Recv have no peer in a group of one: Rules.Check refuses them.
func (c *loopback) Send(buf comm.Buffer, peer int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindSend, Root: peer, Count: buf.Count}, buf, buf)
}
func (c *loopback) Recv(buf comm.Buffer, peer int) comm.Work {
	return c.issue(comm.Call{Kind: comm.KindRecv, Root: peer, Count: buf.Count}, buf, buf)
}
func (c *loopback) Barrier() comm.Work {
	return c.issue(comm.Call{Kind: comm.KindBarrier}, comm.Buffer{}, comm.Buffer{})
}

// issue checks the call, gives it the next sequence number and hands it to
// the worker. An invalid call is issued too, and fails in its turn, so
// that sequence numbers stay those of the rank's calls.
func (c *loopback) issue(call comm.Call, send, recv comm.Buffer) comm.Work {
	call.DType = send.DType
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return comm.FailedWork(&comm.OpError{Kind: call.Kind, Count: call.Count, DType: call.DType, Err: comm.ErrClosed})
	}
	seq := c.ops.Reserve(c) // waits while RingSize operations are pending
	call.Seq = seq
	d := c.ops.Op(seq)
	*d = op{call: call, send: send, recv: recv}
	d.err = c.rules.Check(&d.call, &d.send, &d.recv).Err(call, 1)
	c.ops.Publish(seq) // Test and Wait now accept seq
	c.queue <- seq
	return comm.NewWork(c, seq)
}

// run is the transport: it runs each published operation and completes
// it. A real one starts the operation here (messages to the peers, a
// kernel on a stream) and calls Complete, perhaps from another goroutine,
// once the operation's buffers are no longer touched.
func (c *loopback) run() {
	defer close(c.exited)
	for seq := range c.queue {
		d := c.ops.Op(seq) // valid until Complete
		err := d.err
		if f := c.failed.Load(); err == nil && f != nil {
			err = *f
		}
		if err == nil && !comm.InPlace(d.send, d.recv) {
			copy(d.recv.AsBytes(), d.send.AsBytes()) // the whole collective, for one rank
		}
		if err != nil {
			err = &comm.OpError{Seq: seq, Kind: d.call.Kind, Count: d.call.Count, DType: d.call.DType, Err: err}
		}
		c.ops.Complete(seq, err) // wakes the Waits
	}
}

// TestOp and WaitOp make loopback the comm.Waiter behind its Works.
func (c *loopback) TestOp(id uint64) (bool, error)              { return c.ops.Test(id) }
func (c *loopback) WaitOp(ctx context.Context, id uint64) error { return c.ops.Wait(ctx, id) }

// Abort fails every operation the worker has not started, and every later
// one; the copy under way, if any, ends first.
func (c *loopback) Abort(err error) {
	if err == nil {
		err = errors.New("no cause given")
	}
	e := fmt.Errorf("loopback: %w: %w", comm.ErrAborted, err)
	c.failed.CompareAndSwap(nil, &e)
}

// Close fails the pending operations with comm.ErrClosed, unless an Abort
// came first, and returns once the worker has exited.
func (c *loopback) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		e := fmt.Errorf("loopback: %w", comm.ErrClosed)
		c.failed.CompareAndSwap(nil, &e)
		close(c.queue)
		<-c.exited
	}
	return nil
}

// A program uses the backend through comm.Communicator alone.
func Example() {
	ctx := context.Background()
	var c comm.Communicator = newLoopback()
	defer c.Close()

	send, recv := []float32{1, 2, 3}, make([]float32, 3)
	w := c.AllReduce(comm.Float32s(send), comm.Float32s(recv), comm.Sum)
	err := w.Wait(ctx)
	fmt.Println(w.ID(), err, recv)

	// An invalid call fails through its Work, in its turn.
	err = c.Broadcast(comm.Float32s(send), 1).Wait(ctx)
	fmt.Println(errors.Is(err, comm.ErrInvalid))
	fmt.Println(err)

	// After Abort, every operation fails.
	c.Abort(errors.New("lost the network"))
	err = c.AllReduce(comm.Float32s(send), comm.Float32s(recv), comm.Sum).Wait(ctx)
	fmt.Println(errors.Is(err, comm.ErrAborted))
	fmt.Println(err)
	// Output:
	// 1 <nil> [1 2 3]
	// true
	// comm: rank 0: broadcast #2 (3 x float): comm: invalid argument: broadcast: root 1 out of range for 1 ranks
	// true
	// comm: rank 0: all_reduce #3 (3 x float): loopback: comm: group aborted: lost the network
}
