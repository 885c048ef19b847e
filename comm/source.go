package comm

import "github.com/ddpgo/ddpgo/allocator"

// HostSourcer is implemented by a backend whose collectives run faster on
// host memory from a source of its own than on other host memory: package
// mpi's memory that the ranks on one machine map into each other, which
// its all-reduce reads and writes in place. HostSource returns nil where
// the backend gains nothing from it (package mpi: one rank, ranks on
// several machines, non-blocking mode, or DDPGO_MPI_SHM=0; after a rank
// could not map its peers' memory it still returns the source, and the
// all-reduces go to MPI). Other host memory still works everywhere.
type HostSourcer interface {
	HostSource() allocator.Source
}

// HostSourceOf returns the host source c prefers (HostSourcer), looking
// through wrappers that have an Unwrap method, or nil.
func HostSourceOf(c Communicator) allocator.Source {
	for c != nil {
		if s, ok := c.(HostSourcer); ok {
			return s.HostSource()
		}
		u, ok := c.(interface{ Unwrap() Communicator })
		if !ok {
			return nil
		}
		c = u.Unwrap()
	}
	return nil
}
