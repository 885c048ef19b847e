package ddptrain_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
	"github.com/ddpgo/ddpgo/sampler"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"
	"github.com/gomlx/gomlx/pkg/ml/train"
)

// onRanks runs f on each of n inproc ranks at once, with a deadline, and
// fails the test if one returns an error or if they hang.
func onRanks(t *testing.T, n int, f func(ctx context.Context, c comm.Communicator) error) {
	t.Helper()
	if err := errors.Join(rankErrors(t, n, f)...); err != nil {
		t.Fatal(err)
	}
}

// rankErrors runs f on each of n inproc ranks at once, with a deadline,
// and returns each rank's error.
func rankErrors(t *testing.T, n int, f func(ctx context.Context, c comm.Communicator) error) []error {
	t.Helper()
	comms, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(comms)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(ctx, c) })
	}
	wg.Wait()
	return errs
}

// values returns every variable of ctx but the random-number state, by
// scope and name, as bytes.
func values(t testing.TB, ctx *mlctx.Context) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for v := range ctx.IterVariables() {
		if v.Name() == mlctx.RNGStateVariableName {
			continue
		}
		value, err := v.Value()
		if err != nil {
			t.Fatal(err)
		}
		if err := value.ConstBytes(func(b []byte) { out[v.ScopeAndName()] = slices.Clone(b) }); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sameValues(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// TestBuffers trains a model with batch normalisation over 3 ranks, whose
// shards give each rank other batch statistics: after every synced step
// every rank holds rank 0's running averages (the Reducer's buffers),
// which differ from what the other ranks computed, and with
// Options.Buffers refusing them each rank keeps its own.
func TestBuffers(t *testing.T) {
	p := newLSQ(3, 4)
	model := func(rank int) train.ModelFn {
		inner := p.model(rank)
		return func(ctx *mlctx.Context, spec any, inputs []*Node) []*Node {
			// simplego has no BatchNormForTraining: the layer's own graph.
			x := batchnorm.New(ctx.In("norm"), inputs[0], -1).UseBackendInference(false).Done()
			return inner(ctx, spec, []*Node{x})
		}
	}
	for _, share := range []bool{true, false} {
		const n = 3
		ctxs := make([]*mlctx.Context, n)
		var buffers []string
		onRanks(t, n, func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			ctxs[r] = mlctx.New()
			o := smallBuckets
			if !share {
				o.Buffers = func(*mlctx.Variable) bool { return false }
			}
			tr, err := ddptrain.New(c, newBackend(t), ctxs[r], model(r), lsqLoss, optimizer("sgd", 1), o)
			if err != nil {
				return err
			}
			defer tr.Close()
			for k := range 3 {
				lo := k*lsqBatch + r*lsqBatch/n
				inputs, labels := p.tensors(lo, lo+lsqBatch/n)
				if _, err := tr.TrainStep(ctx, nil, inputs, labels); err != nil {
					return err
				}
			}
			if r == 0 {
				for _, v := range tr.Buffers() {
					buffers = append(buffers, v.ScopeAndName())
				}
			}
			return nil
		})
		if share && len(buffers) != 3 { // mean, variance, avg_weight
			t.Fatalf("buffers %v, want batch normalisation's three averages", buffers)
		}
		v0 := values(t, ctxs[0])
		for r := 1; r < n; r++ {
			vr := values(t, ctxs[r])
			for _, name := range []string{"/norm/batch_normalization/mean", "/norm/batch_normalization/variance"} {
				if _, ok := v0[name]; !ok {
					t.Fatalf("no variable %s", name)
				}
				if equal := slices.Equal(v0[name], vr[name]); equal != share {
					t.Errorf("buffers shared %v: rank %d's %s equal to rank 0's: %v", share, r, name, equal)
				}
			}
			if share && !sameValues(v0, vr) {
				t.Errorf("rank %d's variables differ from rank 0's", r)
			}
		}
	}
}

// joinBatches are the batches each rank takes before Join in the Join
// tests: ranks 0 and 2 run out first, rank 1 joins last.
var joinBatches = []int{2, 4, 3}

// runJoin trains p on len(joinBatches) inproc ranks with Adam under o,
// each rank taking its joinBatches (batch k of rank r: its share of the
// k-th global batch), then calls Join, then after (if not nil) with its
// context and a function that takes batch k. It returns each rank's
// error, a Join that did not return rank 1 counting as one.
func runJoin(t *testing.T, p *lsq, o ddptrain.Options, after func(r int, mctx *mlctx.Context, step func(k int) error) error) []error {
	t.Helper()
	n := len(joinBatches)
	return rankErrors(t, n, func(ctx context.Context, c comm.Communicator) error {
		r := c.Rank()
		mctx := mlctx.New()
		tr, err := ddptrain.New(c, newBackend(t), mctx, p.model(r), lsqLoss, optimizer("adam", 1), o)
		if err != nil {
			return err
		}
		defer tr.Close()
		step := func(k int) error {
			lo := k*lsqBatch + r*lsqBatch/n
			inputs, labels := p.tensors(lo, lo+lsqBatch/n)
			if _, err := tr.TrainStep(ctx, nil, inputs, labels); err != nil {
				return fmt.Errorf("step %d: %w", k+1, err)
			}
			return nil
		}
		for k := range joinBatches[r] {
			if err := step(k); err != nil {
				return err
			}
		}
		if root, err := tr.Join(ctx); err != nil || root != 1 {
			return errors.Join(fmt.Errorf("rank %d: Join returned %d, want rank 1 (the last to join)", r, root), err)
		}
		if after == nil {
			return nil
		}
		return after(r, mctx, step)
	})
}

// TestJoin gives 3 ranks 2, 4 and 3 batches: the ones that run out call
// Join, which shadows the others' steps, and every rank then holds the
// variables (weights and Adam's state) of rank 1, which saw every step.
func TestJoin(t *testing.T) {
	p := newLSQ(4, 5)
	got := make([]map[string][]byte, len(joinBatches))
	errs := runJoin(t, p, ddptrain.Options{Reducer: ddp.Options{Join: ddp.JoinWorld}}, func(r int, mctx *mlctx.Context, _ func(int) error) error {
		got[r] = values(t, mctx)
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := 1; r < len(got); r++ {
		if !sameValues(got[0], got[r]) {
			t.Errorf("after Join, rank %d's variables differ from rank 0's", r)
		}
	}
}

// TestCheckpoint saves a checkpoint of a 2-rank Adam run (on rank 0: the
// other rank passes no handler) and loads it into rank 0 of a 3-rank and
// of a 1-rank trainer: after the first step's setup every rank holds the
// saved variables, optimizer state included, bit for bit.
func TestCheckpoint(t *testing.T) {
	p := newLSQ(2, 6)
	dir, saved := saveCheckpoint(t, p)
	for _, n := range []int{3, 1} {
		ctxs := make([]*mlctx.Context, n)
		onRanks(t, n, func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			ctxs[r] = mlctx.New()
			mctx := ctxs[r]
			if r == 0 {
				if _, err := checkpoints.Load(mctx).Dir(dir).Done(); err != nil {
					return err
				}
				mctx = mctx.Reuse() // its variables exist: GoMLX's examples do the same
			}
			tr, err := ddptrain.New(c, newBackend(t), mctx, p.model(r), lsqLoss, optimizer("adam", 1), ddptrain.Options{})
			if err != nil {
				return err
			}
			defer tr.Close()
			inputs, labels := p.tensors(0, lsqBatch/n)
			return tr.Setup(ctx, nil, inputs, labels)
		})
		checkLoaded(t, n, ctxs, saved)
	}
}

// TestCheckpointLoadedByOneRank: a checkpoint loaded on rank 1 of 2 and
// not on rank 0 would be replaced by rank 0's fresh variables at the first
// step: every rank fails with ErrMismatch naming rank 1, lazily loaded or
// at once. Loaded on every rank, it is what every rank holds.
func TestCheckpointLoadedByOneRank(t *testing.T) {
	p := newLSQ(2, 6)
	dir, saved := saveCheckpoint(t, p)
	for _, tc := range []struct {
		name      string
		loads     func(rank int) bool
		immediate bool
		ok        bool
	}{
		{"rank 1", func(r int) bool { return r == 1 }, false, false},
		{"rank 1/immediate", func(r int) bool { return r == 1 }, true, false},
		{"every rank", func(int) bool { return true }, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctxs := make([]*mlctx.Context, 2)
			errs := rankErrors(t, 2, func(ctx context.Context, c comm.Communicator) error {
				r := c.Rank()
				ctxs[r] = mlctx.New()
				mctx := ctxs[r]
				if tc.loads(r) {
					cfg := checkpoints.Load(mctx).Dir(dir)
					if tc.immediate {
						cfg = cfg.Immediate()
					}
					if _, err := cfg.Done(); err != nil {
						return err
					}
					mctx = mctx.Reuse()
				}
				tr, err := ddptrain.New(c, newBackend(t), mctx, p.model(r), lsqLoss, optimizer("adam", 1), ddptrain.Options{})
				if err != nil {
					return err
				}
				defer tr.Close()
				inputs, labels := p.tensors(0, lsqBatch/2)
				return tr.Setup(ctx, nil, inputs, labels)
			})
			if tc.ok {
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				checkLoaded(t, 2, ctxs, saved)
				return
			}
			for r, err := range errs {
				if !errors.Is(err, ddptrain.ErrMismatch) || !strings.Contains(err.Error(), "rank 1 loaded") {
					t.Errorf("rank %d: %v, want ErrMismatch naming rank 1's load", r, err)
				}
			}
		})
	}
}

// checkLoaded fails the test unless each of the n contexts holds the
// saved variables.
func checkLoaded(t *testing.T, n int, ctxs []*mlctx.Context, saved map[string][]byte) {
	t.Helper()
	for r := range n {
		got := values(t, ctxs[r])
		for name, want := range saved {
			if name == "/optimizers/learning_rate" {
				continue // read from the optimizer, not the checkpoint (as train.NewTrainer does)
			}
			if !slices.Equal(got[name], want) {
				t.Errorf("%d ranks, rank %d: %s differs from the checkpoint's", n, r, name)
			}
		}
	}
}

// saveCheckpoint trains p for 2 steps on 2 ranks and saves a checkpoint
// (on rank 0: the other rank passes no handler); it returns its directory
// and rank 0's variables.
func saveCheckpoint(t *testing.T, p *lsq) (string, map[string][]byte) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	var saved map[string][]byte
	onRanks(t, 2, func(ctx context.Context, c comm.Communicator) error {
		r := c.Rank()
		mctx := mlctx.New()
		tr, err := ddptrain.New(c, newBackend(t), mctx, p.model(r), lsqLoss, optimizer("adam", 1), ddptrain.Options{})
		if err != nil {
			return err
		}
		defer tr.Close()
		for k := range 2 {
			lo := k*lsqBatch + r*lsqBatch/2
			inputs, labels := p.tensors(lo, lo+lsqBatch/2)
			if _, err := tr.TrainStep(ctx, nil, inputs, labels); err != nil {
				return err
			}
		}
		var h *checkpoints.Handler
		if r == 0 {
			if h, err = checkpoints.Build(mctx).Dir(dir).Done(); err != nil {
				return err
			}
			saved = values(t, mctx)
		}
		return tr.Save(h)
	})
	if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
		t.Fatalf("no checkpoint in %s: %v", dir, err)
	}
	return dir, saved
}

// TestDataset checks that the ranks' batches of one step together hold
// the global batch a single process takes, in every epoch of a shuffled
// order, and that an epoch ends with io.EOF.
func TestDataset(t *testing.T) {
	const n, rows, batch = 3, 20, 2 // 6 batches of 3·2 per epoch, 2 rows dropped
	x := make([]float32, rows*2)
	y := make([]int32, rows)
	for i := range rows {
		x[2*i], x[2*i+1], y[i] = float32(i), float32(-i), int32(i)
	}
	in := []*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, rows, 2)}
	lab := []*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, rows, 1)}
	o := sampler.Options{Shuffle: true, Seed: 9, DropLast: true}
	one, err := ddptrain.NewDataset("one", 0, 1, n*batch, in, lab, o)
	if err != nil {
		t.Fatal(err)
	}
	shards := make([]*ddptrain.Dataset, n)
	for r := range n {
		if shards[r], err = ddptrain.NewDataset("shard", r, n, batch, in, lab, o); err != nil {
			t.Fatal(err)
		}
	}
	labelsOf := func(d *ddptrain.Dataset) []int32 {
		_, inputs, labels, err := d.Yield()
		if err != nil {
			t.Fatal(err)
		}
		xs := tensors.MustCopyFlatData[float32](inputs[0])
		ys := tensors.MustCopyFlatData[int32](labels[0])
		for i, l := range ys {
			if xs[2*i] != float32(l) || xs[2*i+1] != -float32(l) {
				t.Fatalf("example %d: inputs %v for label %d", i, xs[2*i:2*i+2], l)
			}
		}
		return ys
	}
	for epoch := range 2 {
		if one.Steps() != 3 || shards[0].Steps() != 3 {
			t.Fatalf("steps per epoch %d and %d, want 3", one.Steps(), shards[0].Steps())
		}
		for range one.Steps() {
			want := labelsOf(one)
			var got []int32
			for r := range n {
				got = append(got, labelsOf(shards[r])...)
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("epoch %d: the ranks' batches hold %v, the global batch %v", epoch, got, want)
			}
		}
		for _, d := range append(shards, one) {
			if _, _, _, err := d.Yield(); err != io.EOF {
				t.Fatalf("epoch %d: %v at the end, want io.EOF", epoch, err)
			}
			d.Reset()
		}
	}
}
