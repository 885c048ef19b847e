//go:build !mpi || !cgo

package mpi

import (
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
)

// howToBuild says what a binary without the backend needs.
const howToBuild = "build with the mpi tag and cgo (go build -tags mpi ./...; CGO_ENABLED=1, the default where a C compiler is found) " +
	"against Open MPI's development files (Debian: apt-get install libopenmpi-dev openmpi-bin; pkg-config must find ompi-c)"

// Open would return this rank's communicator over MPI_COMM_WORLD; in this
// binary it fails with ErrNotBuilt, saying how to build the backend.
func Open(Options) (comm.Communicator, error) {
	return nil, fmt.Errorf("%w: %s", ErrNotBuilt, howToBuild)
}

// Finalize ends the backend in this process: it closes every open
// communicator, stops the goroutine that makes the MPI calls and calls
// MPI_Finalize, which every process of an MPI job must call before it
// exits (mpirun counts an exit without it as a failure); Open then fails
// with ErrFinalized, as MPI cannot be initialised again. Call it once every
// collective has completed, on every path out of main, errors included; a
// program that reaches the backend only through launch.Open calls
// launch.Finalize, which calls this. Finalize is idempotent.
//
// This documentation comes from a build without the mpi tag, in which
// there is nothing to finalize and Finalize returns nil.
func Finalize() error { return nil }

// notBuilt says why this binary cannot run the backend (launch.Backend).
const notBuilt = "not built: " + howToBuild

// LibraryInfo reports that the backend is not built, and how to build it.
func LibraryInfo() Info {
	return Info{Note: notBuilt, Requested: "MPI_THREAD_SERIALIZED"}
}
