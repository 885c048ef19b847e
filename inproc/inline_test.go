package inproc

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestInlineTakeover: a collective that rank 0 joined inline and that is
// still waiting for rank 1 when rank 0 issues a message is taken over by
// rank 0's worker, which completes it once rank 1 leads it, and then
// sends the message, in issue order.
func TestInlineTakeover(t *testing.T) {
	cs := testGroup(t, 2, Options{})
	a := [][]float32{{1, 2}, {10, 20}}
	w0 := allReduceInPlace(cs[0], comm.Float32s(a[0]), comm.Sum)
	if !cs[0].ops.Op(w0.ID()).inline {
		t.Fatal("an idle rank's small all_reduce was not joined inline")
	}
	send := cs[0].Send(comm.Float32s(a[0]), 1) // sends the sum: it runs after the all-reduce
	for !cs[0].inl.Taken(w0.ID()) {
		runtime.Gosched() // the worker, woken by the Send, takes the all-reduce over
	}
	w1 := allReduceInPlace(cs[1], comm.Float32s(a[1]), comm.Sum)
	got := []float32{0, 0}
	recv := cs[1].Recv(comm.Float32s(got), 0)
	for i, err := range testutil.WaitAll(t, []comm.Work{w0, w1, send, recv}...) {
		if err != nil {
			t.Fatalf("operation %d: %v", i, err)
		}
	}
	if a[0][0] != 11 || a[1][1] != 22 || got[0] != 11 || got[1] != 22 {
		t.Errorf("all_reduce %v %v, then message %v; want [11 22] everywhere", a[0], a[1], got)
	}
}

// TestInlineLongRun issues several ring lengths of small collectives that
// the ranks join inline, while their workers stay parked, with a message
// and a parallel all-reduce (which need the workers) every so often: the
// workers skip what was done inline without ever falling a ring behind,
// and every result is right.
func TestInlineLongRun(t *testing.T) {
	cs := testGroup(t, 3, Options{})
	small := make([][]int32, 3)
	large := make([][]float32, 3)
	for r := range cs {
		small[r] = make([]int32, 3)
		large[r] = make([]float32, parallelBytes/4+16)
	}
	got := []int32{-1}
	for i := range 3*ringSize + 50 {
		ws := make([]comm.Work, 0, 8)
		for r, c := range cs {
			small[r][0], small[r][1], small[r][2] = int32(r), int32(i), 1
			ws = append(ws, allReduceInPlace(c, comm.Int32s(small[r]), comm.Sum))
		}
		if i%97 == 0 {
			for r, c := range cs {
				for j := range large[r] {
					large[r][j] = float32(r + j%5)
				}
				ws = append(ws, allReduceInPlace(c, comm.Float32s(large[r]), comm.Sum))
			}
			ws = append(ws, cs[2].Send(comm.Int32s([]int32{int32(i)}), 0), cs[0].Recv(comm.Int32s(got), 2))
		}
		for j, err := range testutil.WaitAll(t, ws...) {
			if err != nil {
				t.Fatalf("round %d, operation %d: %v", i, j, err)
			}
		}
		if i%97 == 0 && got[0] != int32(i) {
			t.Fatalf("round %d: message %d", i, got[0])
		}
		for r := range cs {
			if small[r][0] != 3 || small[r][1] != int32(3*i) || small[r][2] != 3 {
				t.Fatalf("round %d, rank %d: %v", i, r, small[r])
			}
			if i%97 == 0 && (large[r][0] != 3 || large[r][len(large[r])-1] != float32(3+3*((len(large[r])-1)%5))) {
				t.Fatalf("round %d, rank %d: large all_reduce %v ... %v", i, r, large[r][0], large[r][len(large[r])-1])
			}
		}
	}
	for r, c := range cs {
		if lag := c.ops.Issued() - c.passed.Load(); lag >= ringSize {
			t.Errorf("rank %d: the worker is %d operations behind", r, lag)
		}
	}
}

// TestSmallAgainstLarge: ranks that disagree on a count across the
// small/large boundary (one stages its input, the other would take a
// share) both get ErrMismatch, at once; the group stays usable.
func TestSmallAgainstLarge(t *testing.T) {
	cs := testGroup(t, 2, Options{Timeout: time.Minute})
	small, large := make([]float32, 100), make([]float32, parallelBytes/4+1)
	ws := []comm.Work{allReduceInPlace(cs[0], comm.Float32s(small), comm.Sum), allReduceInPlace(cs[1], comm.Float32s(large), comm.Sum)}
	for r, err := range testutil.WaitAll(t, ws...) {
		if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "100 x float") || !strings.Contains(err.Error(), fmt.Sprintf("%d x float", len(large))) {
			t.Errorf("rank %d: %v; want ErrMismatch naming both counts", r, err)
		}
	}
	for r, err := range testutil.WaitAll(t, []comm.Work{cs[0].Barrier(), cs[1].Barrier()}...) {
		if err != nil {
			t.Errorf("rank %d: barrier after the mismatch: %v", r, err)
		}
	}
}

// TestTestOnly: a rank that only polls Test, never Wait, still sees its
// small collective complete: Test finishes it once every rank's call is
// published.
func TestTestOnly(t *testing.T) {
	cs := testGroup(t, 2, Options{})
	a, b := []int64{1, 2}, []int64{10, 20}
	w0 := allReduceInPlace(cs[0], comm.Int64s(a), comm.Sum)
	w1 := allReduceInPlace(cs[1], comm.Int64s(b), comm.Sum)
	for _, w := range []comm.Work{w0, w1} {
		for i := 0; ; i++ {
			done, err := w.Test()
			if done {
				if err != nil {
					t.Fatal(err)
				}
				break
			}
			if i == 1e8 {
				t.Fatal("Test never reported the all-reduce done")
			}
			runtime.Gosched()
		}
	}
	if a[0] != 11 || a[1] != 22 || b[0] != 11 || b[1] != 22 {
		t.Errorf("%v %v; want [11 22] twice", a, b)
	}
}
