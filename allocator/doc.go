// Package allocator is CommPool, a caching allocator of aligned blocks for
// communication buffers.
//
// A Pool hands out Blocks: Get(n) returns memory whose address is a multiple
// of Alignment (512) and whose Size is n rounded up to 512, and Put gives it
// back. The memory comes in large slabs from a Source: HostSource maps
// anonymous memory off the Go heap, so a block may be passed to C code that
// keeps it past the call; a backend's source hands out memory it reduces
// faster (mpi's memfd slabs shared between the ranks of one machine, which
// comm.HostSourceOf finds) or device addresses that only Addr exposes (nccl's
// Source, from ncclMemAlloc). Pool.Host says which kind a pool holds.
// Slabs never move.
//
// Reuse follows PyTorch's CUDA caching allocator. A request of at most
// SlabSize bytes is carved from a regular slab: the pool takes the free range
// that fits best (free ranges are kept on lists by power-of-two size class,
// searched smallest first, ties to the lowest address), splits off the rest,
// and on Put merges the block with its free neighbours, so a slab whose
// blocks all came back is again one free range. Fragmentation is therefore
// external only and bounded by what is outstanding: free space is never
// stranded between two free ranges, but a live block pins the space around
// it, and a request larger than every free range maps a new slab even when
// the sum of free ranges would suffice. A request larger than SlabSize gets
// a dedicated slab of its own, rounded up to the page size, which is reused
// whole for a later large request that it fits with less than one SlabSize
// to spare, and is never split.
//
// The limit bounds the bytes mapped from the source (not the bytes in use),
// because mapped memory is what the machine pays for. A Get that would map
// past it first returns every wholly free slab to the source, as Trim does,
// and fails with an *ExhaustedError (wrapping ErrExhausted) naming the
// request, the limit and the bytes in use if that is not enough.
//
// Every method is safe for concurrent use. In steady state, when a Get is
// served from memory already mapped, a Get/Put pair makes no system call
// and no Go heap allocation: block metadata lives in slices that only grow
// when the pool holds more ranges than ever before. Its cost is two
// uncontended lock round trips plus a few list updates, independent of the
// block size.
//
// Get(0) returns an empty block (Size 0, nil Addr) that costs nothing and
// may be Put. Close unmaps every slab without outstanding blocks and makes
// Get fail with ErrClosed; a slab that still holds blocks is never unmapped
// under them (C code may hold them): Close then reports their count and
// bytes as an error wrapping ErrMisuse, and the slab is unmapped when its
// last block is Put.
//
// Misuse (a double Put, a block of another pool, a zero or forged Block) is
// detected in constant time and reported as ErrMisuse; after Close, Get
// returns ErrClosed. Built with the invariants tag, misuse panics instead,
// freed host memory is filled with a NaN pattern and checked on reuse (so a
// write after Put is caught), the views of a block panic once it is Put, and
// the slab layout and free lists are verified after every operation.
package allocator
