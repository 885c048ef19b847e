package ddp

import (
	"github.com/ddpgo/ddpgo/comm"
)

// soloComm is a one-rank communicator whose collectives complete at once
// and allocate nothing: with one rank, all-reduce and broadcast leave the
// buffer as it is and all-gather copies the rank's own contribution.
type soloComm struct{}

func (soloComm) Rank() int                                       { return 0 }
func (soloComm) Size() int                                       { return 1 }
func (soloComm) AllReduce(_, _ comm.Buffer, _ comm.Op) comm.Work { return comm.Work{} }
func (soloComm) Broadcast(comm.Buffer, int) comm.Work            { return comm.Work{} }
func (soloComm) Reduce(send, recv comm.Buffer, _ comm.Op, _ int) comm.Work {
	copy(recv.AsBytes(), send.AsBytes())
	return comm.Work{}
}
func (soloComm) AllGather(send, recv comm.Buffer) comm.Work {
	copy(recv.AsBytes(), send.AsBytes())
	return comm.Work{}
}
func (soloComm) ReduceScatter(send, recv comm.Buffer, _ comm.Op) comm.Work {
	copy(recv.AsBytes(), send.AsBytes())
	return comm.Work{}
}
func (soloComm) Send(comm.Buffer, int) comm.Work { return comm.FailedWork(comm.ErrInvalid) }
func (soloComm) Recv(comm.Buffer, int) comm.Work { return comm.FailedWork(comm.ErrInvalid) }
func (soloComm) Barrier() comm.Work              { return comm.Work{} }
func (soloComm) Abort(error)                     {}
func (soloComm) Close() error                    { return nil }
