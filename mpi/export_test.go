//go:build mpi && cgo

package mpi

// RawAllReduceTimes exposes rawAllReduceTimes to the sweep.
var RawAllReduceTimes = rawAllReduceTimes
