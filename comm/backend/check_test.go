package backend

import (
	"errors"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

func TestCheck(t *testing.T) {
	mem := make([]float32, 64)
	at := func(i, n int) comm.Buffer { return comm.Float32s(mem[i : i+n]) }
	dev := at(0, 4)
	dev.Loc = comm.Device
	nilBuf := comm.Buffer{Count: 4, DType: comm.Float32}
	badDT := at(0, 4)
	badDT.DType = 0
	neg := at(0, 4)
	neg.Count = -1
	host := Rules{Rank: 1, Size: 4, HostOnly: true}
	mpi := Rules{Rank: 1, Size: 4, HostOnly: true, MaxCount: 3}
	any := Rules{Rank: 1, Size: 4}
	gpu := Rules{Rank: 1, Size: 4, OneDevice: true, Device: 1}
	dev1 := dev
	dev1.Device = 1
	badLoc := at(0, 4)
	badLoc.Loc = 7
	ar := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum}
	cases := []struct {
		name       string
		r          Rules
		call       comm.Call
		send, recv comm.Buffer
		want       Reason
		text       string
	}{
		{"all_reduce", host, ar, at(0, 4), at(4, 4), Valid, "valid"},
		{"all_reduce in place", host, ar, at(0, 4), at(0, 4), Valid, ""},
		{"all_reduce overlap", host, ar, at(0, 4), at(2, 4), Overlapping, "without being the same buffer"},
		{"all_reduce pair", host, ar, at(0, 4), at(4, 5), BadPair, "recv is 5 x float, send is 4 x float"},
		{"all_reduce op", host, comm.Call{Kind: comm.KindAllReduce, Op: 99}, at(0, 4), at(4, 4), BadOp, "reduction op"},
		{"dtype", host, ar, badDT, badDT, BadDType, "send has dtype"},
		{"count", host, ar, neg, neg, BadCount, "send has count -1"},
		{"nil", host, ar, at(0, 4), nilBuf, NilAddr, "recv has count 4 and a nil address"},
		{"device on host-only", host, ar, dev, dev, DeviceMem, "device memory"},
		{"device anywhere", any, ar, dev, dev, Valid, ""},
		{"the rank's device", gpu, ar, dev1, dev1, Valid, ""},
		{"host on a device backend", gpu, ar, at(0, 4), at(4, 4), Valid, ""},
		{"another device", gpu, ar, dev, dev, OtherDevice, "send is memory of device 0, not the rank's"},
		{"unknown location", any, ar, at(0, 4), badLoc, BadLoc, "recv has unknown location 7"},
		{"count limit", mpi, ar, at(0, 4), at(4, 4), TooMany, "send has 4 elements"},
		{"broadcast root", host, comm.Call{Kind: comm.KindBroadcast, Root: 4}, at(0, 4), at(0, 4), BadRoot, "root 4 out of range for 4 ranks"},
		{"reduce off root ignores recv", host, comm.Call{Kind: comm.KindReduce, Op: comm.Sum, Root: 0}, at(0, 4), nilBuf, Valid, ""},
		{"reduce root pair", host, comm.Call{Kind: comm.KindReduce, Op: comm.Sum, Root: 1}, at(0, 4), at(4, 3), BadPair, ""},
		{"reduce root overlap", host, comm.Call{Kind: comm.KindReduce, Op: comm.Sum, Root: 1}, at(0, 4), at(1, 4), Overlapping, ""},
		{"all_gather", host, comm.Call{Kind: comm.KindAllGather}, at(0, 4), at(16, 16), Valid, ""},
		{"all_gather in place", host, comm.Call{Kind: comm.KindAllGather}, at(20, 4), at(16, 16), Valid, ""},
		{"all_gather other block", host, comm.Call{Kind: comm.KindAllGather}, at(24, 4), at(16, 16), Overlapping, "other than as this rank's block"},
		{"all_gather same start off rank 0", host, comm.Call{Kind: comm.KindAllGather}, at(16, 4), at(16, 16), Overlapping, ""},
		{"all_gather size", host, comm.Call{Kind: comm.KindAllGather}, at(0, 4), at(16, 17), BadGather, "recv is 17 x float, want 16 x float"},
		{"reduce_scatter in place", host, comm.Call{Kind: comm.KindReduceScatter, Op: comm.Max}, at(16, 16), at(20, 4), Valid, ""},
		{"reduce_scatter size", host, comm.Call{Kind: comm.KindReduceScatter, Op: comm.Max}, at(16, 15), at(0, 4), BadScatter, "send is 15 x float, want 16 x float"},
		{"reduce_scatter other block", host, comm.Call{Kind: comm.KindReduceScatter, Op: comm.Max}, at(16, 16), at(16, 4), Overlapping, ""},
		{"send", host, comm.Call{Kind: comm.KindSend, Root: 2}, at(0, 4), at(0, 4), Valid, ""},
		{"send to self", host, comm.Call{Kind: comm.KindSend, Root: 1}, at(0, 4), at(0, 4), BadPeer, "peer 1 is the rank itself"},
		{"recv from -1", host, comm.Call{Kind: comm.KindRecv, Root: -1}, at(0, 4), at(0, 4), BadPeer, "peer -1 out of range"},
		{"barrier", host, comm.Call{Kind: comm.KindBarrier}, comm.Buffer{}, comm.Buffer{}, Valid, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.call.DType, tc.call.Count = tc.send.DType, tc.send.Count
			if tc.call.Kind == comm.KindReduceScatter {
				tc.call.DType, tc.call.Count = tc.recv.DType, tc.recv.Count
			}
			v := tc.r.Check(&tc.call, &tc.send, &tc.recv)
			if v.Reason != tc.want {
				t.Fatalf("Check = %+v (%s), want reason %d", v, v.Text(tc.call, tc.r.Size), tc.want)
			}
			if text := v.Text(tc.call, tc.r.Size); !strings.Contains(text, tc.text) {
				t.Errorf("Text = %q, want it to contain %q", text, tc.text)
			}
			err := v.Err(tc.call, tc.r.Size)
			if (err == nil) != v.OK() || err != nil && !errors.Is(err, comm.ErrInvalid) {
				t.Errorf("Err = %v", err)
			}
		})
	}
}

// TestCheckAllocs: checking a valid call allocates nothing, since every
// backend checks every call.
func TestCheckAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	mem := make([]float32, 8)
	send, recv := comm.Float32s(mem[:4]), comm.Float32s(mem[4:])
	call := comm.Call{Kind: comm.KindAllReduce, Op: comm.Avg, DType: comm.Float32, Count: 4}
	r := Rules{Rank: 0, Size: 2, HostOnly: true}
	if n := testing.AllocsPerRun(100, func() {
		if err := r.Check(&call, &send, &recv).Err(call, 2); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per check, want 0", n)
	}
}
