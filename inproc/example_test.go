package inproc_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// Four ranks, one goroutine each, average their gradients.
func ExampleNewGroup() {
	comms, err := inproc.NewGroup(4)
	if err != nil {
		panic(err)
	}
	grads := make([][]float32, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		grads[r] = []float32{float32(r), 10 * float32(r)}
		wg.Go(func() {
			defer c.Close()
			if err := c.AllReduce(comm.Float32s(grads[r]), comm.Float32s(grads[r]), comm.Avg).Wait(context.Background()); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(grads[0], grads[3])
	// Output: [1.5 15] [1.5 15]
}
