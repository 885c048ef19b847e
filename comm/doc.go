// Package comm is the collective contract every ddpgo backend meets.
//
// A Communicator is one rank's handle on a group of Size ranks. Every
// collective is asynchronous: it returns a Work at once and runs on the
// backend's own goroutines (or device streams). One rank's collectives run
// in the order it issued them, and every rank must issue the same sequence
// of collectives with the same operation, element count, dtype and root;
// a backend that can see a disagreement reports it as ErrMismatch on every
// rank, naming the sequence number, the operation and the ranks involved.
//
// Buffers are described by Buffer values (a base address, a count and a
// dtype) rather than Go slices, so the same contract carries host memory
// from the CommPool and, later, device memory that Go code cannot read.
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
// The conformance suite in comm/commtest is run by every backend.
package comm
