package nccl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const (
	envCUDAInclude = "DDPGO_CUDA_INCLUDE" // a directory with cuda.h
	envNCCLInclude = "DDPGO_NCCL_INCLUDE" // a directory with nccl.h (pip's nvidia-nccl-cu12 has nvidia/nccl/include)
	envNCCLHIn     = "DDPGO_NCCL_H_IN"    // NCCL's src/nccl.h.in, made into nccl.h by the test
)

// TestABIAgainstHeaders compiles testdata/abicheck/abicheck.c: binding.h's
// function pointer types, one assertion per function, its own stand-ins
// for the headers' types, ddp_config's layout and the constants C and Go
// use, against the real cuda.h and nccl.h. Building the package needs
// neither header, so this is where a declaration written wrongly by hand
// is caught. It skips where the headers are not found and says how to get
// them. Each run first checks that the check fails when one function's
// type in binding.h is wrong. nccl.h must be of NCCL 2.19 or newer, the
// first to declare every function the binding may call; it passed with
// CUDA 11.8's cuda.h and the nccl.h of NCCL 2.19.3, 2.23.4 and 2.30.7.
func TestABIAgainstHeaders(t *testing.T) {
	cudaInc := findInclude(t, envCUDAInclude, "cuda.h", "/usr/include", "/usr/local/cuda/include")
	if cudaInc == "" {
		t.Skip("cuda.h not found (" + envCUDAInclude + ", /usr/include, /usr/local/cuda/include, .cache/cuda/include): " +
			"make cuda-dev-deps unpacks CUDA 11.8's headers from Debian's nvidia-cuda-dev into .cache/cuda/include (root; a 774 MB download)")
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s)", cc)
	}
	pkg, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	compile := func(t *testing.T, first string, defines ...string) ([]byte, error) {
		args := []string{"-fsyntax-only", "-std=gnu11", "-Wall", "-Werror"}
		if first != "" {
			args = append(args, "-I", first)
		}
		args = append(args, "-I", pkg, "-I", cudaInc)
		args = append(args, goConstants()...)
		args = append(args, defines...)
		args = append(args, filepath.Join("testdata", "abicheck", "abicheck.c"))
		out, err := exec.Command(cc, args...).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%s %s: %v", cc, strings.Join(args, " "), err)
		}
		return out, err
	}
	t.Logf("cuda.h from %s: %s", cudaInc, headerDefine(filepath.Join(cudaInc, "cuda.h"), "CUDA_VERSION"))

	t.Run("cuda.h", func(t *testing.T) {
		mutant := mutateBinding(t, "X(0, 1, cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))",
			"X(0, 1, cuMemAlloc_v2, CUresult, (CUdeviceptr *, unsigned int))")
		if out, err := compile(t, mutant, "-DDDP_CHECK_CUDA"); err == nil || !strings.Contains(string(out), "cuMemAlloc_v2: pfn_cuMemAlloc_v2 of binding.h differs") {
			t.Fatalf("with cuMemAlloc_v2 taking an unsigned int, the check passed or failed otherwise: %v\n%s", err, out)
		}
		if out, err := compile(t, "", "-DDDP_CHECK_CUDA"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	})

	t.Run("nccl.h", func(t *testing.T) {
		ncclInc := findInclude(t, envNCCLInclude, "nccl.h", "/usr/include", "/usr/local/cuda/include")
		if in := os.Getenv(envNCCLHIn); ncclInc == "" && in != "" {
			ncclInc = makeNCCLHeader(t, in)
		}
		if ncclInc == "" {
			t.Skip("nccl.h not found (" + envNCCLInclude + ", /usr/include, /usr/local/cuda/include): Debian has no NCCL; " +
				"set " + envNCCLHIn + " to src/nccl.h.in of a clone of github.com/NVIDIA/nccl, or " + envNCCLInclude +
				" to pip's nvidia/nccl/include")
		}
		t.Logf("nccl.h from %s: NCCL %s.%s.%s", ncclInc, headerDefine(filepath.Join(ncclInc, "nccl.h"), "NCCL_MAJOR"),
			headerDefine(filepath.Join(ncclInc, "nccl.h"), "NCCL_MINOR"), headerDefine(filepath.Join(ncclInc, "nccl.h"), "NCCL_PATCH"))
		defs := []string{"-DDDP_CHECK_CUDA", "-DDDP_CHECK_NCCL", "-I", ncclInc}
		mutant := mutateBinding(t, "ncclResult_t, (ncclComm_t, ncclResult_t *))", "ncclResult_t, (ncclComm_t, int *))")
		if out, err := compile(t, mutant, defs...); err == nil || !strings.Contains(string(out), "ncclCommGetAsyncError: pfn_ncclCommGetAsyncError of binding.h differs") {
			t.Fatalf("with ncclCommGetAsyncError taking an int *, the check passed or failed otherwise: %v\n%s", err, out)
		}
		if out, err := compile(t, "", defs...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	})
}

// goConstants are the -D flags that give abicheck.c the Go constants
// that must equal the headers' values.
func goConstants() []string {
	var d []string
	for name, v := range map[string]int{
		"GO_CUDA_ERROR_NOT_READY":      cudaErrorNotReady,
		"GO_ATTR_COMPUTE_MAJOR":        attrComputeMajor,
		"GO_ATTR_COMPUTE_MINOR":        attrComputeMinor,
		"GO_NCCL_SUCCESS":              int(ResultSuccess),
		"GO_NCCL_UNHANDLED_CUDA_ERROR": int(ResultUnhandledCudaError),
		"GO_NCCL_SYSTEM_ERROR":         int(ResultSystemError),
		"GO_NCCL_INTERNAL_ERROR":       int(ResultInternalError),
		"GO_NCCL_INVALID_ARGUMENT":     int(ResultInvalidArgument),
		"GO_NCCL_INVALID_USAGE":        int(ResultInvalidUsage),
		"GO_NCCL_REMOTE_ERROR":         int(ResultRemoteError),
		"GO_NCCL_IN_PROGRESS":          resultInProgress,
	} {
		d = append(d, fmt.Sprintf("-D%s=%d", name, v))
	}
	return d
}

// mutateBinding writes binding.h with old replaced by repl into a
// directory of its own and returns the directory.
func mutateBinding(t *testing.T, old, repl string) string {
	t.Helper()
	src, err := os.ReadFile("binding.h")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), old) {
		t.Fatalf("binding.h has no %q to change", old)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "binding.h"), []byte(strings.Replace(string(src), old, repl, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// findInclude returns the directory holding header: the variable's (where
// the header must be), one of dirs, or .cache/cuda/include at the module
// root; "" when none has it.
func findInclude(t *testing.T, env, header string, dirs ...string) string {
	t.Helper()
	if d := os.Getenv(env); d != "" {
		if _, err := os.Stat(filepath.Join(d, header)); err != nil {
			t.Fatalf("%s=%s: %v", env, d, err)
		}
		return d
	}
	if root := moduleRoot(); root != "" {
		dirs = append(dirs, filepath.Join(root, ".cache", "cuda", "include"))
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, header)); err == nil {
			return d
		}
	}
	return ""
}

// makeNCCLHeader writes nccl.h from NCCL's nccl.h.in into a directory of
// its own, as NCCL's build does: the ${nccl:...} fields take the version
// of makefiles/version.mk beside src/ where there is one, else 0.0.0.
func makeNCCLHeader(t *testing.T, in string) string {
	t.Helper()
	src, err := os.ReadFile(in)
	if err != nil {
		t.Fatalf("%s: %v", envNCCLHIn, err)
	}
	ver := map[string]int{"MAJOR": 0, "MINOR": 0, "PATCH": 0}
	if mk, err := os.ReadFile(filepath.Join(filepath.Dir(in), "..", "makefiles", "version.mk")); err == nil {
		for _, m := range regexp.MustCompile(`(?m)^NCCL_(MAJOR|MINOR|PATCH)\s*:=\s*(\d+)`).FindAllStringSubmatch(string(mk), -1) {
			var v int
			fmt.Sscan(m[2], &v)
			ver[m[1]] = v
		}
	}
	code := ver["MAJOR"]*10000 + ver["MINOR"]*100 + ver["PATCH"]
	if ver["MAJOR"] <= 2 && ver["MINOR"] <= 8 {
		code = ver["MAJOR"]*1000 + ver["MINOR"]*100 + ver["PATCH"]
	}
	h := strings.NewReplacer(
		"${nccl:Major}", fmt.Sprint(ver["MAJOR"]),
		"${nccl:Minor}", fmt.Sprint(ver["MINOR"]),
		"${nccl:Patch}", fmt.Sprint(ver["PATCH"]),
		"${nccl:Suffix}", "",
		"${nccl:Version}", fmt.Sprint(code),
	).Replace(string(src))
	if i := strings.Index(h, "${nccl:"); i >= 0 {
		t.Fatalf("%s: a field this test does not fill: %.40s", in, h[i:])
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nccl.h"), []byte(h), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// headerDefine returns the value of #define name in the header, or "?".
func headerDefine(path, name string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	if m := regexp.MustCompile(`(?m)^#define\s+` + name + `\s+(\S+)`).FindSubmatch(b); m != nil {
		return string(m[1])
	}
	return "?"
}
