package hier_test

import (
	"context"
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/hier"
	"github.com/ddpgo/ddpgo/inproc"
)

// A job of three ranks on two hosts (two on host 0, one on host 1), its
// levels made of inproc groups in one process: host 0's group of two,
// host 1's group of one, local rank 0's cross group of the two hosts, and
// local rank 1's cross group of host 0 alone. A backend builds the same
// levels from its own communicators (split by host, then by local rank).
func Example() {
	layout := hier.PerHost(2, 1) // ranks 0, 1 on host 0; rank 2 on host 1
	host0, _ := inproc.NewGroup(2)
	host1, _ := inproc.NewGroup(1)
	cross0, _ := inproc.NewGroup(2) // local rank 0 of hosts 0 and 1
	cross1, _ := inproc.NewGroup(1) // local rank 1 of host 0
	levels := []hier.Config{
		{Layout: layout, Rank: 0, Local: host0[0], Cross: cross0[0]},
		{Layout: layout, Rank: 1, Local: host0[1], Cross: cross1[0]},
		{Layout: layout, Rank: 2, Local: host1[0], Cross: cross0[1]},
	}
	cs := make([]*hier.Comm, len(levels))
	for r, cfg := range levels {
		c, err := hier.New(cfg)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer c.Close() // closes its levels too
		cs[r] = c
	}
	bufs := [][]int64{{1, 2, 3}, {10, 20, 30}, {100, 200, 300}}
	ws := make([]comm.Work, len(cs))
	for r, c := range cs {
		ws[r] = c.AllReduce(comm.Int64s(bufs[r]), comm.Int64s(bufs[r]), comm.Sum)
	}
	for r, w := range ws {
		if err := w.Wait(context.Background()); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(r, bufs[r])
	}
	// Output:
	// 0 [111 222 333]
	// 1 [111 222 333]
	// 2 [111 222 333]
}
