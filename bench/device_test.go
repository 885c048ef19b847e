package bench

import (
	"context"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
)

// deviceGroup is an in-process group whose ranks carry device memory of
// device 1 only (commtest.DeviceComm): a host access left on bench's
// device path panics, and the test fails; bench must take the device from
// comm.DeviceOf.
func deviceGroup(t testing.TB, n int) []comm.Communicator {
	g := group(t, n)
	for i, c := range g {
		g[i] = commtest.DeviceComm{Communicator: c, Ordinal: 1}
	}
	return g
}

// TestCollectiveDevice: with CollectiveConfig.Device every collective runs
// on buffers from each rank's device pool, filled and checked through its
// kernels, in place and out of place, with no wrong element; a backend
// without device memory is refused.
func TestCollectiveDevice(t *testing.T) {
	g := deviceGroup(t, 3)
	for _, op := range Collectives {
		for _, dt := range []comm.DType{comm.Float32, comm.BFloat16, comm.Int64} {
			cfg := small(op, dt, comm.Sum)
			cfg.Device = true
			rows, err := RunCollective(context.Background(), g, cfg, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", op, dt, err)
			}
			if w := WrongTotal(rows); w != 0 || len(rows) != 3 {
				t.Errorf("%s %s: %d rows, %d wrong elements", op, dt, len(rows), w)
			}
		}
	}
	cfg := small(AllReduce, comm.Float32, comm.Sum)
	cfg.Device = true
	if _, err := RunCollective(context.Background(), group(t, 2), cfg, nil); err == nil {
		t.Error("Device buffers over inproc: no error")
	}
}

// TestRunDevice: with device pools the simulated backward writes the
// gradients through the kernels and the check downloads them; every step
// is verified, so Run returning without error means the averages were
// right.
func TestRunDevice(t *testing.T) {
	for _, hook := range []string{"none", "fp16"} {
		t.Run(hook, func(t *testing.T) {
			const n = 2
			g := deviceGroup(t, n)
			pools := make([]*allocator.Pool, n)
			for r, c := range g {
				p, err := allocator.New(allocator.Options{Source: c.(DeviceMemory).Source(), Limit: 64 << 20})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				pools[r] = p
			}
			h, err := NewHook(hook)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(context.Background(), Config{Params: tinyParams(), Comms: g, Pools: pools, Hook: h,
				BucketCap: 256 << 10, FirstBucketCap: 16 << 10, Steps: 3, Warmup: 1})
			if err != nil {
				t.Fatal(err)
			}
			if res.Steps != 3 || res.Ranks != n {
				t.Errorf("%d steps over %d ranks", res.Steps, res.Ranks)
			}
			for r, p := range pools {
				if st := p.Stats(); st.InUse != 0 {
					t.Errorf("rank %d: %d bytes of the pool still in use after Run", r, st.InUse)
				}
			}
		})
	}
}
