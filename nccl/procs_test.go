//go:build cgo

package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/launch"
)

// The scenarios here run two ways: as ordinary tests, both ranks in this
// process over whatever is loaded, and as two processes (one rank each,
// launched torchrun's way), which is how scripts/gpu-check.sh runs them
// on a GPU machine: DDPGO_NCCL_PROCS names the scenario, and
// TestTwoProcesses runs this process's rank of it. The stand-in's ranks
// meet only inside one process, so over it only the first way runs.
const envProcs = "DDPGO_NCCL_PROCS"

// procTimeout is Config.Timeout in the scenarios: a dead peer fails the
// survivor within it plus AbortDrain.
const procTimeout = 20 * time.Second

// scenario is one rank's side of a scenario. cs are the rank's
// communicators (one per group; every scenario but "threads" uses one),
// die ends the rank where the scenario kills it.
type scenario func(t *testing.T, rank int, cs []*Comm, die func()) error

var scenarios = map[string]struct {
	groups int
	run    scenario
}{
	// A peer killed in connection setup, before its first collective.
	"dead-at-setup": {1, func(t *testing.T, rank int, cs []*Comm, die func()) error { return deadPeer(t, rank, cs[0], 0, die) }},
	// A peer killed after a few collectives.
	"dead-mid-run": {1, func(t *testing.T, rank int, cs []*Comm, die func()) error { return deadPeer(t, rank, cs[0], 5, die) }},
	// Issue order and groups on device memory.
	"order": {1, func(t *testing.T, rank int, cs []*Comm, _ func()) error { return order(t, rank, cs[0]) }},
	// Two communicators per rank, issued from goroutines that move
	// between OS threads.
	"threads": {2, func(t *testing.T, rank int, cs []*Comm, _ func()) error { return threads(t, rank, cs) }},
}

// TestScenarios runs every scenario with both ranks in this process; a
// rank that dies is aborted.
func TestScenarios(t *testing.T) {
	for name, sc := range scenarios {
		t.Run(name, func(t *testing.T) {
			groups := make([][]*Comm, sc.groups)
			for g := range groups {
				groups[g] = newGroup(t, 2, func(cfg *Config) { cfg.Timeout = procTimeout })
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				var cs []*Comm
				for _, g := range groups {
					cs = append(cs, g[r])
				}
				wg.Go(func() {
					errs[r] = sc.run(t, r, cs, func() {
						for _, c := range cs {
							c.Abort(errors.New("the scenario ends this rank"))
						}
					})
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTwoProcesses runs this process's rank of the scenario
// DDPGO_NCCL_PROCS names, with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT as torchrun sets them (group g meets at MASTER_PORT+g). A
// rank that dies kills its process with SIGKILL.
func TestTwoProcesses(t *testing.T) {
	name := os.Getenv(envProcs)
	if name == "" {
		t.Skipf("%s is not set: scripts/gpu-check.sh runs this as two processes", envProcs)
	}
	sc, ok := scenarios[name]
	if !ok {
		t.Fatalf("%s=%q: no such scenario", envProcs, name)
	}
	env, err := launch.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if env.Size != 2 {
		t.Fatalf("%v: the scenarios have two ranks", env)
	}
	cs := make([]*Comm, sc.groups)
	for g := range cs {
		e := env
		e.MasterPort += g
		cfg := Config{Timeout: procTimeout, PollInterval: time.Millisecond}
		ctx, cancel := context.WithTimeout(context.Background(), 2*procTimeout)
		cs[g], err = openLaunched(ctx, lib, e, JobOptions{Config: cfg, Key: fmt.Sprintf("ddpgo/nccl/test/%s/%d", name, g)})
		cancel()
		if err != nil {
			t.Fatalf("group %d: %v", g, err)
		}
	}
	err = sc.run(t, env.Rank, cs, func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
	for g, c := range cs {
		var settled time.Duration
		if n := c.deferred.Load(); n > 0 {
			settled = time.Duration(c.settling.Load() / int64(n))
		}
		t.Logf("rank %d, group %d: %d launches answered ncclInProgress, settled in %v on average", env.Rank, g, c.deferred.Load(), settled)
		if cerr := c.Close(); cerr != nil {
			t.Logf("rank %d, group %d: Close: %v", env.Rank, g, cerr)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// deadPeer: rank 1 dies after n collectives. Rank 0's next collective
// fails, with ErrAborted or ErrTimeout, within Config.Timeout plus
// AbortDrain; a Wait with a short deadline on it returns at its deadline
// (or with the failure, if that came first); Close then returns.
func deadPeer(t *testing.T, rank int, c *Comm, n int, die func()) error {
	x := floats(t, 1024, float32(rank+1))
	for i := range n {
		if err := c.AllReduce(x, x, comm.Sum).Wait(t.Context()); err != nil {
			return fmt.Errorf("rank %d: all-reduce %d before the peer dies: %w", rank, i, err)
		}
	}
	if rank == 1 {
		die()
		return nil
	}
	w := c.AllReduce(x, x, comm.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := w.Wait(ctx)
	cancel()
	if err == nil {
		return errors.New("rank 0: an all-reduce completed without its dead peer")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, comm.ErrAborted) {
		return fmt.Errorf("rank 0: Wait with a short deadline: %w, want its deadline or the failure", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), procTimeout+AbortDrain+10*time.Second)
	defer cancel()
	if err := w.Wait(ctx); errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("rank 0: the all-reduce with a dead peer still pending after Timeout %v + AbortDrain %v", procTimeout, AbortDrain)
	} else if !errors.Is(err, comm.ErrAborted) && !errors.Is(err, comm.ErrTimeout) {
		return fmt.Errorf("rank 0: the all-reduce with a dead peer: %v, want ErrAborted or ErrTimeout", err)
	}
	c.Close()
	return nil
}

// order: on device memory, a Download issued after an all-reduce reads
// its result, and a group of three all-reduces is launched as one.
func order(t *testing.T, rank int, c *Comm) error {
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 16 << 20, SlabSize: 4 << 20})
	if err != nil {
		return err
	}
	defer pool.Close()
	k := c.Kernels()
	for round := range 20 {
		var bufs []comm.Buffer
		for range 4 {
			blk, err := pool.Get(4096 * 4)
			if err != nil {
				return err
			}
			defer pool.Put(blk)
			b := comm.Buffer{Addr: blk.Addr(), Count: 4096, DType: comm.Float32, Loc: comm.Device, Device: c.Device()}
			k.Upload(b, encode(comm.Float32, filled(4096, float64(rank+round))))
			bufs = append(bufs, b)
		}
		w := c.AllReduce(bufs[0], bufs[0], comm.Sum)
		c.GroupStart()
		ws := []comm.Work{w}
		for _, b := range bufs[1:] {
			ws = append(ws, c.AllReduce(b, b, comm.Sum))
		}
		if err := c.GroupEnd(); err != nil {
			return fmt.Errorf("rank %d, round %d: GroupEnd: %w", rank, round, err)
		}
		// No Wait before the Download: the stream orders it.
		want := float32(1 + 2*round)
		for i, b := range bufs {
			got := make([]byte, b.Bytes())
			k.Download(got, b)
			first := math.Float32frombits(binary.LittleEndian.Uint32(got))
			last := math.Float32frombits(binary.LittleEndian.Uint32(got[len(got)-4:]))
			if first != want || last != want {
				return fmt.Errorf("rank %d, round %d, buffer %d: %v ... %v, want %v", rank, round, i, first, last, want)
			}
		}
		for i, w := range ws {
			if err := w.Wait(t.Context()); err != nil {
				return fmt.Errorf("rank %d, round %d, all-reduce %d: %w", rank, round, i, err)
			}
		}
	}
	return k.Sync()
}

// threads: each rank drives two communicators, every operation issued
// from a new goroutine, which may run on any OS thread (NCCL 2.14-2.26
// keep a group job in the launching thread's storage).
func threads(t *testing.T, rank int, cs []*Comm) error {
	var wg sync.WaitGroup
	errs := make([]error, len(cs))
	for g, c := range cs {
		wg.Go(func() {
			for round := range 50 {
				var iwg sync.WaitGroup
				var err error
				iwg.Go(func() {
					x := floats(t, 256, float32(rank+1))
					if err = c.AllReduce(x, x, comm.Sum).Wait(t.Context()); err == nil && x.AsFloat32()[255] != 3 {
						err = fmt.Errorf("sum %v, want 3", x.AsFloat32()[255])
					}
				})
				iwg.Wait()
				if err != nil {
					errs[g] = fmt.Errorf("rank %d, group %d, round %d: %w", rank, g, round, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func filled(n int, v float64) []float64 {
	f := make([]float64, n)
	for i := range f {
		f[i] = v
	}
	return f
}
