//go:build !mpi || !cgo

package mpi_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/mpi"
)

// Without the build tag the backend is registered but says how to build
// it, both from Open and through launch.
func TestNotBuilt(t *testing.T) {
	_, err := mpi.Open(mpi.Options{})
	if !errors.Is(err, mpi.ErrNotBuilt) || !strings.Contains(err.Error(), "go build -tags mpi") || !strings.Contains(err.Error(), "libopenmpi-dev") {
		t.Errorf("Open: %v; want ErrNotBuilt with the build command and the package to install", err)
	}
	env := launch.Env{Launcher: "openmpi", Rank: 0, Size: 2}
	_, err = launch.Open(context.Background(), "mpi", launch.Options{Env: &env})
	if !errors.Is(err, mpi.ErrNotBuilt) {
		t.Errorf("launch.Open(mpi): %v; want ErrNotBuilt", err)
	}
	_, err = launch.NewBootstrap(context.Background(), env)
	if !errors.Is(err, launch.ErrNoBootstrap) || !errors.Is(err, mpi.ErrNotBuilt) {
		t.Errorf("NewBootstrap: %v; want ErrNoBootstrap wrapping ErrNotBuilt", err)
	}
	if info := mpi.LibraryInfo(); info.Built || !strings.Contains(info.Note, "-tags mpi") {
		t.Errorf("LibraryInfo() = %+v; want not built, with a note on how to build", info)
	}
	if err := mpi.Finalize(); err != nil {
		t.Errorf("Finalize: %v", err)
	}
}

// The tag without cgo is a build error that says why, not a stub whose
// errors ask for the tag that was given.
func TestTagNeedsCgo(t *testing.T) {
	cmd := exec.Command("go", "build", "-tags", "mpi", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "undefined: the_mpi_build_tag_needs_cgo__build_with_CGO_ENABLED_1_and_a_C_compiler\n") ||
		strings.Contains(string(out), "cannot use") {
		t.Errorf("CGO_ENABLED=0 go build -tags mpi: %v\n%s\nwant a build error saying that the tag needs cgo", err, out)
	}
}
