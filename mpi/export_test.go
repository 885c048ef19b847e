//go:build mpi && cgo

package mpi

import "github.com/ddpgo/ddpgo/comm"

// RawAllReduceTimes exposes rawAllReduceTimes to the sweep.
var RawAllReduceTimes = rawAllReduceTimes

// RawStagedTimes exposes rawStagedTimes to the sweep.
var RawStagedTimes = rawStagedTimes

// LargeOps is the number of operations c ran on its second communicator
// (see Open).
func LargeOps(c comm.Communicator) uint64 { return c.(*communicator).largeOps.Load() }

// ForcedAllReduce exposes forcedAllReduce.
var ForcedAllReduce = forcedAllReduce

// InlineSeq is the sequence number c.inl names: the last all-reduce
// posted inline that was left pending at its issue.
func InlineSeq(c comm.Communicator) uint64 { return c.(*communicator).inl.Load() >> 2 }

// SharedOps is the number of all-reduces c ran in shared memory.
func SharedOps(c comm.Communicator) uint64 {
	return c.(*communicator).shmOps.Load() + c.(*communicator).stagedOps.Load()
}

// SetDirectMin sets the size from which all-reduces in shared memory read
// the ranks' buffers in place, rather than staged, for the communicators
// opened afterwards, and returns the previous one.
func SetDirectMin(n int) int { old := directMin; directMin = n; return old }

// SetStagedAlone sets stagedAlone, returning the old value.
func SetStagedAlone(on bool) bool { old := stagedAlone; stagedAlone = on; return old }

// SetNTMin sets the size of a rank's slice from which a two-rank
// out-of-place all-reduce in shared memory streams its outputs past the
// cache, and returns the previous one.
func SetNTMin(n int) int { return setNTMin(n) }

// EngineOps is the number of collectives but all-reduces that c ran in
// shared memory, staged or in place.
func EngineOps(c comm.Communicator) uint64 { return c.(*communicator).engineOps.Load() }

// StagedOps is the number of all-reduces c staged in shared memory.
func StagedOps(c comm.Communicator) uint64 { return c.(*communicator).stagedOps.Load() }

// SharedMapped is the number of peers' slabs this process has mapped.
var SharedMapped = sharedMapped

// FailMapping exposes failMapping.
var FailMapping = failMapping

// ExitMidCall exposes exitMidCall.
var ExitMidCall = exitMidCall

// SetWrapLevels sets wrapLevels for the communicators opened afterwards
// and returns the previous one.
func SetWrapLevels(f func(local, cross comm.Communicator) (comm.Communicator, comm.Communicator)) func(local, cross comm.Communicator) (comm.Communicator, comm.Communicator) {
	old := wrapLevels
	wrapLevels = f
	return old
}
