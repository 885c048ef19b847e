package commtest

import (
	"fmt"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// A test-only "device": host memory that Go code may not address through
// the Buffers handed to it. Its pool's blocks refuse Go views, its
// Buffers say Loc == Device (so AsFloat32 and the other views panic), and
// its kernels and communicator refuse any buffer that is not device
// memory of their ordinal. Underneath it is host memory, so a test can
// check results by downloading them through the kernels. A host access
// left on a device path panics, and the test fails.

// DeviceSource maps host memory and calls it device memory, as a CUDA
// source would.
type DeviceSource struct{ allocator.Source }

// NewDeviceSource returns a DeviceSource over host memory.
func NewDeviceSource() DeviceSource { return DeviceSource{allocator.HostSource()} }

func (DeviceSource) Name() string { return "testdevice" }
func (DeviceSource) Host() bool   { return false }

// onDevice returns the host view of device buffer b, panicking for a
// buffer that is not device memory of device ordinal.
func onDevice(op string, ordinal int, b comm.Buffer) comm.Buffer {
	if b.Loc != comm.Device || b.Device != ordinal {
		panic(fmt.Sprintf("testdevice: %s of a buffer not on device %d (loc %d, device %d, %d x %s)", op, ordinal, b.Loc, b.Device, b.Count, b.DType))
	}
	b.Loc, b.Device = comm.Host, 0
	return b
}

// DeviceKernels are comm.HostKernels behind device buffers of device
// Ordinal.
type DeviceKernels struct{ Ordinal int }

func (DeviceKernels) Location() comm.Location { return comm.Device }
func (k DeviceKernels) h(op string, b comm.Buffer) comm.Buffer {
	return onDevice(op, k.Ordinal, b)
}
func (k DeviceKernels) Zero(b comm.Buffer) { comm.HostKernels().Zero(k.h("Zero", b)) }
func (k DeviceKernels) Copy(d, s comm.Buffer) {
	comm.HostKernels().Copy(k.h("Copy", d), k.h("Copy", s))
}
func (k DeviceKernels) Add(d, s comm.Buffer) { comm.HostKernels().Add(k.h("Add", d), k.h("Add", s)) }
func (k DeviceKernels) Scale(b comm.Buffer, s float32) {
	comm.HostKernels().Scale(k.h("Scale", b), s)
}
func (k DeviceKernels) Compress(d, s comm.Buffer, scale float32) {
	comm.HostKernels().Compress(k.h("Compress", d), k.h("Compress", s), scale)
}
func (k DeviceKernels) Decompress(d, s comm.Buffer) {
	comm.HostKernels().Decompress(k.h("Decompress", d), k.h("Decompress", s))
}
func (k DeviceKernels) Overflows(w, in comm.Buffer) int64 {
	return comm.HostKernels().Overflows(k.h("Overflows", w), k.h("Overflows", in))
}
func (k DeviceKernels) Upload(d comm.Buffer, src []byte) {
	comm.HostKernels().Upload(k.h("Upload", d), src)
}
func (k DeviceKernels) Download(dst []byte, s comm.Buffer) {
	comm.HostKernels().Download(dst, k.h("Download", s))
}
func (DeviceKernels) Sync() error { return nil }

// DeviceComm carries device buffers of device Ordinal only, over a host
// communicator (an in-process group): it says so in its Caps
// (DeviceMemory, not HostMemory), reports Ordinal as its rank's device
// (comm.DeviceOwner), and offers a DeviceSource and DeviceKernels, as a
// GPU backend does.
type DeviceComm struct {
	comm.Communicator
	Ordinal int
}

func (c DeviceComm) Capabilities() comm.Caps {
	caps := comm.CapsOf(c.Communicator)
	caps.Backend, caps.DeviceMemory, caps.HostMemory = "testdevice", true, false
	return caps
}
func (c DeviceComm) Device() int                            { return c.Ordinal }
func (c DeviceComm) Kernels() comm.Kernels                  { return DeviceKernels{c.Ordinal} }
func (DeviceComm) Source() allocator.Source                 { return NewDeviceSource() }
func (c DeviceComm) h(op string, b comm.Buffer) comm.Buffer { return onDevice(op, c.Ordinal, b) }
func (c DeviceComm) AllReduce(s, r comm.Buffer, op comm.Op) comm.Work {
	return c.Communicator.AllReduce(c.h("AllReduce", s), c.h("AllReduce", r), op)
}
func (c DeviceComm) Broadcast(b comm.Buffer, root int) comm.Work {
	return c.Communicator.Broadcast(c.h("Broadcast", b), root)
}
func (c DeviceComm) Reduce(s, r comm.Buffer, op comm.Op, root int) comm.Work {
	if r.Count > 0 {
		r = c.h("Reduce", r)
	}
	return c.Communicator.Reduce(c.h("Reduce", s), r, op, root)
}
func (c DeviceComm) AllGather(s, r comm.Buffer) comm.Work {
	return c.Communicator.AllGather(c.h("AllGather", s), c.h("AllGather", r))
}
func (c DeviceComm) ReduceScatter(s, r comm.Buffer, op comm.Op) comm.Work {
	return c.Communicator.ReduceScatter(c.h("ReduceScatter", s), c.h("ReduceScatter", r), op)
}
func (c DeviceComm) Send(b comm.Buffer, peer int) comm.Work {
	return c.Communicator.Send(c.h("Send", b), peer)
}
func (c DeviceComm) Recv(b comm.Buffer, peer int) comm.Work {
	return c.Communicator.Recv(c.h("Recv", b), peer)
}
