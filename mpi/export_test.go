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
