package ddp_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/inproc"
)

// Two ranks average the gradients of two parameters. Each rank writes its
// gradients into the bucket views, marks them ready in the order its
// backward produces them, and reads the averages after Wait.
func Example() {
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	params := []ddp.Param{
		{Name: "fc.weight", Shape: []int{2, 2}},
		{Name: "fc.bias", Shape: []int{2}},
	}
	out := make([]string, 2)
	var wg sync.WaitGroup
	for rank, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			r, err := ddp.New(ctx, c, params, ddp.Options{})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			for step := range 2 {
				if err := r.Begin(ddp.Sync); err != nil {
					panic(err)
				}
				for i := len(params) - 1; i >= 0; i-- { // backward: last layer first
					g, err := r.Grad(i)
					if err != nil {
						panic(err)
					}
					for j := range g {
						g[j] = float32(10*rank + j + step)
					}
					if err := r.Ready(i); err != nil {
						panic(err)
					}
				}
				if err := r.Wait(ctx); err != nil {
					panic(err)
				}
			}
			w, _ := r.Grad(0) // after Wait: the averages
			b, _ := r.Grad(1)
			out[rank] = fmt.Sprint(w, b, r.Stats().Step)
		})
	}
	wg.Wait()
	for _, c := range comms { // after every rank is done: closing one aborts the group
		c.Close()
	}
	fmt.Println(out[0])
	fmt.Println(out[1])
	// Output:
	// [6 7 8 9] [6 7] 2
	// [6 7 8 9] [6 7] 2
}

// The optimizer updates each bucket's parameters as soon as the bucket is
// reduced, while later buckets are still on the wire: WaitEach calls its
// function on the training goroutine once per bucket, in order.
func ExampleReducer_WaitEach() {
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	params := []ddp.Param{
		{Name: "fc1.weight", Shape: []int{4}},
		{Name: "fc2.weight", Shape: []int{4}},
	}
	out := make([]string, 2)
	var wg sync.WaitGroup
	for rank, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			// 16-byte buckets: one parameter each.
			r, err := ddp.New(ctx, c, params, ddp.Options{BucketCap: 16, FirstBucketCap: 16})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			weights := [][]float32{{1, 1, 1, 1}, {2, 2, 2, 2}}
			var log []string
			if err := r.Begin(ddp.Sync); err != nil {
				panic(err)
			}
			for i := len(params) - 1; i >= 0; i-- {
				g, _ := r.Grad(i)
				for j := range g {
					g[j] = float32(rank + 1) // the average is 1.5
				}
				if err := r.Ready(i); err != nil {
					panic(err)
				}
			}
			err = r.WaitEach(ctx, func(b ddp.Reduced) {
				for _, p := range b.Params { // SGD with learning rate 0.1
					g, _ := r.Grad(p)
					for j := range g {
						weights[p][j] -= 0.1 * g[j]
					}
					log = append(log, fmt.Sprintf("bucket %d: %s", b.Bucket, params[p].Name))
				}
			})
			if err != nil {
				panic(err)
			}
			out[rank] = fmt.Sprint(log, weights)
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	fmt.Println(out[0])
	fmt.Println(out[1])
	// Output:
	// [bucket 0: fc2.weight bucket 1: fc1.weight] [[0.85 0.85 0.85 0.85] [1.85 1.85 1.85 1.85]]
	// [bucket 0: fc2.weight bucket 1: fc1.weight] [[0.85 0.85 0.85 0.85] [1.85 1.85 1.85 1.85]]
}

// Sharded optimizer state (Options.Shard, ZeRO stage 1): each rank keeps
// momentum for the part of each bucket it owns, steps that part as soon
// as the bucket is reduced, and publishes it with Gather; WaitGather
// gives every rank the whole model.
func ExampleReducer_Gather() {
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	params := []ddp.Param{
		{Name: "fc1.weight", Shape: []int{3}},
		{Name: "fc2.weight", Shape: []int{4}},
	}
	out := make([]string, 2)
	var wg sync.WaitGroup
	for rank, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			r, err := ddp.New(ctx, c, params, ddp.Options{Shard: ddp.ShardElements})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			weights := [][]float32{{1, 1, 1}, {2, 2, 2, 2}}
			momentum := map[ddp.Part][]float32{} // this rank's parts only
			for k := range r.Buckets() {
				for _, p := range r.Owned(k) {
					momentum[p] = make([]float32, p.Hi-p.Lo)
				}
			}
			for range 2 {
				if err := r.Begin(ddp.Sync); err != nil {
					panic(err)
				}
				for i := len(params) - 1; i >= 0; i-- {
					g, _ := r.Grad(i)
					for j := range g {
						g[j] = float32(rank + 1) // the average is 1.5
					}
					if err := r.Ready(i); err != nil {
						panic(err)
					}
				}
				err = r.WaitEach(ctx, func(b ddp.Reduced) {
					for _, p := range b.Owned { // SGD, learning rate 0.1, momentum 0.9
						g, _ := r.Grad(p.Param)
						w, m := weights[p.Param][p.Lo:p.Hi], momentum[p]
						for j := range w {
							m[j] = 0.9*m[j] + g[p.Lo+j]
							w[j] -= 0.1 * m[j]
						}
					}
					if err := r.Gather(b.Bucket, weights); err != nil {
						panic(err)
					}
				})
				if err != nil {
					panic(err)
				}
				if err := r.WaitGather(ctx); err != nil {
					panic(err)
				}
			}
			owned := 0
			for _, m := range momentum {
				owned += len(m)
			}
			out[rank] = fmt.Sprintf("rank %d keeps momentum for %d of 7 elements; weights %v", rank, owned, weights)
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	fmt.Println(out[0])
	fmt.Println(out[1])
	// Output:
	// rank 0 keeps momentum for 4 of 7 elements; weights [[0.56500006 0.56500006 0.56500006] [1.565 1.565 1.565 1.565]]
	// rank 1 keeps momentum for 3 of 7 elements; weights [[0.56500006 0.56500006 0.56500006] [1.565 1.565 1.565 1.565]]
}

// Three ranks with 1, 3 and 2 batches: each calls Join once out of data,
// and shadows the steps the others still take, contributing zeros; the
// average divides by the group size (JoinWorld). Join returns the rank
// that joined last, whose weights every rank then takes.
func ExampleReducer_Join() {
	comms, err := inproc.NewGroup(3)
	if err != nil {
		panic(err)
	}
	params := []ddp.Param{{Name: "w", Shape: []int{2}}}
	batches := []int{1, 3, 2}
	out := make([]string, 3)
	var wg sync.WaitGroup
	for rank, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			r, err := ddp.New(ctx, c, params, ddp.Options{Join: ddp.JoinWorld})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			w := []float32{float32(rank), 0}
			var seen []float32
			for range batches[rank] {
				if err := r.Begin(ddp.Sync); err != nil {
					panic(err)
				}
				if err := r.SetGrad(0, []float32{3, 6}); err != nil {
					panic(err)
				}
				if err := r.Wait(ctx); err != nil {
					panic(err)
				}
				g, _ := r.Grad(0)
				seen = append(seen, g[0])
				w[1] -= g[1]
			}
			last, err := r.Join(ctx)
			if err != nil {
				panic(err)
			}
			// The joined ranks' weights stopped training: take the last
			// joiner's.
			if err := r.Broadcast(ctx, last, []comm.Buffer{comm.Float32s(w)}); err != nil {
				panic(err)
			}
			out[rank] = fmt.Sprintf("rank %d saw %v; rank %d joined last; weights %v", rank, seen, last, w)
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	for _, s := range out {
		fmt.Println(s)
	}
	// Output:
	// rank 0 saw [3]; rank 1 joined last; weights [1 -12]
	// rank 1 saw [3 2 1]; rank 1 joined last; weights [1 -12]
	// rank 2 saw [3 2]; rank 1 joined last; weights [1 -12]
}
