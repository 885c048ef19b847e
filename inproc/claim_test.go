package inproc

import (
	"context"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// TestClaimedInlineWakesWorker: when a Wait claims a collective the rank
// joined inline while the rank's worker is about to take it over, the
// worker must not sleep through its completion: the message issued after
// the collective has to go through long before any timeout.
func TestClaimedInlineWakesWorker(t *testing.T) {
	const n = 4
	cs := testGroup(t, n, Options{Timeout: time.Minute})
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	for i := range rounds {
		ws := make([]comm.Work, 0, n+2)
		bufs := make([][]int32, n)
		for r, c := range cs {
			bufs[r] = []int32{1}
			ws = append(ws, c.AllReduce(comm.Int32s(bufs[r]), comm.Int32s(bufs[r]), comm.Sum))
		}
		msg := []int32{0}
		ws = append(ws, cs[n-1].Send(comm.Int32s([]int32{int32(i)}), 0), cs[0].Recv(comm.Int32s(msg), n-1))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		for j, w := range ws {
			if err := w.Wait(ctx); err != nil {
				cancel()
				t.Fatalf("round %d: operation %d: %v", i, j, err)
			}
		}
		cancel()
		if msg[0] != int32(i) || bufs[0][0] != n {
			t.Fatalf("round %d: message %d, sum %d", i, msg[0], bufs[0][0])
		}
	}
}
