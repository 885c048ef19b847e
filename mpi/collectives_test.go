//go:build mpi && cgo

package mpi_test

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/mpi"
)

// value is element j of rank r's input: a small integer, so every sum over
// a few ranks is exact in every dtype and the expected result is computed
// exactly.
func value(dt comm.DType, r, j int) float64 {
	if dt == comm.Uint8 {
		return float64((r + j) % 5)
	}
	return float64((r*7+j*3)%11 - 5)
}

func reduceValues(dt comm.DType, op comm.Op, n, j int, v func(r int) float64) float64 {
	x := v(0)
	for r := 1; r < n; r++ {
		switch op {
		case comm.Sum, comm.Avg:
			x += v(r)
		case comm.Max:
			x = max(x, v(r))
		case comm.Min:
			x = min(x, v(r))
		}
	}
	if op == comm.Avg {
		x /= float64(n)
		if !dt.IsFloat() {
			x = math.Trunc(x)
		}
	}
	return x
}

func set(b comm.Buffer, i int, x float64) {
	p := unsafe.Add(b.Addr, i*b.DType.Size())
	switch b.DType {
	case comm.Float32:
		*(*float32)(p) = float32(x)
	case comm.Float64:
		*(*float64)(p) = x
	case comm.Float16:
		*(*uint16)(p) = fp16.FromFloat32(float32(x))
	case comm.BFloat16:
		*(*uint16)(p) = fp16.BFloat16FromFloat32(float32(x))
	case comm.Int32:
		*(*int32)(p) = int32(x)
	case comm.Int64:
		*(*int64)(p) = int64(x)
	case comm.Uint8:
		*(*uint8)(p) = uint8(x)
	}
}

func get(b comm.Buffer, i int) float64 {
	p := unsafe.Add(b.Addr, i*b.DType.Size())
	switch b.DType {
	case comm.Float32:
		return float64(*(*float32)(p))
	case comm.Float64:
		return *(*float64)(p)
	case comm.Float16:
		return float64(fp16.ToFloat32(*(*uint16)(p)))
	case comm.BFloat16:
		return float64(fp16.BFloat16ToFloat32Scalar(*(*uint16)(p)))
	case comm.Int32:
		return float64(*(*int32)(p))
	case comm.Int64:
		return float64(*(*int64)(p))
	case comm.Uint8:
		return float64(*(*uint8)(p))
	}
	return math.NaN()
}

// rounded is x as stored in dt.
func rounded(dt comm.DType, x float64) float64 {
	var buf [8]byte
	b := comm.HostBuffer(unsafe.Pointer(&buf[0]), 1, dt)
	set(b, 0, x)
	return get(b, 0)
}

func fillBuf(b comm.Buffer, f func(j int) float64) {
	for j := range b.Count {
		set(b, j, f(j))
	}
}

func poison(b comm.Buffer) {
	clear(b.AsBytes())
	for i := range b.AsBytes() {
		b.AsBytes()[i] = 0xEE
	}
}

// checkBuf compares b with want element by element.
func checkBuf(t *testing.T, what string, b comm.Buffer, want func(j int) float64) {
	t.Helper()
	for j := range b.Count {
		if g, w := get(b, j), rounded(b.DType, want(j)); g != w && !(g != g && w != w) {
			t.Fatalf("%s: element %d of %d = %v, want %v", what, j, b.Count, g, w)
		}
	}
}

var testSizes = []int{0, 1, 7, 4<<10 + 3}

// TestBlockingCollectives checks every collective, dtype, op and size in
// blocking mode, which the conformance suite (TestSPMD) cannot drive: its
// checks wait on a control communicator while a collective of the one
// under test is incomplete, which blocking mode rules out.
func TestBlockingCollectives(t *testing.T) {
	c := open(t, mpi.Options{Blocking: true})
	if !c.(interface{ Blocking() bool }).Blocking() {
		t.Fatal("the communicator is not in blocking mode")
	}
	t.Run("AllReduce", func(t *testing.T) { testAllReduce(t, c) })
	t.Run("Broadcast", func(t *testing.T) { testBroadcast(t, c) })
	t.Run("Reduce", func(t *testing.T) { testReduce(t, c) })
	t.Run("AllGather", func(t *testing.T) { testAllGather(t, c) })
	t.Run("ReduceScatter", func(t *testing.T) { testReduceScatter(t, c) })
	t.Run("SendRecv", func(t *testing.T) { testSendRecv(t, c) })
	t.Run("Barrier", func(t *testing.T) { testutil.MustWaitAll(t, c.Barrier(), c.Barrier()) })
}

func testAllReduce(t *testing.T, c comm.Communicator) { testAllReduceWith(t, c, alloc) }

// testAllReduceWith is testAllReduce on buffers from alloc.
func testAllReduceWith(t *testing.T, c comm.Communicator, alloc func(testing.TB, int, comm.DType) comm.Buffer) {
	n, r := c.Size(), c.Rank()
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			sizes := testSizes
			if dt == comm.Float32 {
				sizes = append(sizes, 1<<20+5)
			}
			for _, count := range sizes {
				for _, inPlace := range []bool{true, false} {
					send := alloc(t, count, dt)
					recv := send
					if !inPlace {
						recv = alloc(t, count, dt)
						poison(recv)
					}
					fillBuf(send, func(j int) float64 { return value(dt, r, j) })
					testutil.MustWaitAll(t, c.AllReduce(send, recv, op))
					what := fmt.Sprintf("all_reduce %s %s count %d in place %v, rank %d of %d", dt, op, count, inPlace, r, n)
					checkBuf(t, what, recv, func(j int) float64 {
						return reduceValues(dt, op, n, j, func(q int) float64 { return value(dt, q, j) })
					})
					if !inPlace {
						checkBuf(t, what+": send changed", send, func(j int) float64 { return value(dt, r, j) })
					}
				}
			}
		}
	}
}

func testBroadcast(t *testing.T, c comm.Communicator) { testBroadcastWith(t, c, alloc) }

// testBroadcastWith is testBroadcast on buffers from alloc.
func testBroadcastWith(t *testing.T, c comm.Communicator, alloc func(testing.TB, int, comm.DType) comm.Buffer) {
	n, r := c.Size(), c.Rank()
	for _, dt := range comm.DTypes {
		for root := range n {
			for _, count := range testSizes {
				b := alloc(t, count, dt)
				if r == root {
					fillBuf(b, func(j int) float64 { return value(dt, root, j) })
				} else {
					poison(b)
				}
				testutil.MustWaitAll(t, c.Broadcast(b, root))
				checkBuf(t, fmt.Sprintf("broadcast %s count %d root %d, rank %d", dt, count, root, r), b,
					func(j int) float64 { return value(dt, root, j) })
			}
		}
	}
}

func testReduce(t *testing.T, c comm.Communicator) { testReduceWith(t, c, alloc) }

// testReduceWith is testReduce on buffers from alloc.
func testReduceWith(t *testing.T, c comm.Communicator, alloc func(testing.TB, int, comm.DType) comm.Buffer) {
	n, r := c.Size(), c.Rank()
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			for root := range n {
				for _, count := range testSizes {
					for _, inPlace := range []bool{false, true} {
						send := alloc(t, count, dt)
						fillBuf(send, func(j int) float64 { return value(dt, r, j) })
						recv := send
						if !inPlace {
							recv = alloc(t, count, dt)
							poison(recv)
						}
						testutil.MustWaitAll(t, c.Reduce(send, recv, op, root))
						what := fmt.Sprintf("reduce %s %s count %d root %d in place %v, rank %d", dt, op, count, root, inPlace, r)
						if r == root {
							checkBuf(t, what, recv, func(j int) float64 {
								return reduceValues(dt, op, n, j, func(q int) float64 { return value(dt, q, j) })
							})
						} else {
							checkBuf(t, what+": send changed", send, func(j int) float64 { return value(dt, r, j) })
						}
					}
				}
			}
		}
	}
}

func testAllGather(t *testing.T, c comm.Communicator) { testAllGatherWith(t, c, alloc) }

// testAllGatherWith is testAllGather on buffers from alloc.
func testAllGatherWith(t *testing.T, c comm.Communicator, alloc func(testing.TB, int, comm.DType) comm.Buffer) {
	n, r := c.Size(), c.Rank()
	for _, dt := range comm.DTypes {
		for _, count := range testSizes {
			for _, inPlace := range []bool{false, true} {
				recv := alloc(t, n*count, dt)
				poison(recv)
				send := recv.Slice(r*count, count)
				if !inPlace {
					send = alloc(t, count, dt)
				}
				fillBuf(send, func(j int) float64 { return value(dt, r, j) })
				testutil.MustWaitAll(t, c.AllGather(send, recv))
				checkBuf(t, fmt.Sprintf("all_gather %s count %d in place %v, rank %d", dt, count, inPlace, r), recv,
					func(j int) float64 { return value(dt, j/max(count, 1), j%max(count, 1)) })
			}
		}
	}
}

func testReduceScatter(t *testing.T, c comm.Communicator) { testReduceScatterWith(t, c, alloc) }

// testReduceScatterWith is testReduceScatter on buffers from alloc.
func testReduceScatterWith(t *testing.T, c comm.Communicator, alloc func(testing.TB, int, comm.DType) comm.Buffer) {
	n, r := c.Size(), c.Rank()
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			for _, count := range testSizes {
				for _, inPlace := range []bool{false, true} {
					send := alloc(t, n*count, dt)
					fillBuf(send, func(j int) float64 { return value(dt, r, j) })
					recv := send.Slice(r*count, count)
					if !inPlace {
						recv = alloc(t, count, dt)
						poison(recv)
					}
					testutil.MustWaitAll(t, c.ReduceScatter(send, recv, op))
					checkBuf(t, fmt.Sprintf("reduce_scatter %s %s count %d in place %v, rank %d", dt, op, count, inPlace, r), recv,
						func(j int) float64 {
							k := r*count + j
							return reduceValues(dt, op, n, k, func(q int) float64 { return value(dt, q, k) })
						})
				}
			}
		}
	}
}

func testSendRecv(t *testing.T, c comm.Communicator) {
	n, r := c.Size(), c.Rank()
	if n == 1 {
		t.Skip("one rank has no peer")
	}
	next, prev := (r+1)%n, (r+n-1)%n
	for _, dt := range comm.DTypes {
		for _, count := range append(testSizes, 1<<20) {
			send, recv := alloc(t, count, dt), alloc(t, count, dt)
			fillBuf(send, func(j int) float64 { return value(dt, r, j) })
			poison(recv)
			var a, b comm.Work
			if r%2 == 0 {
				a, b = c.Send(send, next), c.Recv(recv, prev)
			} else {
				a, b = c.Recv(recv, prev), c.Send(send, next)
			}
			testutil.MustWaitAll(t, a, b)
			checkBuf(t, fmt.Sprintf("recv %s count %d from rank %d, rank %d", dt, count, prev, r), recv,
				func(j int) float64 { return value(dt, prev, j) })
		}
	}
}
