package inproc

import (
	"context"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

func TestAllReduceFloat32Sum(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		cs, err := NewGroup(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, count := range []int{0, 1, 7, 4099, 100000} {
			bufs := make([][]float32, n)
			ws := make([]comm.Work, n)
			for r := range n {
				bufs[r] = make([]float32, count)
				for i := range bufs[r] {
					bufs[r][i] = float32(r + i%5)
				}
				ws[r] = cs[r].AllReduce(comm.Float32s(bufs[r]), comm.Sum)
			}
			for r := range n {
				if err := ws[r].Wait(context.Background()); err != nil {
					t.Fatal(err)
				}
				for i, v := range bufs[r] {
					want := float32(n*(i%5) + n*(n-1)/2)
					if v != want {
						t.Fatalf("n=%d count=%d rank %d [%d] = %v want %v", n, count, r, i, v, want)
					}
				}
			}
		}
		for _, c := range cs {
			c.Close()
		}
	}
}
