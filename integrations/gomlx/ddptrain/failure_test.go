package ddptrain_test

import (
	"context"

	"errors"
	"fmt"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/gomlx/gomlx/backends"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
)

// TestFailure makes one rank's gradient graph fail, or panic, at some
// step, and checks that every rank's call fails in that same step, the
// failing rank's with ErrGraph and its cause, every other rank's with
// ErrPeer naming it, and that nothing hangs: every rank returns well
// within the test's deadline, far below the Reducer's timeouts; with the
// optimizer sharded too, by whole variables and by elements (the status
// then travels in the gather, split between the ranks by elements).
func TestFailure(t *testing.T) {
	const ranks = 3
	cases := []struct {
		name   string
		bad    int    // the failing rank
		step   int    // the step it fails in, from 1
		noSync bool   // the failing step is an AccumulateStep on every rank
		how    string // "panic": the model panics; "error": the graph does not build (labels of the wrong shape)
		cause  string // in the failing rank's error
	}{
		{"panic at the first step, before the Reducer exists", 0, 1, false, "panic", "model exploded"},
		{"panic in a synced step", 1, 3, false, "panic", "model exploded"},
		{"graph error in a synced step", 2, 2, false, "error", "Sub"},
		{"graph error in a no-sync step", 1, 3, true, "error", "Sub"},
	}
	sharded, elements := smallBuckets, smallBuckets
	sharded.Reducer.Shard = ddp.ShardParams
	elements.Reducer.Shard = ddp.ShardElements
	elements.Reducer.FirstBucketCap = 16 // the status and at most one element more: split between the ranks
	for _, tc := range cases {
		for _, o := range []struct {
			name string
			o    ddptrain.Options
		}{{"", smallBuckets}, {", sharded", sharded}, {", sharded by elements", elements}} {
			t.Run(tc.name+o.name, func(t *testing.T) {
				p := newLSQ(4, 3)
				comms, err := inproc.NewGroup(ranks)
				if err != nil {
					t.Fatal(err)
				}
				defer closeAll(comms)
				backend := newBackend(t)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				failedAt := make([]int, ranks)
				errs := make([]error, ranks)
				var wg sync.WaitGroup
				for r, c := range comms {
					wg.Go(func() {
						failedAt[r], errs[r] = faultyRank(ctx, c, backend, p, tc.bad, tc.step, tc.how, tc.noSync, o.o)
					})
				}
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(45 * time.Second):
					t.Fatal("the ranks hang after a failure")
				}
				for r, err := range errs {
					// A no-sync step communicates nothing: the peers learn of
					// the failure in their next (synced) step.
					want := tc.step
					if tc.noSync && r != tc.bad {
						want++
					}
					switch {
					case err == nil:
						t.Errorf("rank %d did not fail", r)
					case failedAt[r] != want:
						t.Errorf("rank %d failed at step %d, want %d: %v", r, failedAt[r], want, err)
					case r == tc.bad && (!errors.Is(err, ddptrain.ErrGraph) || !strings.Contains(err.Error(), tc.cause)):
						t.Errorf("rank %d (the failing one): %v, want ErrGraph with %q", r, err, tc.cause)
					case r != tc.bad && (!errors.Is(err, ddptrain.ErrPeer) || !strings.Contains(err.Error(), fmt.Sprintf("rank %d failed", tc.bad))):
						t.Errorf("rank %d: %v, want ErrPeer naming rank %d", r, err, tc.bad)
					default:
						t.Logf("rank %d: %v", r, err)
					}
				}
			})
		}
	}
}

// faultyRank trains rank c of the problem for 4 steps of SGD on its
// shard, where rank bad fails in step (from 1): its model panics ("panic")
// or its graph does not build ("error": labels of the wrong shape); with
// noSync that step is an AccumulateStep on every rank. It returns the
// step of the rank's first error, and the error.
func faultyRank(ctx context.Context, c comm.Communicator, backend backends.Backend, p *lsq, bad, step int, how string, noSync bool, o ddptrain.Options) (int, error) {
	r, n := c.Rank(), c.Size()
	model := p.model(r)
	if r == bad && how == "panic" {
		model = panicking(model)
	}
	tr, err := ddptrain.New(c, backend, mlctx.New(), model, lsqLoss, optimizer("sgd", 1), o)
	if err != nil {
		return 0, err
	}
	defer tr.Close()
	b := lsqBatch / n
	for k := 1; k <= 4; k++ {
		lo := (k-1)*lsqBatch + r*b
		inputs, labels := p.tensors(lo, lo+b)
		if r == bad && k == step {
			if how == "panic" {
				inputs, labels = p.tensors(lo, lo+b-1) // a batch size the panicking model refuses
			} else {
				labels[0] = tensors.FromShape(labels[1].Shape()) // head 0's labels of head 1's shape
			}
		}
		train := tr.TrainStep
		if noSync && k == step {
			train = tr.AccumulateStep
		}
		if _, err := train(ctx, nil, inputs, labels); err != nil {
			return k, err
		}
	}
	return 0, nil
}

// panicking wraps a model so that it panics, with a value that is not an
// error, when it is built for a batch of an odd size.
func panicking(model train.ModelFn) train.ModelFn {
	return func(ctx *mlctx.Context, spec any, inputs []*Node) []*Node {
		if inputs[0].Shape().Dimensions[0]%2 != 0 {
			panic("model exploded")
		}
		return model(ctx, spec, inputs)
	}
}
