package hooks_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/inproc"
)

// sumHook is a custom hook: it sums the gradients over ranks instead of
// averaging them, for a loss that is already divided by the global batch
// size. Launch issues the collective and returns at once; Finish has
// nothing to undo, since nothing was compressed.
type sumHook struct {
	c comm.Communicator
}

func (*sumHook) Name() string                  { return "sum" }
func (*sumHook) Wire(dt comm.DType) comm.DType { return dt }
func (*sumHook) Scratch(int, comm.DType) int   { return 0 }
func (*sumHook) Finish(*hooks.Bucket) error    { return nil }
func (*sumHook) Close() error                  { return nil }

func (h *sumHook) Setup(c comm.Communicator, _ comm.Kernels) error {
	h.c = c
	return nil
}

func (h *sumHook) Launch(b *hooks.Bucket) (comm.Work, error) {
	b.WireBytes = int64(b.Buf.Bytes())
	return h.c.AllReduce(b.Buf, b.Buf, comm.Sum), nil
}

// A custom two-phase hook plugged into the Reducer: two ranks sum their
// gradients.
func Example_custom() {
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	params := []ddp.Param{{Name: "w", Shape: []int{3}}}
	out := make([][]float32, 2)
	var wg sync.WaitGroup
	for rank, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			r, err := ddp.New(ctx, c, params, ddp.Options{Hook: &sumHook{}})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			if err := r.Begin(ddp.Sync); err != nil {
				panic(err)
			}
			if err := r.SetGrad(0, []float32{1, 2, float32(10 * rank)}); err != nil {
				panic(err)
			}
			if err := r.Wait(ctx); err != nil {
				panic(err)
			}
			g, err := r.Grad(0)
			if err != nil {
				panic(err)
			}
			out[rank] = append([]float32(nil), g...)
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Close()
	}
	fmt.Println(out[0], out[1])
	// Output: [2 4 10] [2 4 10]
}
