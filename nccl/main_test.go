//go:build cgo

package nccl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/standin"
)

// By default every test runs over the stand-in (testdata/standin), built
// once per test binary: not NCCL, not a GPU. With DDPGO_NCCL_DEVICE=1 the
// tests run over the real libraries instead (DDPGO_NCCL_LIBRARY and
// DDPGO_CUDA_LIBRARY, else the loader's path), on this machine's GPUs, as
// scripts/gpu-check.sh runs them: si is then nil, tests that need the
// stand-in's controls skip (standInOnly), and groups larger than the
// machine's device count skip (newGroup) or shrink (groupSize).
var (
	si      *standin.Lib
	lib     *Library
	devices int // CUDA devices of this machine, in device mode
)

// envDevice turns device mode on: "1" over real libraries, "standin"
// over the stand-in given by the same variables, as scripts/gpu-check.sh
// --standin checks itself without a GPU (TestLoaded then wants the
// stand-in).
const envDevice = "DDPGO_NCCL_DEVICE"

func deviceMode() bool {
	v := os.Getenv(envDevice)
	return v == "1" || v == "standin"
}

func TestMain(m *testing.M) {
	if deviceMode() {
		var err error
		if lib, err = Open(Libraries{}); err == nil {
			err = lib.init()
		}
		if err == nil {
			devices, err = lib.d.deviceCount()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s=1: %v\n", envDevice, err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, lib.Info())
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "nccl-standin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if si, err = standin.Build(dir, "testdata/standin/standin.c"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// Read here too, so that Go's test cache keys on the mode: the
		// stand-in alone reading it would not defeat the cache.
		if v := os.Getenv(standin.Env); si.Model() < 0 {
			fmt.Fprintf(os.Stderr, "%s=%q: want an NCCL version from 2.14 on, such as 2.21, 2.25, 2.26 or 2.28\n", standin.Env, v)
			return 1
		}
		if lib, err = Open(Libraries{NCCL: si.NCCL, CUDA: si.CUDA}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		code := m.Run()
		if v := si.Violations(); len(v) > 0 {
			fmt.Fprintf(os.Stderr, "the stand-in recorded %d violation(s) of NCCL's rules:\n  %s\n", len(v), strings.Join(v, "\n  "))
			code = 1
		}
		return code
	}()
	os.Exit(code)
}

// testConfig is a Config with short deadlines for tests.
func testConfig(rank, size int, id UniqueID) Config {
	return Config{Rank: rank, Size: size, Device: rank % 4, ID: id, Timeout: 20 * time.Second, PollInterval: time.Millisecond}
}

// newGroup makes n communicators of a new group, one goroutine per rank as
// separate processes would, closed when the test ends.
func newGroup(t testing.TB, n int, adjust func(*Config)) []*Comm {
	t.Helper()
	if si == nil && n > devices {
		t.Skipf("a group of %d ranks needs %d devices; this machine has %d (NCCL refuses two ranks on one device)", n, n, devices)
	}
	id, err := lib.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			cfg := testConfig(r, n, id)
			if adjust != nil {
				adjust(&cfg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cs[r], errs[r] = lib.NewComm(ctx, cfg)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for r, c := range cs {
			if err := c.Close(); err != nil {
				t.Errorf("rank %d: Close: %v", r, err)
			}
		}
	})
	noViolations(t)
	return cs
}

// noViolations fails t if the stand-in records a violation of NCCL's
// rules while t runs (TestMain also fails the binary on any).
func noViolations(t testing.TB) {
	if si == nil {
		return
	}
	before := len(si.Violations())
	t.Cleanup(func() {
		if v := si.Violations(); len(v) > before {
			t.Errorf("the stand-in recorded violations of NCCL's rules:\n  %s", strings.Join(v[before:], "\n  "))
		}
	})
}

// groupSize is want over the stand-in, and at most the device count on
// a machine's GPUs.
func groupSize(want int) int {
	if si == nil {
		return min(want, devices)
	}
	return want
}

// standInOnly skips a test that needs the stand-in's controls (injected
// results, stalls, gates, counters) when it runs over real libraries.
func standInOnly(t testing.TB) {
	t.Helper()
	if si == nil {
		t.Skip("needs the stand-in's controls, which device mode does not load")
	}
}

// wait waits for ws with a bound, failing the test on a timeout.
func wait(t testing.TB, ws ...comm.Work) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, len(ws))
	for i, w := range ws {
		errs[i] = w.Wait(ctx)
		if errors.Is(errs[i], context.DeadlineExceeded) {
			t.Fatalf("work %d (id %d) did not complete", i, w.ID())
		}
	}
	return errs
}

func waitOK(t testing.TB, ws ...comm.Work) {
	t.Helper()
	for i, err := range wait(t, ws...) {
		if err != nil {
			t.Fatalf("work %d: %v", i, err)
		}
	}
}

// hostPool returns a host CommPool closed when the test ends.
func hostPool(t testing.TB) *allocator.Pool {
	p, err := allocator.New(allocator.Options{Limit: 256 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
