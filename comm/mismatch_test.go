package comm_test

import (
	"errors"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

func TestMismatchError(t *testing.T) {
	sum := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum, DType: comm.Float32, Count: 2, Seq: 2}
	max := sum
	max.Op = comm.Max
	bc := comm.Call{Kind: comm.KindBroadcast, Op: comm.Max, DType: comm.Float32, Count: 2, Root: 1, Seq: 3}
	bcOtherOp := bc
	bcOtherOp.Op, bcOtherOp.Seq = comm.Sum, 9 // Op and Seq do not matter to a broadcast
	for _, tc := range []struct {
		name  string
		calls []comm.Call
		want  string // "" for agreement
	}{
		{"agree", []comm.Call{sum, sum, sum}, ""},
		{"op and seq ignored where they do not matter", []comm.Call{bc, bcOtherOp}, ""},
		{"one odd rank", []comm.Call{sum, sum, max},
			"comm: collective mismatch between ranks: collective #2: rank(s) [2] differ from rank(s) [0 1]; rank 0: all_reduce(sum, 2 x float) (seq 2); rank 1: all_reduce(sum, 2 x float) (seq 2); rank 2: all_reduce(max, 2 x float) (seq 2)"},
		{"odd rank 0", []comm.Call{max, sum, sum},
			"comm: collective mismatch between ranks: collective #2: rank(s) [0] differ from rank(s) [1 2]; rank 0: all_reduce(max, 2 x float) (seq 2); rank 1: all_reduce(sum, 2 x float) (seq 2); rank 2: all_reduce(sum, 2 x float) (seq 2)"},
		{"a tie takes the lowest rank's call", []comm.Call{max, sum},
			"comm: collective mismatch between ranks: collective #2: rank(s) [1] differ from rank(s) [0]; rank 0: all_reduce(max, 2 x float) (seq 2); rank 1: all_reduce(sum, 2 x float) (seq 2)"},
		{"kinds", []comm.Call{sum, bc},
			"comm: collective mismatch between ranks: collective #2: rank(s) [1] differ from rank(s) [0]; rank 0: all_reduce(sum, 2 x float) (seq 2); rank 1: broadcast(root 1, 2 x float) (seq 3)"},
	} {
		err := comm.MismatchError(2, tc.calls)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.want != "" && (!errors.Is(err, comm.ErrMismatch) || err.Error() != tc.want):
			t.Errorf("%s:\n got %v\nwant %s", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		c    comm.Call
		want string
	}{
		{comm.Call{Kind: comm.KindBarrier, Seq: 4}, "barrier (seq 4)"},
		{comm.Call{Kind: comm.KindReduce, Op: comm.Min, DType: comm.Int64, Count: 5, Root: 2, Seq: 1}, "reduce(min, root 2, 5 x int64) (seq 1)"},
		{comm.Call{Kind: comm.KindAllGather, DType: comm.BFloat16, Count: 8, Seq: 6}, "all_gather(8 x bfloat16) (seq 6)"},
		{comm.Call{Kind: comm.KindReduceScatter, Op: comm.Avg, DType: comm.Float16, Count: 3, Seq: 7}, "reduce_scatter(avg, 3 x half) (seq 7)"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func TestMessageMismatchError(t *testing.T) {
	send := comm.Call{Kind: comm.KindSend, DType: comm.Float32, Count: 4, Root: 1, Seq: 3}
	recv := comm.Call{Kind: comm.KindRecv, DType: comm.Float32, Count: 4, Root: 0, Seq: 8}
	if err := comm.MessageMismatchError(2, 0, 1, send, recv); err != nil {
		t.Errorf("matching ends: %v", err)
	}
	recv.Count = 5
	err := comm.MessageMismatchError(2, 0, 1, send, recv)
	want := "comm: collective mismatch between ranks: message 2 from rank 0 to rank 1: rank 0 sends 4 x float (seq 3), rank 1 receives 5 x float (seq 8)"
	if !errors.Is(err, comm.ErrMismatch) || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}
