//go:build mpi && !cgo

package mpi

// The mpi build tag asks for the backend, which is written with cgo. Built
// without cgo, the package would silently be the stub of notbuilt.go, whose
// errors then ask for the tag that was given; this reference to a name
// declared nowhere stops the build instead, and the compiler's one line,
// "undefined: <name>", is the reason. (A //go:embed of a missing file would
// quote a sentence with spaces, but go mod vendor resolves embeds under
// every build tag and would fail in every module that depends on this one.)
var _ = the_mpi_build_tag_needs_cgo__build_with_CGO_ENABLED_1_and_a_C_compiler
