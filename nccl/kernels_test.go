//go:build cgo

package nccl

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// specials are float32 bit patterns at the edges of the conversions:
// zeros, subnormals of every format, ties, the overflow thresholds,
// infinities and NaNs with payloads.
var specials = []uint32{
	0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000,
	0x33000000, 0x33000001, 0x337fffff, 0x38800000, 0x387fc000, 0x387fe000,
	0x3f800000, 0x3f801000, 0x3f802000, 0x3f803000, 0x3f808000, 0x3f818000, 0x3f817fff,
	0x477fe000, 0x477fefff, 0x477ff000, 0x7f7fffff, 0x7f7f8000, 0x7f7f7fff,
	0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x7fa5a5a5, 0xff812345,
}

func f32bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

// TestKernels runs every device kernel through the binding and compares
// it with comm.HostKernels (package fp16). Over the stand-in a kernel
// runs the stand-in's C emulation chosen by its name, not the PTX: this
// checks the launch (names, grid, the five parameters and their order)
// and the stand-in's copy of fp16's rounding, not the PTX's arithmetic,
// which only a GPU can run.
func TestKernels(t *testing.T) {
	cs := newGroup(t, 1, nil)
	c := cs[0]
	k := c.Kernels()
	if k.Location() != comm.Device {
		t.Fatalf("Location() = %v", k.Location())
	}
	dev, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 512 << 20, SlabSize: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	host := hostPool(t)
	hk := comm.HostKernels()

	rng := rand.New(rand.NewPCG(1, 2))
	vals := append([]uint32(nil), specials...)
	random := 5000
	if si == nil {
		// On a GPU: more elements than one launch has threads (4096
		// blocks of 256), so the grid-stride loops run more than once.
		random = 1<<20 + 5000
	}
	for range random {
		vals = append(vals, rng.Uint32())
	}
	n := len(vals)
	get := func(p *allocator.Pool, count int, dt comm.DType) comm.Buffer {
		blk, err := p.Get(count * dt.Size())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Put(blk) })
		b := comm.Buffer{Addr: blk.Addr(), Count: count, DType: dt}
		if !p.Host() {
			b.Loc, b.Device = comm.Device, c.Device()
		}
		return b
	}
	download := func(b comm.Buffer) []byte {
		out := make([]byte, b.Bytes())
		k.Download(out, b)
		return out
	}
	launches := 0
	if si != nil {
		launches = si.KernelLaunches()
	}

	src := f32bytes(vals)
	dsrc, hsrc := get(dev, n, comm.Float32), get(host, n, comm.Float32)
	k.Upload(dsrc, src)
	hk.Upload(hsrc, src)
	if !bytes.Equal(download(dsrc), src) {
		t.Fatal("Upload then Download changed the bytes")
	}
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		for _, scale := range []float32{1, 0.25, 1.0 / 3, 1e-30, 65536} {
			dw, hw := get(dev, n, dt), get(host, n, dt)
			k.Compress(dw, dsrc, scale)
			hk.Compress(hw, hsrc, scale)
			if got, want := download(dw), hw.AsBytes(); !bytes.Equal(got, want) {
				i := firstDiff(got, want, 2)
				t.Errorf("Compress to %s, scale %g: element %d (float32 %#08x): got %#04x, want %#04x",
					dt, scale, i, vals[i], binary.LittleEndian.Uint16(got[2*i:]), binary.LittleEndian.Uint16(want[2*i:]))
			}
			if got, want := k.Overflows(dw, dsrc), hk.Overflows(hw, hsrc); got != want {
				t.Errorf("Overflows of %s, scale %g: %d, want %d", dt, scale, got, want)
			}
			df, hf := get(dev, n, comm.Float32), get(host, n, comm.Float32)
			k.Decompress(df, dw)
			hk.Decompress(hf, hw)
			if got, want := download(df), hf.AsBytes(); !bytes.Equal(got, want) {
				i := firstDiff(got, want, 4)
				t.Errorf("Decompress of %s: element %d: got %#08x, want %#08x", dt, i, binary.LittleEndian.Uint32(got[4*i:]), binary.LittleEndian.Uint32(want[4*i:]))
			}
		}
	}
	// Decompress of every 16-bit pattern: NaN payloads, subnormals,
	// infinities.
	every := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(every[2*i:], uint16(i))
	}
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		dw, hw := get(dev, 1<<16, dt), get(host, 1<<16, dt)
		k.Upload(dw, every)
		hk.Upload(hw, every)
		df, hf := get(dev, 1<<16, comm.Float32), get(host, 1<<16, comm.Float32)
		k.Decompress(df, dw)
		hk.Decompress(hf, hw)
		if got, want := download(df), hf.AsBytes(); !bytes.Equal(got, want) {
			i := firstDiff(got, want, 4)
			t.Errorf("Decompress of %s %#04x: got %#08x, want %#08x", dt, i, binary.LittleEndian.Uint32(got[4*i:]), binary.LittleEndian.Uint32(want[4*i:]))
		}
	}
	// Add, Scale, Copy, Zero on finite values.
	a := make([]float32, n)
	for i := range a {
		a[i] = float32(rng.NormFloat64()) * 1e3
	}
	ab := unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 4*n)
	da, ha := get(dev, n, comm.Float32), get(host, n, comm.Float32)
	k.Upload(da, ab)
	hk.Upload(ha, ab)
	k.Add(da, dsrc)
	hk.Add(ha, hsrc)
	k.Scale(da, 0.125)
	hk.Scale(ha, 0.125)
	// src holds NaNs: their payloads after arithmetic are unspecified
	// (the GPU answers its canonical NaN, x86 passes an operand's), so a
	// NaN matches any NaN.
	if got, want := download(da), ha.AsBytes(); !bytes.Equal(got, want) {
		for i := 0; i < len(got); i += 4 {
			g, w := binary.LittleEndian.Uint32(got[i:]), binary.LittleEndian.Uint32(want[i:])
			if g != w && !(math.IsNaN(float64(math.Float32frombits(g))) && math.IsNaN(float64(math.Float32frombits(w)))) {
				t.Fatalf("Add then Scale: element %d (%#08x + %#08x): got %#08x, want %#08x", i/4, math.Float32bits(a[i/4]), vals[i/4], g, w)
			}
		}
	}
	dc := get(dev, n, comm.Float32)
	k.Copy(dc, da)
	if !bytes.Equal(download(dc), download(da)) {
		t.Fatal("Copy differs")
	}
	k.Zero(dc)
	if !bytes.Equal(download(dc), make([]byte, 4*n)) {
		t.Fatal("Zero left non-zero bytes")
	}
	if err := k.Sync(); err != nil {
		t.Fatal(err)
	}
	// Compress, Overflows and Decompress for each of 2 dtypes x 5 scales,
	// Decompress of every pattern of 2 dtypes, Add and Scale: every call
	// launched exactly one kernel.
	if si == nil {
		return
	}
	if got := si.KernelLaunches() - launches; got != 2*5*3+2+2 {
		t.Fatalf("%d kernel launches, want %d", got, 2*5*3+2+2)
	}
	// An empty buffer launches nothing; a host buffer panics.
	k.Scale(comm.Buffer{DType: comm.Float32, Loc: comm.Device, Device: c.Device()}, 2)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Scale of a host buffer did not panic")
			}
		}()
		k.Scale(hsrc, 2)
	}()
}

func firstDiff(a, b []byte, sz int) int {
	for i := 0; i+sz <= len(a); i += sz {
		if !bytes.Equal(a[i:i+sz], b[i:i+sz]) {
			return i / sz
		}
	}
	return -1
}

// TestRegistration: the device Source registers each slab with the
// communicator once, deregisters it when the pool frees it or when the
// communicator closes, and frees it with the allocator it came from.
func TestRegistration(t *testing.T) {
	standInOnly(t)
	cs := newGroup(t, 2, nil)
	c := cs[0]
	baseNCCL := si.LiveAllocs(1)
	pool, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 64 << 20, SlabSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var blks []allocator.Block
	for range 3 {
		b, err := pool.Get(3 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if uintptr(b.Addr())%allocator.Alignment != 0 {
			t.Fatalf("block at %p is not %d-byte aligned", b.Addr(), allocator.Alignment)
		}
		blks = append(blks, b)
	}
	if got := si.Registrations(c.handle); got != 3 || pool.Stats().Slabs != 3 || si.LiveAllocs(1)-baseNCCL != 3 {
		t.Fatalf("3 slabs: %d registrations, %d slabs, %d ncclMemAlloc allocations", got, pool.Stats().Slabs, si.LiveAllocs(1)-baseNCCL)
	}
	for _, b := range blks[1:] {
		pool.Put(b)
	}
	pool.Trim()
	if got := si.Registrations(c.handle); got != 1 || si.LiveAllocs(1)-baseNCCL != 1 {
		t.Fatalf("after Trim: %d registrations, %d allocations; want 1, 1", got, si.LiveAllocs(1)-baseNCCL)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := si.Registrations(c.handle); got != 0 {
		t.Fatalf("%d registrations left when the communicator was destroyed", got)
	}
	pool.Put(blks[0])
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if got := si.LiveAllocs(1) - baseNCCL; got != 0 {
		t.Fatalf("%d ncclMemAlloc allocations left", got)
	}
}

// TestSourceWithoutMemAlloc: without NCCL 2.19's ncclMemAlloc and
// ncclCommRegister the Source takes cuMemAlloc and registers nothing.
func TestSourceWithoutMemAlloc(t *testing.T) {
	standInOnly(t)
	old, err := open(Libraries{NCCL: si.NCCL, CUDA: si.CUDA}, map[string]bool{"ncclMemAlloc": true, "ncclCommRegister": true})
	if err != nil {
		t.Fatal(err)
	}
	id, err := old.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := old.NewComm(t.Context(), testConfig(0, 1, id))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	baseDev, baseNCCL := si.LiveAllocs(0), si.LiveAllocs(1)
	pool, err := allocator.New(allocator.Options{Source: c.Source(), SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Get(1000)
	if err != nil {
		t.Fatal(err)
	}
	if si.LiveAllocs(0)-baseDev != 1 || si.LiveAllocs(1) != baseNCCL || si.Registrations(c.handle) != 0 {
		t.Fatalf("cuMemAlloc %d, ncclMemAlloc %d, registrations %d; want 1, 0, 0", si.LiveAllocs(0)-baseDev, si.LiveAllocs(1)-baseNCCL, si.Registrations(c.handle))
	}
	pool.Put(b)
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if si.LiveAllocs(0) != baseDev {
		t.Fatal("the slab was not freed")
	}
}

// TestNoMemoryLeft: after host-staged collectives and Close, every
// allocation of the communicators (streams' scratch, staging, pinned
// memory) is freed.
func TestNoMemoryLeft(t *testing.T) {
	standInOnly(t)
	testutil.NoLeak(t)
	dev, pin := si.LiveAllocs(0), si.LiveAllocs(2)
	cs := newGroup(t, 2, nil)
	b := []comm.Buffer{floats(t, 1000, 1), floats(t, 1000, 2)}
	runRanks(t, cs, func(r int, c *Comm) error {
		return c.AllReduce(b[r], b[r], comm.Sum).Wait(t.Context())
	})
	if si.LiveAllocs(0) == dev || si.LiveAllocs(2) == pin {
		t.Fatal("staging took no device or pinned memory")
	}
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if si.LiveAllocs(0) != dev || si.LiveAllocs(2) != pin {
		t.Fatalf("after Close: %d cuMemAlloc and %d cuMemAllocHost allocations left", si.LiveAllocs(0)-dev, si.LiveAllocs(2)-pin)
	}
}
