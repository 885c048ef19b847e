//go:build mpi && !cgo

package mpi

// The mpi build tag asks for the backend, which is written with cgo. Built
// without cgo, the package would silently be the stub of notbuilt.go, whose
// errors then ask for the tag that was given; this declaration stops the
// build instead, and the compiler's message quotes the reason.
const _ int = "the mpi build tag needs cgo: CGO_ENABLED=1 and a C compiler"
