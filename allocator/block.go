package allocator

import (
	"fmt"
	"unsafe"

	"github.com/ddpgo/ddpgo/internal/invariants"
)

// Block is a range of pool memory handed out by Get. It is a small value:
// copy it freely, but Put exactly one copy exactly once. It carries the pool,
// the slot and the generation of the allocation, so Put validates it in
// constant time and recognises a double Put, a block of another pool and a
// zero or forged Block.
type Block struct {
	p    *Pool
	addr unsafe.Pointer
	size int
	node int32
	gen  uint32
}

// Addr returns the block's address, a multiple of Alignment (nil for an
// empty block). For a device source it is a device address.
func (b Block) Addr() unsafe.Pointer { return b.addr }

// Size returns the block's usable size in bytes: the n of Get(n) rounded up
// to Alignment.
func (b Block) Size() int { return b.size }

// Bytes returns the block's memory as a byte slice. It panics if the pool's
// source is not host memory, or if b is a zero Block.
func (b Block) Bytes() []byte {
	b.mustHost("Bytes")
	if b.size == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(b.addr), b.size)
}

// Float32s returns the block's memory as Size()/4 float32 values. It
// panics as Bytes does.
func (b Block) Float32s() []float32 {
	b.mustHost("Float32s")
	if b.size == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(b.addr), b.size/4)
}

// Uint16s returns the block's memory as Size()/2 uint16 values (fp16 or
// bf16 storage). It panics as Bytes does.
func (b Block) Uint16s() []uint16 {
	b.mustHost("Uint16s")
	if b.size == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(b.addr), b.size/2)
}

// mustHost panics unless b's memory is addressable from Go. Under the
// invariants build tag it also panics if b is not live.
func (b Block) mustHost(view string) {
	if b.p == nil {
		panic(fmt.Sprintf("allocator: %s of a zero Block", view))
	}
	if !b.p.host {
		panic(fmt.Sprintf("allocator: %s of a block of %s memory (%d bytes at %p), which Go code cannot address; pass Addr to code that can",
			view, b.p.src.Name(), b.size, b.addr))
	}
	if invariants.Enabled {
		b.p.mu.Lock()
		err := b.p.validate(b, view)
		b.p.mu.Unlock()
		if err != nil {
			panic(err)
		}
	}
}
