package backend

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"unsafe"

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

// TestCheckSizes holds the calls whose sizes overflow, or whose buffers
// share bytes without the aliasing the contract allows, to invalid.
func TestCheckSizes(t *testing.T) {
	mem := make([]float32, 64)
	at := func(i, n int) comm.Buffer { return comm.Float32s(mem[i : i+n]) }
	huge := func(b comm.Buffer, n int) comm.Buffer { b.Count = n; return b }
	onDev := func(b comm.Buffer, d int) comm.Buffer { b.Device = d; return b }
	// top is 16 bytes that end just before the last address: a buffer's
	// end, one past its last byte, must be an address.
	last := uintptr(math.MaxUint64 - 16)
	top := comm.HostBuffer(unsafe.Add(unsafe.Pointer(nil), last), 4, comm.Float32)
	bytes := func(b comm.Buffer) comm.Buffer { b.DType = comm.Uint8; return b }
	r4 := Rules{Rank: 1, Size: 4}
	ar := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum}
	rs := comm.Call{Kind: comm.KindReduceScatter, Op: comm.Sum}
	ag := comm.Call{Kind: comm.KindAllGather}
	cases := []struct {
		name       string
		call       comm.Call
		send, recv comm.Buffer
		want       Reason
		text       string
	}{
		{"reduce_scatter 4 x 2^62 blocks in 0", rs, comm.Buffer{DType: comm.Float32}, huge(at(0, 1), 1<<62), TooLarge, "recv has count 4611686018427387904"},
		{"all_gather 4 x 2^62 blocks in 0", ag, huge(at(0, 1), 1<<62), comm.Buffer{DType: comm.Float32}, TooLarge, "send has count 4611686018427387904"},
		{"reduce_scatter 4 x 2^60 blocks in 0", rs, comm.Buffer{DType: comm.Float32}, huge(at(0, 1), 1<<60), BadScatter, "send is 0 x float, want 4611686018427387904 x float"},
		{"reduce_scatter 4 x 2^62 bytes in 0", rs, comm.Buffer{DType: comm.Uint8}, bytes(huge(at(0, 1), 1<<62)), BadScatter, "send is 0 x uint8, want 4·4611686018427387904 x uint8"},
		{"all_gather 4 x 2^62 bytes in 0", ag, bytes(huge(at(0, 1), 1<<62)), comm.Buffer{DType: comm.Uint8}, BadGather, "want 4·4611686018427387904 x uint8"},
		{"all_reduce 2^62+1 elements, 4 bytes mod 2^64", ar, huge(at(0, 1), 1<<62+1), huge(at(1, 1), 1<<62+1), TooLarge, "send has count"},
		{"all_reduce overlap by 4 bytes", ar, at(0, 4), at(3, 4), Overlapping, "without being the same buffer"},
		{"all_reduce overlap by 4 bytes, host Device fields differ", ar, at(0, 4), onDev(at(3, 4), 1), Overlapping, ""},
		{"all_reduce same address, host Device fields differ", ar, at(0, 4), onDev(at(0, 4), 1), Overlapping, ""},
		{"all_reduce at the end of memory", ar, top, at(0, 4), Valid, ""},
		{"all_reduce past the end of memory", ar, huge(top, 5), at(0, 5), TooLarge, "send has count 5: its bytes do not fit"},
		{"all_reduce up to the last address", ar, at(0, 5), bytes(huge(top, 17)), TooLarge, "recv has count 17"},
		{"all_gather overlap by 4 bytes", ag, at(3, 4), at(4, 16), Overlapping, ""},
		{"reduce_scatter overlap by 4 bytes", rs, at(4, 16), at(19, 4), Overlapping, ""},
		{"reduce_scatter in place", rs, at(4, 16), at(8, 4), Valid, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.call.DType, tc.call.Count = tc.send.DType, tc.send.Count
			if tc.call.Kind == comm.KindReduceScatter {
				tc.call.DType, tc.call.Count = tc.recv.DType, tc.recv.Count
			}
			v := r4.Check(&tc.call, &tc.send, &tc.recv)
			if v.Reason != tc.want {
				t.Fatalf("Check = %+v (%s), want reason %d", v, v.Text(tc.call, r4.Size), tc.want)
			}
			if ref := checkRef(r4, tc.call, tc.send, tc.recv); ref != v {
				t.Errorf("Check = %+v, the reference says %+v", v, ref)
			}
			if text := v.Text(tc.call, r4.Size); !strings.Contains(text, tc.text) {
				t.Errorf("Text = %q, want it to contain %q", text, tc.text)
			}
		})
	}
}

// FuzzCheck checks Rules.Check against checkRef, a slow reference that
// computes every size and address exactly, on arbitrary calls, buffers
// and groups. Addresses lie in the upper half of the address space (no
// Go memory there), where the fuzzer can put buffers past its end.
func FuzzCheck(f *testing.F) {
	const base = 1 << 63
	f.Add(uint8(comm.KindAllReduce), uint8(comm.Sum), 0, uint64(4), uint64(1), uint8(0), 0, 0,
		uint64(0), 4, uint8(comm.Float32), uint8(0), 0, int64(12), false, 4, uint8(comm.Float32), uint8(0), 0)
	f.Add(uint8(comm.KindReduceScatter), uint8(comm.Sum), 0, uint64(4), uint64(1), uint8(0), 0, 0,
		uint64(0), 0, uint8(comm.Float32), uint8(0), 0, int64(64), false, 1<<62, uint8(comm.Float32), uint8(0), 0)
	f.Add(uint8(comm.KindReduceScatter), uint8(comm.Sum), 0, uint64(4), uint64(1), uint8(0), 0, 0,
		uint64(0), 0, uint8(comm.Uint8), uint8(0), 0, int64(64), false, 1<<62, uint8(comm.Uint8), uint8(0), 0)
	f.Add(uint8(comm.KindAllReduce), uint8(comm.Sum), 0, uint64(2), uint64(1), uint8(0), 0, 0,
		uint64(64), 4, uint8(comm.Float32), uint8(0), 0, int64(0), true, 4, uint8(comm.Float32), uint8(0), 1)
	f.Add(uint8(comm.KindAllGather), uint8(0), 0, uint64(4), uint64(2), uint8(0), 0, 0,
		uint64(1000), 3, uint8(comm.Float64), uint8(0), 0, int64(-48), true, 12, uint8(comm.Float64), uint8(0), 0)
	f.Add(uint8(comm.KindReduceScatter), uint8(comm.Max), 0, uint64(3), uint64(2), uint8(1), 0, 0,
		uint64(5000), 12, uint8(comm.Float16), uint8(1), 0, int64(16), true, 4, uint8(comm.Float16), uint8(1), 0)
	f.Add(uint8(comm.KindReduce), uint8(comm.Avg), 2, uint64(3), uint64(2), uint8(4), 8, 0,
		uint64(1<<63-20), 5, uint8(comm.Int32), uint8(0), 0, int64(0), true, 5, uint8(comm.Int32), uint8(0), 1)
	f.Add(uint8(comm.KindSend), uint8(0), 1, uint64(2), uint64(0), uint8(2), 0, 1,
		uint64(8), 1, uint8(comm.Uint8), uint8(1), 1, int64(0), false, 0, uint8(0), uint8(0), 0)
	f.Fuzz(func(t *testing.T, kind, op uint8, root int, size, rank uint64, flags uint8, maxCount, device int,
		a0 uint64, c0 int, dt0, loc0 uint8, dev0 int, a1 int64, rel bool, c1 int, dt1, loc1 uint8, dev1 int) {
		r := Rules{Size: int(max(size%(1<<62), 1)), HostOnly: flags&1 != 0, OneDevice: flags&2 != 0, MaxCount: maxCount, Device: device}
		r.Rank = int(rank % uint64(r.Size))
		addr := func(off uint64) unsafe.Pointer {
			if off == 0 {
				return nil
			}
			return unsafe.Add(unsafe.Pointer(nil), uintptr(base+off%base))
		}
		send := comm.Buffer{Addr: addr(a0), Count: c0, DType: comm.DType(dt0), Loc: comm.Location(loc0), Device: dev0}
		off := uint64(a1)
		if rel { // recv at an offset from send, as aliasing buffers are
			off = a0 + uint64(a1)
		}
		recv := comm.Buffer{Addr: addr(off), Count: c1, DType: comm.DType(dt1), Loc: comm.Location(loc1), Device: dev1}
		call := comm.Call{Kind: comm.Kind(kind % 10), Op: comm.Op(op), Root: root, DType: send.DType, Count: send.Count}
		if call.Kind == comm.KindReduceScatter {
			call.DType, call.Count = recv.DType, recv.Count
		}
		v := r.Check(&call, &send, &recv)
		if ref := checkRef(r, call, send, recv); v != ref {
			t.Fatalf("rules %+v, %+v, send %+v, recv %+v: Check = %+v (%s), the reference says %+v (%s)",
				r, call, send, recv, v, v.Text(call, r.Size), ref, ref.Text(call, r.Size))
		}
		if err := v.Err(call, r.Size); (err == nil) != v.OK() || err != nil && !errors.Is(err, comm.ErrInvalid) {
			t.Fatalf("Err = %v for %+v", err, v)
		}
	})
}

// checkRef is Check written for clarity, not speed: every size and
// address is a big.Int, so nothing overflows; memory is a set of spaces
// (host, and one per device) of byte intervals.
func checkRef(r Rules, call comm.Call, send, recv comm.Buffer) Invalid {
	big64 := func(x int) *big.Int { return big.NewInt(int64(x)) }
	end := new(big.Int).Lsh(big.NewInt(1), 64) // one past the last address
	bytesOf := func(b comm.Buffer) *big.Int { return new(big.Int).Mul(big64(b.Count), big64(b.DType.Size())) }
	start := func(b comm.Buffer) *big.Int { return new(big.Int).SetUint64(uint64(uintptr(b.Addr))) }
	buffer := func(i int, b comm.Buffer) Invalid {
		last := new(big.Int).Add(start(b), bytesOf(b))
		switch {
		case !b.DType.Valid():
			return Invalid{BadDType, int64(i), int64(b.DType)}
		case b.Count < 0:
			return Invalid{BadCount, int64(i), int64(b.Count)}
		case b.Count > 0 && b.Addr == nil:
			return Invalid{NilAddr, int64(i), int64(b.Count)}
		case bytesOf(b).Cmp(big64(math.MaxInt)) > 0 || last.Cmp(end) >= 0:
			return Invalid{TooLarge, int64(i), int64(b.Count)}
		case b.Loc != comm.Host && b.Loc != comm.Device:
			return Invalid{BadLoc, int64(i), int64(b.Loc)}
		case r.OneDevice && b.Loc == comm.Device && b.Device != r.Device:
			return Invalid{OtherDevice, int64(i), int64(b.Device)}
		case r.HostOnly && b.Loc != comm.Host:
			return Invalid{Reason: DeviceMem, A: int64(i)}
		case r.MaxCount > 0 && b.Count > r.MaxCount:
			return Invalid{TooMany, int64(i), int64(b.Count)}
		}
		return Invalid{}
	}
	share := func(a, b comm.Buffer) bool { // a byte in common
		if a.Loc != b.Loc || a.Loc == comm.Device && a.Device != b.Device {
			return false
		}
		return a.Count > 0 && b.Count > 0 &&
			start(a).Cmp(new(big.Int).Add(start(b), bytesOf(b))) < 0 &&
			start(b).Cmp(new(big.Int).Add(start(a), bytesOf(a))) < 0
	}
	same := func(a, b comm.Buffer) bool { // the same memory, as comm.InPlace sees it
		return a.Addr == b.Addr && a.Loc == b.Loc && a.Device == b.Device
	}
	own := func(part, whole comm.Buffer) bool { // part is block Rank of whole
		at := new(big.Int).Add(start(whole), new(big.Int).Mul(big64(r.Rank), bytesOf(part)))
		return part.Count > 0 && part.Loc == whole.Loc && part.Device == whole.Device && at.Cmp(start(part)) == 0
	}
	times := func(whole, part comm.Buffer) bool {
		return big64(whole.Count).Cmp(new(big.Int).Mul(big64(r.Size), big64(part.Count))) == 0
	}
	switch call.Kind {
	case comm.KindSend, comm.KindRecv:
		if call.Root < 0 || call.Root >= r.Size || call.Root == r.Rank {
			return Invalid{BadPeer, int64(call.Root), int64(r.Rank)}
		}
		return buffer(Buf, send)
	case comm.KindBroadcast:
		if v := buffer(Buf, send); !v.OK() {
			return v
		}
		if call.Root < 0 || call.Root >= r.Size {
			return Invalid{Reason: BadRoot}
		}
		return Invalid{}
	case comm.KindBarrier:
		return Invalid{}
	}
	if v := buffer(SendBuf, send); !v.OK() {
		return v
	}
	onRoot := call.Kind != comm.KindReduce || call.Root == r.Rank
	if onRoot {
		if v := buffer(RecvBuf, recv); !v.OK() {
			return v
		}
	}
	if call.Kind != comm.KindAllGather && !call.Op.Valid() {
		return Invalid{Reason: BadOp}
	}
	switch call.Kind {
	case comm.KindAllReduce, comm.KindReduce:
		if call.Kind == comm.KindReduce && (call.Root < 0 || call.Root >= r.Size) {
			return Invalid{Reason: BadRoot}
		}
		if !onRoot {
			return Invalid{}
		}
		if recv.Count != send.Count || recv.DType != send.DType {
			return Invalid{BadPair, int64(recv.Count), int64(recv.DType)}
		}
		if share(send, recv) && !same(send, recv) {
			return Invalid{Reason: Overlapping}
		}
	case comm.KindAllGather:
		if !times(recv, send) || recv.DType != send.DType {
			return Invalid{BadGather, int64(recv.Count), int64(recv.DType)}
		}
		if share(send, recv) && !own(send, recv) {
			return Invalid{Reason: Overlapping}
		}
	case comm.KindReduceScatter:
		if !times(send, recv) || send.DType != recv.DType {
			return Invalid{BadScatter, int64(send.Count), int64(send.DType)}
		}
		if share(send, recv) && !own(recv, send) {
			return Invalid{Reason: Overlapping}
		}
	}
	return Invalid{}
}
