package nccl

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The CUDA tools and headers of the checks below are searched for in the
// variable's path, then in the usual places, then in .cache/cuda at the
// module root, where make ptxas-deps and make cuda-dev-deps unpack
// Debian's CUDA 11.8 packages.
const (
	envPTXAS        = "DDPGO_PTXAS"         // a ptxas binary
	envRequirePTXAS = "DDPGO_REQUIRE_PTXAS" // "1": a missing ptxas fails TestPTXAssembles (CI)
)

// ptxArchs are the architectures kernels.ptx is assembled for: its
// .target (sm_52, the oldest the driver JIT-compiles it for) and the
// Volta, Ampere and Hopper GPUs that run NCCL in practice.
var ptxArchs = []int{52, 70, 80, 90}

// TestPTXAssembles assembles kernels.ptx with NVIDIA's ptxas for every
// architecture of ptxArchs, warnings as errors, and checks in each cubin
// that every kernel kernels.go launches is there as an entry point taking
// the parameters ddp_cuLaunch passes: (u64, u64, u64, u64, f32). It is
// what the driver's JIT does at cuModuleLoadData, without a GPU.
func TestPTXAssembles(t *testing.T) {
	ptxas := findCUDA(t, envPTXAS, "bin/ptxas", []string{"ptxas"}, []string{"/usr/local/cuda/bin/ptxas"})
	if ptxas == "" {
		msg := "ptxas not found (" + envPTXAS + ", PATH, /usr/local/cuda/bin, .cache/cuda/bin): " +
			"make ptxas-deps unpacks the one of Debian's nvidia-cuda-toolkit into .cache/cuda (root; Debian's non-free component)"
		if os.Getenv(envRequirePTXAS) == "1" {
			t.Fatal(msg + "; " + envRequirePTXAS + "=1 requires it")
		}
		t.Skip(msg)
	}
	if out, err := exec.Command(ptxas, "--version").CombinedOutput(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Logf("%s: %s", ptxas, lines[len(lines)-1])
	}
	// A ptxas targets the architectures its --help lists: CUDA 13 dropped
	// everything before sm_75, CUDA 11.8 (CI's) has sm_35 to sm_90. An
	// architecture this ptxas does not know skips; one it knows must
	// assemble, and at least one must.
	known := ptxasArchs(ptxas)
	assembled := 0
	for _, arch := range ptxArchs {
		t.Run(fmt.Sprintf("sm_%d", arch), func(t *testing.T) {
			if known != nil && !known[arch] {
				t.Skipf("this ptxas does not target sm_%d", arch)
			}
			defer func() {
				if !t.Failed() {
					assembled++
				}
			}()
			cubin := filepath.Join(t.TempDir(), "kernels.cubin")
			cmd := exec.Command(ptxas, "--warning-as-error", fmt.Sprintf("--gpu-name=sm_%d", arch), "--output-file", cubin, "kernels.ptx")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
			}
			if err := checkCubin(cubin, arch, kernelNames); err != nil {
				t.Fatal(err)
			}
		})
	}
	if assembled == 0 && !t.Failed() {
		t.Fatalf("this ptxas targets none of sm_%v", ptxArchs)
	}
}

// ptxasArchs returns the sm_N architectures ptxas --help lists as values
// of --gpu-name, or nil if it lists none (another format: then every
// architecture is tried).
func ptxasArchs(ptxas string) map[int]bool {
	out, err := exec.Command(ptxas, "--help").CombinedOutput()
	if err != nil {
		return nil
	}
	var known map[int]bool
	for _, m := range regexp.MustCompile(`'sm_([0-9]+)'`).FindAllSubmatch(out, -1) {
		n, err := strconv.Atoi(string(m[1]))
		if err != nil {
			continue
		}
		if known == nil {
			known = map[int]bool{}
		}
		known[n] = true
	}
	return known
}

// kernelParams is the parameter list, as (offset, size) in bytes, that
// ddp_cuLaunch gives every kernel: three u64 addresses, the u64 count and
// the f32 scalar.
var kernelParams = [][2]int{{0, 8}, {8, 8}, {16, 8}, {24, 8}, {32, 4}}

// checkCubin checks that the cubin ptxas wrote is for sm_arch and has
// each kernel of names as a global function whose parameters are
// kernelParams.
func checkCubin(path string, arch int, names []string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// ptxas writes the CUDA API version (118 for 11.8) in e_version,
	// which debug/elf rejects unless it is EV_CURRENT: read a copy with
	// that field set to EV_CURRENT.
	if len(raw) < 0x40 {
		return fmt.Errorf("%s: %d bytes, too short for an ELF header", path, len(raw))
	}
	fixed := bytes.Clone(raw)
	binary.LittleEndian.PutUint32(fixed[0x14:], uint32(elf.EV_CURRENT))
	f, err := elf.NewFile(bytes.NewReader(fixed))
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	if f.Machine != elf.EM_CUDA || f.Class != elf.ELFCLASS64 {
		return fmt.Errorf("%s: machine %v, class %v; want EM_CUDA, ELFCLASS64", path, f.Machine, f.Class)
	}
	if sm, err := cubinSM(raw); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	} else if sm != arch {
		return fmt.Errorf("%s: e_flags %#x name sm_%d; want sm_%d", path, binary.LittleEndian.Uint32(raw[0x30:]), sm, arch)
	}
	syms, err := f.Symbols()
	if err != nil {
		return fmt.Errorf("%s: symbols: %v", path, err)
	}
	funcs := map[string]bool{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			funcs[s.Name] = true
		}
	}
	var errs []error
	for _, name := range names {
		if !funcs[name] {
			errs = append(errs, fmt.Errorf("sm_%d: no kernel %s (entry points: %v)", arch, name, funcs))
			continue
		}
		sec := f.Section(".nv.info." + name)
		if sec == nil {
			errs = append(errs, fmt.Errorf("sm_%d: %s: no .nv.info.%s section", arch, name, name))
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return err
		}
		params, err := kernelParamInfo(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("sm_%d: %s: %v", arch, name, err))
		} else if fmt.Sprint(params) != fmt.Sprint(kernelParams) {
			errs = append(errs, fmt.Errorf("sm_%d: %s takes parameters (offset, size) %v; ddp_cuLaunch passes %v", arch, name, params, kernelParams))
		}
	}
	return errors.Join(errs...)
}

// cubinSM returns the SM version a cubin's ELF header names. e_flags (not
// in elf.FileHeader) holds it where the CUDA ELF ABI version, in
// e_ident[EI_ABIVERSION], says: ABI 7 (ptxas up to CUDA 12) in the low
// byte, beside the addressing and texture-mode flags; ABI 8 (CUDA 13) in
// bits 8-15.
func cubinSM(raw []byte) (int, error) {
	if len(raw) < 0x34 {
		return 0, fmt.Errorf("%d bytes, too short for an ELF header", len(raw))
	}
	flags := binary.LittleEndian.Uint32(raw[0x30:])
	switch abi := raw[elf.EI_ABIVERSION]; abi {
	case 7:
		return int(flags & 0xff), nil
	case 8:
		return int(flags >> 8 & 0xff), nil
	default:
		return 0, fmt.Errorf("CUDA ELF ABI version %d (e_flags %#x): neither 7 nor 8, whose layouts this test knows", abi, flags)
	}
}

// kernelParamInfo reads a kernel's parameters, as (offset, size) by
// ordinal, from its .nv.info section: a list of attributes, each a format
// byte and an attribute byte, then for EIFMT_SVAL (4) a 16-bit length and
// that many bytes, else a 16-bit value. EIATTR_KPARAM_INFO (0x17) is one
// parameter: index (32 bits), ordinal and offset (16 bits each), then a
// 32-bit word whose top 14 bits are the size.
func kernelParamInfo(b []byte) ([][2]int, error) {
	const (
		fmtNVAL, fmtBVAL, fmtHVAL, fmtSVAL = 1, 2, 3, 4
		attrKParamInfo                     = 0x17
	)
	var params [][2]int
	for len(b) >= 4 {
		format, attr := b[0], b[1]
		n := 4
		switch format {
		case fmtNVAL, fmtBVAL, fmtHVAL:
		case fmtSVAL:
			n += int(binary.LittleEndian.Uint16(b[2:]))
		default:
			return nil, fmt.Errorf(".nv.info: unknown attribute format %#x", format)
		}
		if n > len(b) {
			return nil, fmt.Errorf(".nv.info: attribute %#x runs past the section", attr)
		}
		if format == fmtSVAL && attr == attrKParamInfo {
			if n != 16 {
				return nil, fmt.Errorf(".nv.info: EIATTR_KPARAM_INFO of %d bytes, want 12", n-4)
			}
			ordinal := int(binary.LittleEndian.Uint16(b[8:]))
			offset := int(binary.LittleEndian.Uint16(b[10:]))
			size := int(binary.LittleEndian.Uint32(b[12:]) >> 18)
			for len(params) <= ordinal {
				params = append(params, [2]int{-1, -1})
			}
			params[ordinal] = [2]int{offset, size}
		}
		b = b[n:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf(".nv.info: %d bytes left over", len(b))
	}
	return params, nil
}

// findCUDA returns the first of: the path in variable env (which must
// exist), a command of names on PATH, a path of fixed, and rel under
// .cache/cuda at the module root; "" when none exists.
func findCUDA(t *testing.T, env, rel string, names, fixed []string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", env, p, err)
		}
		return p
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	candidates := append([]string{}, fixed...)
	if root := moduleRoot(); root != "" {
		candidates = append(candidates, filepath.Join(root, ".cache", "cuda", rel))
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// moduleRoot is the nearest directory upward holding go.mod, or "".
func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// TestCubinSM reads the SM version from both layouts of the CUDA ELF
// header, with the e_flags of kernels.ptx's cubins for sm_90 from CUDA
// 11.8's ptxas (ABI 7) and CUDA 13.0's (ABI 8).
func TestCubinSM(t *testing.T) {
	header := func(abi byte, flags uint32) []byte {
		h := make([]byte, 0x40)
		copy(h, "\x7fELF\x02\x01\x01\x33")
		h[elf.EI_ABIVERSION] = abi
		binary.LittleEndian.PutUint32(h[0x30:], flags)
		return h
	}
	for _, c := range []struct {
		abi   byte
		flags uint32
		want  int
	}{
		{7, 0x0034055a, 90},
		{7, 0x00340534, 52},
		{8, 0x06005a04, 90},
		{8, 0x06005004, 80},
	} {
		if got, err := cubinSM(header(c.abi, c.flags)); err != nil || got != c.want {
			t.Errorf("ABI %d, e_flags %#x: sm_%d, %v; want sm_%d", c.abi, c.flags, got, err, c.want)
		}
	}
	if _, err := cubinSM(header(9, 0x06005a04)); err == nil {
		t.Error("ABI 9: no error; want one (an unknown layout)")
	}
	if _, err := cubinSM(make([]byte, 0x20)); err == nil {
		t.Error("32-byte header: no error")
	}
}
