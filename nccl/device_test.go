//go:build cgo

package nccl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestLoaded: what is loaded is what the run says it is. Over the
// stand-in, the Library says so; in device mode (scripts/gpu-check.sh on
// a GPU machine) neither the Library nor the process's mappings show the
// stand-in, and NCCL is new enough.
func TestLoaded(t *testing.T) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	info := lib.Info()
	t.Logf("%s", info)
	if si != nil {
		if lib.StandIn() == "" || !strings.Contains(string(maps), "libstandin.so") {
			t.Fatalf("over the stand-in, StandIn() = %q and libstandin.so mapped = %v", lib.StandIn(), strings.Contains(string(maps), "libstandin.so"))
		}
		return
	}
	if os.Getenv(envDevice) == "standin" {
		if lib.StandIn() == "" {
			t.Fatalf("%s=standin, but what was loaded (%s) is not the stand-in", envDevice, lib.Paths().NCCL)
		}
		t.Logf("device mode over the STAND-IN, as %s=standin asks: nothing here ran on a GPU", envDevice)
		return
	}
	if lib.StandIn() != "" || info.StandIn != "" {
		t.Fatalf("device mode loaded the stand-in: %q", lib.StandIn())
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.Contains(line, "standin") {
			t.Fatalf("a stand-in is mapped: %s", line)
		}
	}
	if !strings.Contains(string(maps), "libnccl") || !strings.Contains(string(maps), "libcuda") {
		t.Fatalf("libnccl and libcuda are not both mapped")
	}
	if info.Err != nil || len(info.Devices) == 0 || lib.Version() < MinVersion {
		t.Fatalf("info: %v", info)
	}
}

// TestIssueOrder: everything issued on a communicator takes effect in
// issue order, without waiting in between: a Download right after a
// collective reads its result, and a kernel right after a collective
// works on its result. One rank suffices: an out-of-place all-reduce
// writes recv, which was zero before it.
func TestIssueOrder(t *testing.T) {
	n := groupSize(2)
	cs := newGroup(t, n, nil)
	count := 4 << 20 // 16 MiB: long enough on a GPU to be overtaken
	if si != nil {
		count = 1 << 16
	}
	runRanks(t, cs, func(r int, c *Comm) error {
		dev, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 256 << 20, SlabSize: 32 << 20})
		if err != nil {
			return err
		}
		defer dev.Close()
		send, recv := newMem(t, c, dev, count, comm.Float32), newMem(t, c, dev, count, comm.Float32)
		vals := make([]float32, count)
		for i := range vals {
			vals[i] = float32(i%1000) + 1
		}
		sum := make([]float32, count)
		for i, v := range vals {
			sum[i] = float32(n) * v
		}
		k := c.Kernels()
		defer func() { t.Logf("rank %d: %d of 40 launches answered ncclInProgress", r, c.deferred.Load()) }()
		for round := range 20 {
			send.set(f32Bytes(vals))
			recv.set(make([]byte, 4*count))
			w := c.AllReduce(send.buf, recv.buf, comm.Sum)
			got := recv.get()
			if i := firstDiff(got, f32Bytes(sum), 4); i >= 0 {
				return fmt.Errorf("round %d: a Download right after the all-reduce read element %d = % x before it was written", round, i, got[4*i:4*i+4])
			}
			w2 := c.AllReduce(send.buf, recv.buf, comm.Sum)
			k.Scale(recv.buf, 2)
			got = recv.get()
			want := make([]float32, count)
			for i, v := range sum {
				want[i] = 2 * v
			}
			if i := firstDiff(got, f32Bytes(want), 4); i >= 0 {
				return fmt.Errorf("round %d: a Scale right after the all-reduce ran before it (element %d = % x)", round, i, got[4*i:4*i+4])
			}
			for _, w := range []comm.Work{w, w2} {
				if err := w.Wait(t.Context()); err != nil {
					return err
				}
			}
		}
		return k.Sync()
	})
}

// TestAbortAndClose: Close with nothing pending destroys cleanly and is
// idempotent, and what is issued after it fails with ErrClosed; Abort with
// many collectives pending fails each one not already complete with
// ErrAborted within a bound, and a new communicator on the same devices
// works afterwards.
func TestAbortAndClose(t *testing.T) {
	testutil.NoLeak(t)
	n := groupSize(2)
	cs := newGroup(t, n, nil)
	runRanks(t, cs, func(r int, c *Comm) error {
		b := floats(t, 16, 1)
		return c.AllReduce(b, b, comm.Sum).Wait(t.Context())
	})
	for r, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatalf("rank %d: Close: %v", r, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("rank %d: second Close: %v", r, err)
		}
		b := floats(t, 4, 1)
		if err := c.AllReduce(b, b, comm.Sum).Wait(t.Context()); !errors.Is(err, comm.ErrClosed) {
			t.Fatalf("rank %d: all-reduce after Close: %v, want ErrClosed", r, err)
		}
	}

	cs = newGroup(t, n, nil)
	pools := make([]*allocator.Pool, n)
	for r, c := range cs {
		p, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 1 << 30, SlabSize: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pools[r] = p
	}
	count := 16 << 20 // 64 MiB: long enough on a GPU to be pending at Abort
	if si != nil {
		count = 1 << 14
	}
	ws := make([][]comm.Work, n)
	for r, c := range cs {
		m := newMem(t, c, pools[r], count, comm.Float32)
		for range 32 {
			ws[r] = append(ws[r], c.AllReduce(m.buf, m.buf, comm.Sum))
		}
	}
	start := time.Now()
	for _, c := range cs {
		c.Abort(errors.New("test abort"))
	}
	aborted := 0
	ctx, cancel := context.WithTimeout(context.Background(), AbortDrain+20*time.Second)
	defer cancel()
	for r := range ws {
		for i, w := range ws[r] {
			err := w.Wait(ctx)
			switch {
			case err == nil:
			case errors.Is(err, comm.ErrAborted):
				aborted++
			default:
				t.Fatalf("rank %d work %d: %v, want nil or ErrAborted", r, i, err)
			}
		}
	}
	t.Logf("abort: %d of %d pending all-reduces failed, all ended %v after Abort", aborted, n*32, time.Since(start).Round(time.Millisecond))
	for r, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatalf("rank %d: Close after Abort: %v", r, err)
		}
	}

	cs = newGroup(t, n, nil)
	runRanks(t, cs, func(r int, c *Comm) error {
		b := floats(t, 16, float32(r+1))
		if err := c.AllReduce(b, b, comm.Sum).Wait(t.Context()); err != nil {
			return err
		}
		want := floats(t, 16, float32(n*(n+1)/2))
		if !bytes.Equal(b.AsBytes(), want.AsBytes()) {
			return errors.New("wrong sum on a communicator made after an abort")
		}
		return nil
	})
}
