package commtest

import (
	"context"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
)

// Stuck wraps c so that its all-reduces never complete until the rank is
// aborted, as a peer that never joins would leave them: for tests of
// stall reports, deadlines and the release of memory after an abort. The
// all-reduce writes nothing. Every other method is c's.
func Stuck(c comm.Communicator) comm.Communicator {
	return &stuckComm{Communicator: c, aborted: make(chan struct{})}
}

type stuckComm struct {
	comm.Communicator
	once    sync.Once
	aborted chan struct{}
}

func (c *stuckComm) AllReduce(_, _ comm.Buffer, _ comm.Op) comm.Work {
	return comm.NewWork(stuck{c.aborted}, 1)
}

func (c *stuckComm) Abort(err error) {
	c.once.Do(func() { close(c.aborted) })
	c.Communicator.Abort(err)
}

type stuck struct{ aborted chan struct{} }

func (s stuck) WaitOp(ctx context.Context, _ uint64) error {
	select {
	case <-s.aborted:
		return comm.ErrAborted
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s stuck) TestOp(uint64) (bool, error) {
	select {
	case <-s.aborted:
		return true, comm.ErrAborted
	default:
		return false, nil
	}
}
