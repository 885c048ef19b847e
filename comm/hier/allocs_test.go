package hier_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// TestAllocs checks that a warm all-reduce (whole and in chunks), broadcast and barrier on the
// composite allocate nothing, as the levels' do not: the phases' closures
// stay on the worker's stack and the Works are ring slots.
func TestAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	for _, tc := range layouts[:2] {
		for _, chunk := range []int{0, 1 << 10} {
			t.Run(fmt.Sprintf("%s/chunk%d", tc.name, chunk), func(t *testing.T) {
				cs := newChunkedJob(t, tc.l, inproc.Options{}, chunk)
				defer func() {
					for _, c := range cs {
						c.Close()
					}
				}()
				ctx := context.Background()
				bufs := make([][]float32, len(cs))
				for r := range bufs {
					bufs[r] = make([]float32, 1001)
				}
				ws := make([]comm.Work, 3*len(cs))
				step := func() {
					for r, c := range cs {
						b := comm.Float32s(bufs[r])
						ws[3*r] = c.AllReduce(b, b, comm.Sum)
						ws[3*r+1] = c.Broadcast(b, 1)
						ws[3*r+2] = c.Barrier()
					}
					for _, w := range ws {
						if err := w.Wait(ctx); err != nil {
							t.Fatal(err)
						}
					}
				}
				step()
				if a := testing.AllocsPerRun(50, step); a != 0 {
					t.Errorf("%v allocations per step of an all_reduce, a broadcast and a barrier on %d ranks, want 0", a, len(cs))
				}
			})
		}
	}
}
