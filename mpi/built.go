//go:build mpi && cgo

package mpi

// notBuilt is empty: this binary runs the backend (launch.Backend).
const notBuilt = ""
