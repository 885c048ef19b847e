package comm_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// A Buffer describes memory it does not own: a Go slice's here, which a
// pure-Go backend such as inproc accepts (a cgo backend needs CommPool
// memory, package allocator).
func ExampleFloat32s() {
	grads := []float32{0.5, 1, 1.5, 2}
	b := comm.Float32s(grads)
	fmt.Println(b.Count, b.DType, b.Bytes())

	// A sub-buffer shares the slice's memory.
	tail := b.Slice(2, 2)
	tail.AsFloat32()[0] = 9
	fmt.Println(tail.Count, grads)
	// Output:
	// 4 float 16
	// 2 [0.5 1 9 2]
}

// Collectives are asynchronous: every rank issues its call, and waits for
// the Work later. One goroutine may drive both ranks of a group, as here,
// because issuing never waits for the peers.
func ExampleCommunicator() {
	ctx := context.Background()
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()

	send := [][]float32{{1, 2, 3}, {10, 20, 30}}
	recv := [][]float32{make([]float32, 3), make([]float32, 3)}
	works := make([]comm.Work, len(comms))
	for r, c := range comms {
		works[r] = c.AllReduce(comm.Float32s(send[r]), comm.Float32s(recv[r]), comm.Sum)
	}
	for r, w := range works {
		// The memory is the backend's until the Work completes.
		if err := w.Wait(ctx); err != nil {
			panic(err)
		}
		fmt.Printf("rank %d: operation #%d: %v\n", r, w.ID(), recv[r])
	}
	// Output:
	// rank 0: operation #1: [11 22 33]
	// rank 1: operation #1: [11 22 33]
}

// Ranks that issue different collectives at the same sequence number all
// fail with comm.ErrMismatch, each naming the rank that differs, never a
// hang or a silent garbage result (on a backend whose Caps claim
// MismatchDetection).
func ExampleErrMismatch() {
	ctx := context.Background()
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	fmt.Println(comm.CapsOf(comms[0]).MismatchDetection)

	// Rank 1 reduces three elements where rank 0 reduces two.
	a, b := make([]float32, 2), make([]float32, 3)
	w0 := comms[0].AllReduce(comm.Float32s(a), comm.Float32s(a), comm.Sum)
	w1 := comms[1].AllReduce(comm.Float32s(b), comm.Float32s(b), comm.Sum)
	err0, err1 := w0.Wait(ctx), w1.Wait(ctx)
	fmt.Println(errors.Is(err0, comm.ErrMismatch), errors.Is(err1, comm.ErrMismatch))

	var oe *comm.OpError
	if errors.As(err1, &oe) {
		fmt.Println(oe.Rank, oe.Seq, oe.Kind, oe.Count)
	}
	fmt.Println(err1)
	// Output:
	// true
	// true true
	// 1 1 all_reduce 3
	// comm: rank 1: all_reduce #1 (3 x float): comm: collective mismatch between ranks: collective #1: rank(s) [1] differ from rank(s) [0]; rank 0: all_reduce(sum, 2 x float) (seq 1); rank 1: all_reduce(sum, 3 x float) (seq 1)
}

// The zero Work is complete with no error, and FailedWork has completed
// with its error: what a function that issues nothing, or refuses at
// once, returns in place of a collective's Work.
func ExampleWork() {
	var w comm.Work
	done, err := w.Test()
	fmt.Println(done, err, w.Wait(context.Background()))

	w = comm.FailedWork(fmt.Errorf("bucket 3: %w", comm.ErrClosed))
	done, err = w.Test()
	fmt.Println(done, errors.Is(err, comm.ErrClosed))
	// Output:
	// true <nil> <nil>
	// true true
}

// A Call is one rank's side of a collective as mismatch reports name it.
func ExampleCall_String() {
	fmt.Println(comm.Call{Kind: comm.KindAllReduce, Op: comm.Avg, DType: comm.BFloat16, Count: 1024, Seq: 12})
	fmt.Println(comm.Call{Kind: comm.KindBroadcast, DType: comm.Float32, Count: 7, Root: 0, Seq: 5})
	// Output:
	// all_reduce(avg, 1024 x bfloat16) (seq 12)
	// broadcast(root 0, 7 x float) (seq 5)
}

// MismatchError is the message every rank builds from every rank's call:
// the odd rank is named as the odd one, whatever its number.
func ExampleMismatchError() {
	call := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum, DType: comm.Float32, Count: 4096, Seq: 9}
	odd := call
	odd.Count = 4095
	err := comm.MismatchError(9, []comm.Call{call, call, odd, call})
	fmt.Println(errors.Is(err, comm.ErrMismatch))
	fmt.Println(err)
	fmt.Println(comm.MismatchError(9, []comm.Call{call, call}))
	// Output:
	// true
	// comm: collective mismatch between ranks: collective #9: rank(s) [2] differ from rank(s) [0 1 3]; rank 0: all_reduce(sum, 4096 x float) (seq 9); rank 1: all_reduce(sum, 4096 x float) (seq 9); rank 2: all_reduce(sum, 4095 x float) (seq 9); rank 3: all_reduce(sum, 4096 x float) (seq 9)
	// <nil>
}

// A Stall is what a watchdog reports of a wait that has lasted too long:
// here inproc's, which can tell which ranks have not joined.
func ExampleStall_String() {
	s := comm.Stall{Rank: 0, Seq: 41, Kind: comm.KindAllReduce, Missing: []int{3}, Waited: 61 * time.Second, Detail: "step 7, bucket 2"}
	fmt.Println(s)
	s.Missing = nil // MPI and NCCL cannot tell
	fmt.Println(s.TimeoutError())
	// Output:
	// comm: rank 0 has waited 1m1s in all_reduce #41 for rank(s) [3]: step 7, bucket 2
	// comm: collective timed out after 1m1s: rank 0 waited in all_reduce #41 (the backend cannot tell which ranks have not joined): step 7, bucket 2
}

// Bus bandwidth, as nccl-tests reports it, makes a measurement comparable
// across group sizes: an all-reduce moves 2(n-1)/n times its bytes over
// each rank's link. Here 100 MB took 10 ms: 10 GB/s of algorithm bandwidth.
func ExampleBusBW() {
	for _, n := range []int{2, 4, 8} {
		fmt.Printf("%d ranks: factor %.3f, %.1f GB/s\n", n, comm.BusBWFactor(comm.KindAllReduce, n),
			comm.BusBW(comm.KindAllReduce, n, 100e6, 10*time.Millisecond))
	}
	// Output:
	// 2 ranks: factor 1.000, 10.0 GB/s
	// 4 ranks: factor 1.500, 15.0 GB/s
	// 8 ranks: factor 1.750, 17.5 GB/s
}
