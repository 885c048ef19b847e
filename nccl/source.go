package nccl

import (
	"fmt"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
)

// Source returns an allocator.Source of device memory on c's device, for
// a CommPool whose blocks c's collectives use without staging:
//
//	pool, err := allocator.New(allocator.Options{Source: c.Source()})
//
// Slabs come from ncclMemAlloc where NCCL has it (2.19 and newer; memory
// NCCL can use for zero-copy and NVLink SHARP), otherwise from
// cuMemAlloc. Each slab is registered with c once, with ncclCommRegister
// where NCCL has it, and deregistered when the pool returns the slab or
// when c closes, whichever comes first. NCCL makes use of a registration
// only where the peers have registered their buffers too, so every rank
// should build its pool the same way. The pool may outlive c: its slabs
// are then freed without deregistration (ncclCommDestroy and
// ncclCommAbort release what is still registered). A slab freed after
// c's stream failed to drain following an abort (see Comm.Abort) is
// quarantined instead, kept and never freed while the stream may still
// write it, and Free says so.
func (c *Comm) Source() allocator.Source { return &deviceSource{c: c} }

type deviceSource struct {
	c *Comm
}

// slab remembers how a slab was made, by its (aligned) address.
type slab struct {
	base unsafe.Pointer // what the allocator returned
	nccl bool           // from ncclMemAlloc
}

func (s *deviceSource) Name() string { return fmt.Sprintf("nccl device %d", s.c.dev.ordinal) }
func (s *deviceSource) Host() bool   { return false }

func (s *deviceSource) Alloc(size int) (allocator.Region, error) {
	c := s.c
	useNCCL := c.lib.Has("ncclMemAlloc") && c.lib.Has("ncclMemFree")
	alloc := func(n int) (unsafe.Pointer, error) {
		if useNCCL {
			return c.d.ncclMemAlloc(c.ctx, n)
		}
		return c.d.memAlloc(c.ctx, n)
	}
	p, err := alloc(size)
	if err != nil {
		return allocator.Region{}, fmt.Errorf("nccl: rank %d: device %d: %w", c.rank, c.dev.ordinal, err)
	}
	base := p
	if uintptr(p)%allocator.Alignment != 0 {
		// Both allocators align far more than this in practice; should
		// one not, take more and align by hand.
		s.free(slab{base: p, nccl: useNCCL})
		if base, err = alloc(size + allocator.Alignment); err != nil {
			return allocator.Region{}, fmt.Errorf("nccl: rank %d: device %d: %w", c.rank, c.dev.ordinal, err)
		}
		p = unsafe.Add(base, (allocator.Alignment-uintptr(base)%allocator.Alignment)%allocator.Alignment)
	}
	c.regMu.Lock()
	if c.slabs == nil {
		c.slabs = map[uintptr]slab{}
	}
	c.slabs[uintptr(p)] = slab{base: base, nccl: useNCCL}
	register := c.lib.Has("ncclCommRegister") && c.lib.Has("ncclCommDeregister") && !c.regDone
	c.regMu.Unlock()
	if register {
		c.lockCalls()
		var h uintptr
		err = c.stoppingErr()
		if !c.torn {
			c.dev.ncclMu.Lock()
			h, err = c.d.register(c.ctx, c.handle, uintptr(p), size)
			c.dev.ncclMu.Unlock()
		}
		c.regMu.Lock()
		if err == nil && !c.regDone {
			c.regs[uintptr(p)] = h
		}
		c.regMu.Unlock()
		c.unlockCalls()
		if err != nil && !c.torn {
			c.regMu.Lock()
			delete(c.slabs, uintptr(p))
			c.regMu.Unlock()
			s.free(slab{base: base, nccl: useNCCL})
			return allocator.Region{}, fmt.Errorf("nccl: rank %d: registering %d bytes of device %d: %w", c.rank, size, c.dev.ordinal, err)
		}
		// A communicator that is gone needs no registration: the slab
		// still serves the pool.
	}
	return allocator.Region{Addr: p, Size: size}, nil
}

func (s *deviceSource) Free(r allocator.Region) error {
	c := s.c
	c.regMu.Lock()
	sl, ok := c.slabs[uintptr(r.Addr)]
	h, registered := c.regs[uintptr(r.Addr)]
	delete(c.slabs, uintptr(r.Addr))
	delete(c.regs, uintptr(r.Addr))
	registered = registered && !c.regDone
	c.regMu.Unlock()
	var err error
	if registered {
		c.lockCalls()
		// After Abort or Close NCCL has released what was registered.
		if !c.torn {
			c.dev.ncclMu.Lock()
			err = c.d.deregister(c.ctx, c.handle, h)
			c.dev.ncclMu.Unlock()
		}
		c.unlockCalls()
	}
	if !ok {
		return fmt.Errorf("%w: nccl: rank %d: Free of %d bytes at %p, not a slab of this source", allocator.ErrInvalid, c.rank, r.Size, r.Addr)
	}
	c.mu.Lock()
	idle := c.streamIdle()
	if !idle {
		c.leaked += int64(r.Size)
	}
	c.mu.Unlock()
	if !idle {
		return fmt.Errorf("nccl: rank %d: %d bytes at %p not freed: the communicator's stream did not drain after ncclCommAbort and may still write them", c.rank, r.Size, r.Addr)
	}
	if ferr := s.free(sl); err == nil {
		err = ferr
	}
	return err
}

func (s *deviceSource) free(sl slab) error {
	if sl.nccl {
		return s.c.d.ncclMemFree(s.c.ctx, sl.base)
	}
	return s.c.d.memFree(s.c.ctx, sl.base)
}

// stagingSource is plain device memory (cuMemAlloc), or pinned host
// memory (cuMemAllocHost), for staging host buffers.
type stagingSource struct {
	c      *Comm
	pinned bool
}

func (s *stagingSource) Name() string {
	if s.pinned {
		return fmt.Sprintf("nccl pinned staging, device %d", s.c.dev.ordinal)
	}
	return fmt.Sprintf("nccl staging, device %d", s.c.dev.ordinal)
}

func (s *stagingSource) Host() bool { return s.pinned }

func (s *stagingSource) Alloc(size int) (allocator.Region, error) {
	alloc := s.c.d.memAlloc
	if s.pinned {
		alloc = s.c.d.memAllocHost
	}
	p, err := alloc(s.c.ctx, size)
	if err != nil {
		return allocator.Region{}, err
	}
	return allocator.Region{Addr: p, Size: size}, nil
}

func (s *stagingSource) Free(r allocator.Region) error {
	if s.pinned {
		return s.c.d.memFreeHost(s.c.ctx, r.Addr)
	}
	return s.c.d.memFree(s.c.ctx, r.Addr)
}
