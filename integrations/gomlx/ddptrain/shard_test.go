package ddptrain_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
)

// TestShardMatchesUnsharded trains the least-squares problem over 1, 2
// and 3 inproc ranks with SGD and Adam, with the optimizer sharded
// (Options.Reducer.Shard = ShardParams) and not, and checks that after
// every step every rank of the sharded run holds the unsharded run's
// weights bit for bit, that each optimizer-state variable (Adam's moments
// and step counters) a sharded rank keeps has the unsharded run's bits,
// and that each moment is kept by exactly one rank. inproc's
// reduce-scatter sums each element in its all-reduce's order, the hook
// does the same arithmetic in both, and GoMLX's optimizers update each
// variable from its own gradient and state alone: no bound is needed.
//
// It also measures the optimizer state each rank keeps: within each
// bucket a rank's variables are at most 1/N of the bucket plus its
// largest variable (ShardParams' bound), so a rank's state is at most
// 1/N of the unsharded state plus, per bucket, the state of the bucket's
// largest variable, plus the scalars (step counters, learning rate) that
// every rank keeps.
func TestShardMatchesUnsharded(t *testing.T) {
	const steps = 4
	p := newLSQ(steps, 3)
	layouts := []struct {
		name string
		o    ddptrain.Options
	}{{"small buckets", smallBuckets}, {"one bucket", ddptrain.Options{}}}
	for _, kind := range []string{"sgd", "adam"} {
		for _, n := range []int{1, 2, 3} {
			for _, l := range layouts {
				t.Run(fmt.Sprintf("%s/%d ranks/%s", kind, n, l.name), func(t *testing.T) {
					plain := runCollect(t, p, kind, steps, n, l.o)
					o := l.o
					o.Reducer.Shard = ddp.ShardParams
					sharded := runCollect(t, p, kind, steps, n, o)
					checkSharded(t, n, plain, sharded)
				})
			}
		}
	}
}

// rankRun is what one rank of runCollect saw: its variables after each
// step, by scope and name (their bytes), which of them are optimizer
// state, and the Reducer's buckets.
type rankRun struct {
	steps   []map[string][]byte
	state   map[string]int  // optimizer-state variable: its bytes
	scalar  map[string]bool // optimizer-state scalars (step counters, learning rate), which every rank keeps
	weights map[string]int  // trainable variable: its bytes
	owned   map[string]bool
	buckets [][]string // per bucket: its trainable variables
}

func runCollect(t *testing.T, p *lsq, kind string, steps, n int, o ddptrain.Options) []rankRun {
	t.Helper()
	comms, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(comms)
	backend := newBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runs := make([]rankRun, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			inputs, labels := p.tensors(0, p.n)
			ds, err := ddptrain.NewDataset("lsq", r, n, lsqBatch/n, inputs, labels, sampler.Options{DropLast: true})
			if err != nil {
				errs[r] = err
				return
			}
			mctx := mlctx.New()
			tr, err := ddptrain.New(c, backend, mctx, p.model(r), lsqLoss, optimizer(kind, 1), o)
			if err != nil {
				errs[r] = err
				return
			}
			defer tr.Close()
			for range steps {
				spec, in, lab, err := ds.Yield()
				if err == nil {
					_, err = tr.TrainStep(ctx, spec, in, lab)
				}
				if err != nil {
					errs[r] = err
					return
				}
				runs[r].steps = append(runs[r].steps, snapshot(mctx))
			}
			runs[r].state, runs[r].weights, runs[r].owned, runs[r].scalar = map[string]int{}, map[string]int{}, map[string]bool{}, map[string]bool{}
			for _, v := range tr.OptimizerState() {
				runs[r].state[v.ScopeAndName()] = int(v.Shape().Memory())
				runs[r].scalar[v.ScopeAndName()] = v.Shape().IsScalar()
			}
			for _, v := range tr.Variables() {
				runs[r].weights[v.ScopeAndName()] = int(v.Shape().Memory())
			}
			for _, v := range tr.Owned() {
				runs[r].owned[v.ScopeAndName()] = true
			}
			names := tr.Reducer().Params()
			for _, b := range tr.Reducer().Buckets() {
				var vars []string
				for _, i := range b.Params {
					if i < len(tr.Variables()) {
						vars = append(vars, names[i].Name)
					}
				}
				runs[r].buckets = append(runs[r].buckets, vars)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return runs
}

// snapshot returns the bytes of every variable of ctx but the
// random-number state, by scope and name.
func snapshot(ctx *mlctx.Context) map[string][]byte {
	out := map[string][]byte{}
	for v := range ctx.IterVariables() {
		if v.Name() == mlctx.RNGStateVariableName {
			continue
		}
		value, err := v.Value()
		if err != nil {
			panic(err)
		}
		value.ConstBytes(func(b []byte) { out[v.ScopeAndName()] = bytes.Clone(b) })
	}
	return out
}

func checkSharded(t *testing.T, n int, plain, sharded []rankRun) {
	t.Helper()
	ref := plain[0]
	total, scalars := 0, 0
	for name, b := range ref.state {
		if _, trained := ref.weights[name]; trained {
			t.Fatalf("%s is both a variable and optimizer state", name)
		}
		if ref.scalar[name] {
			scalars += b
		} else {
			total += b
		}
	}
	keepers := map[string]int{}
	for r, run := range sharded {
		for k, vals := range run.steps {
			for name, want := range ref.steps[k] {
				got, ok := vals[name]
				_, isState := ref.state[name]
				switch {
				case !ok && !isState:
					t.Fatalf("rank %d step %d: no variable %s", r, k+1, name)
				case ok && !bytes.Equal(got, want):
					t.Fatalf("rank %d step %d: %s differs from the unsharded run's", r, k+1, name)
				}
			}
			for name := range vals {
				if _, ok := ref.steps[k][name]; !ok {
					t.Fatalf("rank %d step %d: variable %s, which the unsharded run has not", r, k+1, name)
				}
			}
		}
		mine := 0
		for name, b := range run.state {
			if !run.scalar[name] {
				mine += b
				keepers[name]++
			}
		}
		// The bound: 1/N of the unsharded state plus, per bucket, the
		// state of its largest variable (ref.state / ref.weights is the
		// optimizer's state per variable byte).
		perByte := float64(total) / float64(sum(ref.weights))
		bound := float64(total) / float64(n)
		for _, vars := range run.buckets {
			largest := 0
			for _, v := range vars {
				largest = max(largest, run.weights[v])
			}
			bound += perByte * float64(largest)
		}
		if float64(mine) > bound {
			t.Errorf("rank %d of %d keeps %d bytes of optimizer state (and %d of scalars); the unsharded run %d; bound %.0f", r, n, mine, scalars, total, bound)
		}
		t.Logf("rank %d of %d: %d bytes of optimizer state (%.3f of the unsharded %d; bound %.0f), %d of scalars; owns %d of %d variables",
			r, n, mine, float64(mine)/float64(max(total, 1)), total, bound, scalars, len(run.owned), len(run.weights))
	}
	for name := range ref.state {
		if !ref.scalar[name] && keepers[name] != 1 {
			t.Errorf("%s is kept by %d ranks, want 1", name, keepers[name])
		}
	}
}

func sum(m map[string]int) int {
	s := 0
	for _, b := range m {
		s += b
	}
	return s
}

// TestShardOptions: what the trainer cannot do with a sharded optimizer
// is refused, naming the option, and so is Save before the first step
// (there is no state to consolidate yet).
func TestShardOptions(t *testing.T) {
	comms, err := inproc.NewGroup(1)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(comms)
	backend := newBackend(t)
	p := newLSQ(1, 1)
	for _, tc := range []struct {
		o    ddp.Options
		want string
	}{
		{ddp.Options{Shard: ddp.ShardElements}, "ShardElements"},
		{ddp.Options{Shard: ddp.ShardParams, Join: ddp.JoinWorld}, "Join"},
	} {
		_, err := ddptrain.New(comms[0], backend, mlctx.New(), p.model(0), lsqLoss, optimizer("adam", 1), ddptrain.Options{Reducer: tc.o})
		if !errors.Is(err, ddptrain.ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrUnsupported naming %s", tc.o, err, tc.want)
		}
	}
	tr, err := ddptrain.New(comms[0], backend, mlctx.New(), p.model(0), lsqLoss, optimizer("adam", 1), ddptrain.Options{Reducer: ddp.Options{Shard: ddp.ShardParams}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Save(nil); !errors.Is(err, ddptrain.ErrUnsupported) {
		t.Errorf("Save with Shard before the first step: %v, want ErrUnsupported", err)
	}
}

// TestShardCheckpoint saves a checkpoint of a 2-rank Adam run with the
// optimizer sharded (Save consolidates the state on rank 0): it holds
// the bits of the checkpoint of the same run unsharded, every moment
// included. Loaded into 3 sharded ranks (on every rank) and into 1
// unsharded rank, every rank holds the saved weights and each the saved
// state of the variables it owns.
func TestShardCheckpoint(t *testing.T) {
	p := newLSQ(2, 6)
	_, want := saveCheckpoint(t, p)
	sharded := ddptrain.Options{Reducer: ddp.Options{Shard: ddp.ShardParams}}
	dir := filepath.Join(t.TempDir(), "sharded")
	onRanks(t, 2, func(ctx context.Context, c comm.Communicator) error {
		r := c.Rank()
		mctx := mlctx.New()
		tr, err := ddptrain.New(c, newBackend(t), mctx, p.model(r), lsqLoss, optimizer("adam", 1), sharded)
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
		}
		if err := tr.Save(h); err != nil {
			return err
		}
		// Training goes on: rank 0 dropped the other ranks' state.
		inputs, labels := p.tensors(r*lsqBatch/2, (r+1)*lsqBatch/2)
		_, err = tr.TrainStep(ctx, nil, inputs, labels)
		return err
	})
	read := mlctx.New()
	if _, err := checkpoints.Load(read).Dir(dir).Immediate().Done(); err != nil {
		t.Fatal(err)
	}
	got := values(t, read)
	for name, w := range want {
		if !slices.Equal(got[name], w) {
			t.Errorf("the sharded run's checkpoint: %s differs from the unsharded run's", name)
		}
	}
	for _, tc := range []struct {
		n int
		o ddptrain.Options
	}{{3, sharded}, {1, ddptrain.Options{}}} {
		ctxs := make([]*mlctx.Context, tc.n)
		onRanks(t, tc.n, func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			ctxs[r] = mlctx.New()
			if _, err := checkpoints.Load(ctxs[r]).Dir(dir).Done(); err != nil {
				return err
			}
			tr, err := ddptrain.New(c, newBackend(t), ctxs[r].Reuse(), p.model(r), lsqLoss, optimizer("adam", 1), tc.o)
			if err != nil {
				return err
			}
			defer tr.Close()
			inputs, labels := p.tensors(0, lsqBatch/tc.n)
			return tr.Setup(ctx, nil, inputs, labels)
		})
		kept := map[string]int{}
		for r := range tc.n {
			have := values(t, ctxs[r])
			for name, w := range want {
				if name == "/optimizers/learning_rate" {
					continue
				}
				g, ok := have[name]
				if !ok && !strings.Contains(name, "moment") {
					t.Errorf("%d ranks, rank %d: no %s", tc.n, r, name)
				}
				if ok && !slices.Equal(g, w) {
					t.Errorf("%d ranks, rank %d: %s differs from the checkpoint's", tc.n, r, name)
				}
				if ok {
					kept[name]++
				}
			}
		}
		for name := range want {
			if strings.Contains(name, "moment") && kept[name] != 1 && tc.n > 1 {
				t.Errorf("%d sharded ranks: %s loaded on %d ranks, want 1", tc.n, name, kept[name])
			}
		}
	}
}
