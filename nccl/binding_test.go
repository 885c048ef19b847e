//go:build cgo

package nccl

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/internal/standin"
)

func TestConfigLayout(t *testing.T) {
	// ncclConfig_v21700 (src/nccl.h.in at v2.17.1-1): size_t size, two
	// unsigned ints, four ints, one pointer.
	size, blocking := configLayout()
	if size != 40 || blocking != 16 {
		t.Fatalf("ncclConfig_t 2.17 layout: size %d, blocking at %d; want 40 and 16", size, blocking)
	}
}

func TestOpenMissingLibrary(t *testing.T) {
	standInOnly(t)
	_, err := Open(Libraries{NCCL: "/nonexistent/libnccl.so.2", CUDA: si.CUDA})
	var le *LoadError
	if !errors.As(err, &le) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open without NCCL: %v, want a *LoadError wrapping ErrNotFound", err)
	}
	for _, want := range []string{"/nonexistent/libnccl.so.2", "install NCCL 2.14.0 or newer", "2.19", "Libraries.NCCL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	_, err = Open(Libraries{NCCL: si.NCCL, CUDA: "/nonexistent/libcuda.so.1"})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "NVIDIA driver") {
		t.Fatalf("Open without libcuda: %v, want ErrNotFound naming the driver", err)
	}
	info := GetInfo(Libraries{NCCL: "/nonexistent/libnccl.so.2", CUDA: si.CUDA})
	if !errors.Is(info.Err, ErrNotFound) || info.NCCLVersion != 0 {
		t.Fatalf("GetInfo without NCCL: %+v", info)
	}
}

func TestOpenMissingSymbol(t *testing.T) {
	standInOnly(t)
	for _, c := range []struct {
		sym, want string
	}{
		{"ncclCommGetAsyncError", "has no symbol ncclCommGetAsyncError"},
		{"cuLaunchKernel", "has no symbol cuLaunchKernel"},
		{"ncclCommInitRankConfig", "NCCL 2.14.0 or newer has it"},
	} {
		_, err := open(Libraries{NCCL: si.NCCL, CUDA: si.CUDA}, map[string]bool{c.sym: true})
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open without %s: %v, want ErrNotFound saying %q", c.sym, err, c.want)
		}
	}
	// Optional symbols may be absent.
	l, err := open(Libraries{NCCL: si.NCCL, CUDA: si.CUDA}, map[string]bool{"ncclMemAlloc": true, "ncclCommRegister": true, "ncclGetLastError": true})
	if err != nil {
		t.Fatal(err)
	}
	if l.Has("ncclMemAlloc") || !l.Has("ncclMemFree") {
		t.Fatalf("Has: ncclMemAlloc %v, ncclMemFree %v", l.Has("ncclMemAlloc"), l.Has("ncclMemFree"))
	}
	if m := l.Missing(); strings.Join(m, ",") != "ncclCommRegister,ncclGetLastError,ncclMemAlloc" {
		t.Fatalf("Missing() = %v", m)
	}
}

func TestInfo(t *testing.T) {
	standInOnly(t)
	info := lib.Info()
	if info.Err != nil {
		t.Fatal(info.Err)
	}
	// The version DDPGO_STANDIN_NCCL names: its patch release, when it
	// gives none, is the stand-in's choice.
	want := 22606
	if v := os.Getenv(standin.Env); v != "" {
		var major, minor, patch int
		if n, _ := fmt.Sscanf(v, "%d.%d.%d", &major, &minor, &patch); n < 3 {
			patch = info.NCCLVersion % 100
		}
		want = major*10000 + minor*100 + patch
	}
	wantS := VersionString(want)
	if info.NCCLVersion != want || VersionString(info.NCCLVersion) != wantS {
		t.Errorf("NCCL version %d (%s), want the stand-in's %d", info.NCCLVersion, VersionString(info.NCCLVersion), want)
	}
	if info.DriverVersion != 12060 || DriverVersionString(info.DriverVersion) != "12.6" {
		t.Errorf("driver version %d, want 12060", info.DriverVersion)
	}
	if len(info.Devices) != 4 || info.Devices[1].Name != "stand-in device 1 (not a GPU)" || info.Devices[1].Major != 9 {
		t.Errorf("devices %+v", info.Devices)
	}
	s := info.String()
	if !strings.Contains(info.StandIn, "stand-in") || lib.StandIn() != info.StandIn {
		t.Errorf("StandIn %q (Library: %q); want the stand-in's description", info.StandIn, lib.StandIn())
	}
	for _, want := range []string{"STAND-IN", "not NCCL", "NCCL " + wantS, "CUDA driver API 12.6", "4 device(s)", "compute capability 9.0"} {
		if !strings.Contains(s, want) {
			t.Errorf("Info.String() = %q, missing %q", s, want)
		}
	}
}

// TestLibrariesFromEnv: empty Libraries fields take DDPGO_NCCL_LIBRARY
// and DDPGO_CUDA_LIBRARY, and a path there that does not load is an error
// that names it and says what to install.
func TestLibrariesFromEnv(t *testing.T) {
	standInOnly(t)
	t.Setenv(EnvNCCL, si.NCCL)
	t.Setenv(EnvCUDA, si.CUDA)
	l, err := Open(Libraries{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Paths() != (Libraries{NCCL: si.NCCL, CUDA: si.CUDA}) || l.StandIn() == "" {
		t.Errorf("Open(Libraries{}) with the variables set: paths %+v, stand-in %q", l.Paths(), l.StandIn())
	}
	t.Setenv(EnvNCCL, "/nonexistent/lib/libnccl.so.2")
	_, err = Open(Libraries{})
	for _, want := range []string{"/nonexistent/lib/libnccl.so.2", "nvidia-nccl-cu12", EnvNCCL, "install NCCL"} {
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open with %s naming no library: %v; want ErrNotFound saying %q", EnvNCCL, err, want)
		}
	}
	if info := GetInfo(Libraries{}); info.NCCL != "/nonexistent/lib/libnccl.so.2" || !errors.Is(info.Err, ErrNotFound) {
		t.Errorf("GetInfo with %s set: %+v", EnvNCCL, info)
	}
}

func TestVersionString(t *testing.T) {
	for v, want := range map[int]string{2708: "2.7.8", 21400: "2.14.0", 22105: "2.21.5", 23007: "2.30.7"} {
		if got := VersionString(v); got != want {
			t.Errorf("VersionString(%d) = %q, want %q", v, got, want)
		}
	}
}
