package bench_test

import (
	"context"
	"fmt"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/inproc"
)

func newGroup(n int) []comm.Communicator {
	g, err := inproc.NewGroup(n)
	if err != nil {
		panic(err)
	}
	out := make([]comm.Communicator, n)
	for i, c := range g {
		out[i] = c
	}
	return out
}

func ExampleRunCollective() {
	g := newGroup(2)
	defer func() {
		for _, c := range g {
			c.Close()
		}
	}()
	cfg := bench.CollectiveConfig{Op: bench.AllReduce, DType: comm.Float32, RedOp: comm.Sum,
		MinBytes: 4 << 10, MaxBytes: 256 << 10, Factor: 4, Iters: 5, Warmup: 1, Check: true}
	rows, err := bench.RunCollective(context.Background(), g, cfg, nil)
	if err != nil {
		panic(err)
	}
	for _, r := range rows {
		fmt.Println(r.Bytes, r.Count, r.DType, r.RedOp, r.OutOfPlace.Wrong, r.InPlace.Wrong)
	}
	// Output:
	// 4096 1024 float sum 0 0
	// 16384 4096 float sum 0 0
	// 65536 16384 float sum 0 0
	// 262144 65536 float sum 0 0
}

func ExampleRun() {
	g := newGroup(2)
	defer func() {
		for _, c := range g {
			c.Close()
		}
	}()
	params := []ddp.Param{
		{Name: "fc1.weight", Shape: []int{256, 784}}, {Name: "fc1.bias", Shape: []int{256}},
		{Name: "fc2.weight", Shape: []int{10, 256}}, {Name: "fc2.bias", Shape: []int{10}},
	}
	res, err := bench.Run(context.Background(), bench.Config{
		Params: params, Comms: g, BucketCap: 256 << 10, FirstBucketCap: 8 << 10,
		Steps: 5, Warmup: 2, Compute: bench.ComputeSleep, Rate: 200e6, // 1 ms of backward
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Numel, res.WireBytes, res.Buckets)
	// Output: 203530 814120 [10280 803840]
}
