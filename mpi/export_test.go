//go:build mpi && cgo

package mpi

import "github.com/ddpgo/ddpgo/comm"

// RawAllReduceTimes exposes rawAllReduceTimes to the sweep.
var RawAllReduceTimes = rawAllReduceTimes

// LargeOps is the number of operations c ran on its second communicator
// (see Open).
func LargeOps(c comm.Communicator) uint64 { return c.(*communicator).largeOps.Load() }

// ForcedAllReduce exposes forcedAllReduce.
var ForcedAllReduce = forcedAllReduce

// SharedOps is the number of all-reduces c ran in shared memory.
func SharedOps(c comm.Communicator) uint64 { return c.(*communicator).shmOps.Load() }

// SetSharedMin sets the size from which all-reduces run in shared memory
// and returns the previous one.
func SetSharedMin(n int) int { old := sharedMin; sharedMin = n; return old }

// SharedMapped is the number of peers' slabs this process has mapped.
var SharedMapped = sharedMapped

// FailMapping exposes failMapping.
var FailMapping = failMapping
