package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// A test-only "device", as in package ddp's tests: host memory that Go
// code may not address through the Buffers bench hands the backend
// (Loc == Device, so their views panic), reached through kernels that
// refuse host buffers, over an in-process group that refuses them too.
// A host access left on bench's device path panics, and the test fails.

type deviceSource struct{ allocator.Source }

func (deviceSource) Name() string { return "testdevice" }
func (deviceSource) Host() bool   { return false }

func onHost(op string, b comm.Buffer) comm.Buffer {
	if b.Loc != comm.Device || b.Device != 1 {
		panic(fmt.Sprintf("testdevice: %s of a buffer not on device 1 (loc %d, device %d, %d x %s)", op, b.Loc, b.Device, b.Count, b.DType))
	}
	b.Loc, b.Device = comm.Host, 0
	return b
}

type deviceKernels struct{ h comm.Kernels }

func (deviceKernels) Location() comm.Location          { return comm.Device }
func (k deviceKernels) Zero(b comm.Buffer)             { k.h.Zero(onHost("Zero", b)) }
func (k deviceKernels) Copy(d, s comm.Buffer)          { k.h.Copy(onHost("Copy", d), onHost("Copy", s)) }
func (k deviceKernels) Add(d, s comm.Buffer)           { k.h.Add(onHost("Add", d), onHost("Add", s)) }
func (k deviceKernels) Scale(b comm.Buffer, s float32) { k.h.Scale(onHost("Scale", b), s) }
func (k deviceKernels) Compress(d, s comm.Buffer, scale float32) {
	k.h.Compress(onHost("Compress", d), onHost("Compress", s), scale)
}
func (k deviceKernels) Decompress(d, s comm.Buffer) {
	k.h.Decompress(onHost("Decompress", d), onHost("Decompress", s))
}
func (k deviceKernels) Overflows(w, in comm.Buffer) int64 {
	return k.h.Overflows(onHost("Overflows", w), onHost("Overflows", in))
}
func (k deviceKernels) Upload(d comm.Buffer, src []byte)   { k.h.Upload(onHost("Upload", d), src) }
func (k deviceKernels) Download(dst []byte, s comm.Buffer) { k.h.Download(dst, onHost("Download", s)) }
func (k deviceKernels) Sync() error                        { return nil }

// deviceComm carries device buffers of device 1 only (bench must take
// the device from comm.DeviceOf), with a Source and kernels: DeviceMemory.
type deviceComm struct{ comm.Communicator }

func (c deviceComm) Capabilities() comm.Caps {
	caps := comm.CapsOf(c.Communicator)
	caps.Backend, caps.DeviceMemory, caps.HostMemory = "testdevice", true, false
	return caps
}
func (deviceComm) Device() int              { return 1 }
func (deviceComm) Kernels() comm.Kernels    { return deviceKernels{comm.HostKernels()} }
func (deviceComm) Source() allocator.Source { return deviceSource{allocator.HostSource()} }
func (c deviceComm) AllReduce(s, r comm.Buffer, op comm.Op) comm.Work {
	return c.Communicator.AllReduce(onHost("AllReduce", s), onHost("AllReduce", r), op)
}
func (c deviceComm) Broadcast(b comm.Buffer, root int) comm.Work {
	return c.Communicator.Broadcast(onHost("Broadcast", b), root)
}
func (c deviceComm) Reduce(s, r comm.Buffer, op comm.Op, root int) comm.Work {
	if r.Count > 0 {
		r = onHost("Reduce", r)
	}
	return c.Communicator.Reduce(onHost("Reduce", s), r, op, root)
}
func (c deviceComm) AllGather(s, r comm.Buffer) comm.Work {
	return c.Communicator.AllGather(onHost("AllGather", s), onHost("AllGather", r))
}
func (c deviceComm) ReduceScatter(s, r comm.Buffer, op comm.Op) comm.Work {
	return c.Communicator.ReduceScatter(onHost("ReduceScatter", s), onHost("ReduceScatter", r), op)
}
func (c deviceComm) Send(b comm.Buffer, peer int) comm.Work {
	return c.Communicator.Send(onHost("Send", b), peer)
}
func (c deviceComm) Recv(b comm.Buffer, peer int) comm.Work {
	return c.Communicator.Recv(onHost("Recv", b), peer)
}

func deviceGroup(t testing.TB, n int) []comm.Communicator {
	g := group(t, n)
	for i, c := range g {
		g[i] = deviceComm{c}
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
