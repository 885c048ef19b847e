// Package comm is the collective contract every ddpgo backend meets.
//
// A Communicator is one rank's handle on a group of Size ranks. Every
// collective is asynchronous: it returns a Work at once and runs on the
// backend's own goroutines (or device streams). One rank's collectives run
// in the order it issued them (stream semantics), and every rank must
// issue the same sequence of collectives with the same operation, element
// count, dtype and root; a backend that can see a disagreement
// (Caps.MismatchDetection) reports it as ErrMismatch on every rank, naming
// the sequence number, the operation and the ranks involved, never a hang
// and never silent corruption.
//
// # Memory
//
// Buffers are described by Buffer values (a base address, a count and a
// dtype) rather than Go slices, so the same contract carries host memory
// and device memory that Go code cannot read. A collective's buffers must
// be CommPool memory (package allocator: off the Go heap, never moved) or
// memory the caller has pinned for as long as the collective may use it;
// never Go-heap memory, which a cgo backend could hold past the call in
// breach of cgo's pointer rules. Memory stays the backend's from the call
// until its Work has completed (successfully or not); a backend writes no
// buffer of an operation whose Work has completed. AllReduce is out of
// place (send == recv is the in-place form, as in NCCL and MPI);
// Broadcast is in place.
//
// # Failure
//
// Abort is local: every pending Work of the rank completes with an error
// wrapping ErrAborted within a bound the backend documents, and the
// backend then writes none of the rank's buffers. Peers learn of it as
// far as the backend can tell them (a backend that shares memory with its
// peers fails them too; ncclCommAbort and MPI cannot), and otherwise
// through their own deadlines or a collective that fails. Work.Wait
// honours its context; a Wait that returns because the context ended
// leaves the operation pending, its memory still the backend's.
//
// # Optional interfaces
//
// Capable reports Caps (native Avg, half-precision sums, mismatch
// detection, device memory); Grouper batches several launches into one
// (ncclGroupStart/End; GroupStart and GroupEnd are no-ops for a backend
// without it); KernelSource supplies the element-wise Kernels for the
// backend's memory (HostKernels serves host memory); HostSourcer offers
// host memory the backend reduces faster than other host memory
// (HostSourceOf; package mpi's shared memory), from which a Reducer
// without a pool of its own takes its buckets.
//
// Work values are small and are not allocated per collective: a backend
// keeps its per-operation state in its own preallocated slots and hands
// out Work{impl, id} pairs that refer to them. Calling Wait any number of
// times, from any goroutine, is allowed.
//
// Bandwidth follows nccl-tests: algbw = bytes / time and busbw = algbw
// times a per-operation factor (see BusBWFactor), so numbers compare
// directly with nccl-tests, Open MPI and gloo measurements.
//
// The conformance suite in comm/commtest is run by every backend. What a
// backend needs beyond its transport (the ring of operations behind Work,
// the failure log, the waiters, the argument rules) is package
// comm/backend, the kit every backend is built from.
package comm
