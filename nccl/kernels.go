package nccl

import (
	_ "embed"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

//go:embed kernels.ptx
var kernelsPTX string

// The kernels of kernels.ptx, by name.
const (
	kScale          = "ddpgo_scale_f32"
	kAdd            = "ddpgo_add_f32"
	kCompressF16    = "ddpgo_compress_f16"
	kCompressBF16   = "ddpgo_compress_bf16"
	kDecompressF16  = "ddpgo_decompress_f16"
	kDecompressBF16 = "ddpgo_decompress_bf16"
	kOverflowsF16   = "ddpgo_overflows_f16"
	kOverflowsBF16  = "ddpgo_overflows_bf16"
)

var kernelNames = []string{kScale, kAdd, kCompressF16, kCompressBF16, kDecompressF16, kDecompressBF16, kOverflowsF16, kOverflowsBF16}

// module is kernels.ptx loaded on one device.
type module struct {
	m   uintptr
	fns map[string]uintptr
}

// module loads kernels.ptx on d once (cuModuleLoadData: the driver
// compiles the PTX for the device).
func (d *device) module(l *Library) (*module, error) {
	d.modOnce.Do(func() {
		m, err := l.d.moduleLoad(d.ctx, kernelsPTX)
		if err != nil {
			d.modErr = fmt.Errorf("nccl: device %d: loading kernels.ptx: %w", d.ordinal, err)
			return
		}
		mod := &module{m: m, fns: map[string]uintptr{}}
		for _, n := range kernelNames {
			f, err := l.d.function(d.ctx, m, n)
			if err != nil {
				d.modErr = fmt.Errorf("nccl: device %d: kernels.ptx: %w", d.ordinal, err)
				l.d.moduleUnload(d.ctx, m)
				return
			}
			mod.fns[n] = f
		}
		d.mod = mod
	})
	return d.mod, d.modErr
}

// Kernels returns the element-wise kernels for device memory of c's
// device. They run on c's stream, so they are ordered with c's
// collectives in issue order; Upload, Download, Overflows and Sync wait
// for the stream (bounded by Config.Timeout). A kernel's launch error is
// kept and returned by Sync. The kernels take device Buffers of c's device
// only and panic for others, as they do for mismatched counts or dtypes.
func (c *Comm) Kernels() comm.Kernels { return deviceKernels{c} }

type deviceKernels struct{ c *Comm }

const threadsPerBlock = 256

func (deviceKernels) Location() comm.Location { return comm.Device }

// Supports (comm.KernelSupporter): Add and Scale exist for float32 only;
// Compress, Decompress and Overflows for float16 and bfloat16 against
// float32. Zero, Copy, Upload and Download move bytes of any dtype.
func (deviceKernels) Supports(op string, dt comm.DType) bool {
	switch op {
	case comm.OpAdd, comm.OpScale:
		return dt == comm.Float32
	case comm.OpCompress, comm.OpDecompress, comm.OpOverflows:
		return dt == comm.Float16 || dt == comm.BFloat16
	}
	return true
}

func (k deviceKernels) dev(op string, b comm.Buffer) uintptr {
	if b.Loc != comm.Device || b.Device != k.c.dev.ordinal {
		panic(fmt.Sprintf("nccl: %s of a %s buffer (loc %d, device %d); the kernels of rank %d take memory of device %d",
			op, b.DType, b.Loc, b.Device, k.c.rank, k.c.dev.ordinal))
	}
	return uintptr(b.Addr)
}

// onStream runs f, which puts work on the communicator's stream, holding
// the call lock on a locked OS thread (calls.go): never while NCCL
// enqueues. After Abort or Close the work is not done, and Sync reports
// why.
func (c *Comm) onStream(f func() error) error {
	c.lockCalls()
	defer c.unlockCalls()
	if c.torn {
		err := c.stoppingErr()
		c.noteKernErr(err)
		return err
	}
	err := f()
	c.noteKernErr(err)
	return err
}

func (k deviceKernels) launch(name string, a0, a1, a2 uintptr, n int, s float32) {
	if n == 0 {
		return
	}
	mod, err := k.c.dev.module(k.c.lib)
	if err != nil {
		k.c.noteKernErr(err)
		return
	}
	grid := min((n+threadsPerBlock-1)/threadsPerBlock, 4096)
	c := k.c
	c.onStream(func() error {
		return c.d.launchKernel(c.ctx, mod.fns[name], grid, threadsPerBlock, c.stream, a0, a1, a2, n, s)
	})
}

func same(op string, a, b comm.Buffer) {
	if a.Count != b.Count || a.DType != b.DType {
		panic(fmt.Sprintf("nccl: %s of %d x %s and %d x %s", op, a.Count, a.DType, b.Count, b.DType))
	}
}

func halfPair(op string, half, f32 comm.Buffer) {
	if half.Count != f32.Count || (half.DType != comm.Float16 && half.DType != comm.BFloat16) || f32.DType != comm.Float32 {
		panic(fmt.Sprintf("nccl: %s between %d x %s and %d x %s", op, half.Count, half.DType, f32.Count, f32.DType))
	}
}

func (k deviceKernels) Zero(b comm.Buffer) {
	p := k.dev("Zero", b)
	if n := b.Bytes(); n > 0 {
		c := k.c
		c.onStream(func() error { return c.d.memset(c.ctx, p, 0, n, c.stream) })
	}
}

func (k deviceKernels) Copy(dst, src comm.Buffer) {
	same("Copy", dst, src)
	d, s := k.dev("Copy", dst), k.dev("Copy", src)
	if n := dst.Bytes(); n > 0 {
		c := k.c
		c.onStream(func() error { return c.d.dtod(c.ctx, d, s, n, c.stream) })
	}
}

func (k deviceKernels) Add(dst, src comm.Buffer) {
	same("Add", dst, src)
	if dst.DType != comm.Float32 {
		panic(fmt.Sprintf("nccl: Add of %s, want float", dst.DType))
	}
	k.launch(kAdd, k.dev("Add", dst), k.dev("Add", src), 0, dst.Count, 0)
}

func (k deviceKernels) Scale(b comm.Buffer, s float32) {
	if b.DType != comm.Float32 {
		panic(fmt.Sprintf("nccl: Scale of %s, want float", b.DType))
	}
	k.launch(kScale, k.dev("Scale", b), 0, 0, b.Count, s)
}

func (k deviceKernels) Compress(dst, src comm.Buffer, scale float32) {
	halfPair("Compress", dst, src)
	name := kCompressF16
	if dst.DType == comm.BFloat16 {
		name = kCompressBF16
	}
	k.launch(name, k.dev("Compress", dst), k.dev("Compress", src), 0, dst.Count, scale)
}

func (k deviceKernels) Decompress(dst, src comm.Buffer) {
	halfPair("Decompress", src, dst)
	name := kDecompressF16
	if src.DType == comm.BFloat16 {
		name = kDecompressBF16
	}
	k.launch(name, k.dev("Decompress", dst), k.dev("Decompress", src), 0, dst.Count, 0)
}

// Overflows counts on the device into the communicator's scratch counter
// and reads it back; it waits for the stream. Concurrent calls take turns:
// they share the counter.
func (k deviceKernels) Overflows(wire, in comm.Buffer) int64 {
	halfPair("Overflows", wire, in)
	w, i := k.dev("Overflows", wire), k.dev("Overflows", in)
	if wire.Count == 0 {
		return 0
	}
	c := k.c
	mod, err := c.dev.module(c.lib)
	if err != nil {
		c.noteKernErr(err)
		return 0
	}
	name := kOverflowsF16
	if wire.DType == comm.BFloat16 {
		name = kOverflowsBF16
	}
	c.kmu.Lock()
	defer c.kmu.Unlock()
	counter := uintptr(c.scratch) + 256
	grid := min((wire.Count+threadsPerBlock-1)/threadsPerBlock, 4096)
	out := c.host.Addr
	err = c.onStream(func() error {
		if err := c.d.memset(c.ctx, counter, 0, 8, c.stream); err != nil {
			return err
		}
		if err := c.d.launchKernel(c.ctx, mod.fns[name], grid, threadsPerBlock, c.stream, counter, w, i, wire.Count, 0); err != nil {
			return err
		}
		if err := c.d.dtoh(c.ctx, out, counter, 8, c.stream); err != nil {
			return err
		}
		return c.d.eventRecord(c.ctx, c.kernEv, c.stream)
	})
	if err == nil {
		err = c.waitKernEv()
	}
	if err != nil {
		c.noteKernErr(err)
		return 0
	}
	return int64(*(*uint64)(out))
}

func (k deviceKernels) Upload(dst comm.Buffer, src []byte) {
	if len(src) != dst.Bytes() {
		panic(fmt.Sprintf("nccl: Upload of %d bytes into a buffer of %d", len(src), dst.Bytes()))
	}
	d := k.dev("Upload", dst)
	if len(src) == 0 {
		return
	}
	// The copy reads src until the stream has passed it: wait, and keep
	// src alive until then.
	c := k.c
	c.kmu.Lock()
	defer c.kmu.Unlock()
	err := c.onStream(func() error {
		if err := c.d.htod(c.ctx, d, unsafe.Pointer(unsafe.SliceData(src)), len(src), c.stream); err != nil {
			return err
		}
		return c.d.eventRecord(c.ctx, c.kernEv, c.stream)
	})
	if err == nil {
		c.noteKernErr(c.waitKernEv())
	}
	runtime.KeepAlive(src)
}

func (k deviceKernels) Download(dst []byte, src comm.Buffer) {
	if len(dst) != src.Bytes() {
		panic(fmt.Sprintf("nccl: Download of a buffer of %d bytes into %d", src.Bytes(), len(dst)))
	}
	s := k.dev("Download", src)
	if len(dst) == 0 {
		return
	}
	c := k.c
	c.kmu.Lock()
	defer c.kmu.Unlock()
	err := c.onStream(func() error {
		if err := c.d.dtoh(c.ctx, unsafe.Pointer(unsafe.SliceData(dst)), s, len(dst), c.stream); err != nil {
			return err
		}
		return c.d.eventRecord(c.ctx, c.kernEv, c.stream)
	})
	if err == nil {
		c.noteKernErr(c.waitKernEv())
	}
	runtime.KeepAlive(dst)
}

// Sync waits for the stream and returns the first error a kernel met.
func (k deviceKernels) Sync() error {
	c := k.c
	c.kmu.Lock()
	err := c.onStream(func() error { return c.d.eventRecord(c.ctx, c.kernEv, c.stream) })
	if err == nil {
		err = c.waitKernEv()
	}
	c.kmu.Unlock()
	c.kerrMu.Lock()
	defer c.kerrMu.Unlock()
	if c.kernErr != nil {
		return c.kernErr
	}
	return err
}

// waitKernEv waits, polling, until the stream has reached kernEv's last
// record, for at most Config.Timeout. The caller holds c.kmu.
func (c *Comm) waitKernEv() error {
	deadline := time.Now().Add(c.cfg.Timeout)
	for i, delay := 0, time.Duration(0); ; i++ {
		ok, err := c.d.eventQuery(c.ctx, c.kernEv)
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: nccl: rank %d: the stream did not reach the kernels' event within %v", comm.ErrTimeout, c.rank, c.cfg.Timeout)
		}
		if i < 64 {
			runtime.Gosched()
			continue
		}
		delay = min(max(2*delay, 10*time.Microsecond), time.Millisecond)
		time.Sleep(delay)
	}
}
