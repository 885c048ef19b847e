package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/google/uuid"
	"github.com/urfave/cli/v2"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// run runs ddpbench with args and returns the exit status and output.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = runMain(append([]string{"ddpbench"}, args...), &o, &e)
	return code, o.String(), e.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestErrors checks that every bad command line fails with one line on
// stderr that says what is wrong, and the right exit status.
func TestErrors(t *testing.T) {
	badJSON := writeFile(t, "bad.json", `{"model":"x","params":[{"name":"w","shape":[4,0]}]}`)
	half := writeFile(t, "half.json", `{"model":"h","dtype":"float16","params":[{"name":"w","shape":[4]}]}`)
	syntax := writeFile(t, "syntax.json", "{\n\"model\": \"x\",\n\"params\": [,]}")
	dir := t.TempDir()
	missingDir := filepath.Join(dir, "missing", "t.json")
	tests := []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"--bogus"}, 2, []string{"bogus"}},
		{[]string{"run", "--ranks", "0"}, 2, []string{"--ranks 0"}},
		{[]string{"run", "--ranks", "two"}, 2, []string{"two"}},
		{[]string{"run", "--bucket-cap-mb", "-1"}, 2, []string{"--bucket-cap-mb -1"}},
		{[]string{"run", "--first-bucket-mb", "0"}, 2, []string{"--first-bucket-mb 0"}},
		{[]string{"run", "--compression", "fp8"}, 2, []string{`--compression "fp8"`}},
		{[]string{"run", "--compute", "warp"}, 2, []string{`--compute "warp"`}},
		{[]string{"run", "--compute", "sleep"}, 2, []string{"exactly one of --rate, --gflops or --compute-time"}},
		{[]string{"run", "--compute", "sleep", "--rate", "1e9", "--gflops", "10"}, 2, []string{"exactly one"}},
		{[]string{"run", "--compute", "spin", "--rate", "-3"}, 2, []string{"--rate -3"}},
		{[]string{"run", "--compute", "spin", "--gflops", "10", "--batch", "0"}, 2, []string{"--batch 0"}},
		{[]string{"run", "--rate", "1e9"}, 2, []string{"--rate needs --compute sleep or spin"}},
		{[]string{"run", "--format", "xml"}, 2, []string{`--format "xml"`}},
		{[]string{"run", "--steps", "0"}, 2, []string{"--steps 0"}},
		{[]string{"run", "--warmup", "-1"}, 2, []string{"--warmup -1"}},
		{[]string{"run", "--trace-steps", "0"}, 2, []string{"--trace-steps 0"}},
		{[]string{"run", "--backend", "mpi"}, 2, []string{"--backend mpi", "not built", "built: inproc"}},
		{[]string{"run", "--backend", "gloo"}, 2, []string{`--backend "gloo"`}},
		{[]string{"run", "--model", "vgg16"}, 1, []string{"unknown model", "vgg16", "resnet50, bert-base, gpt2-small"}},
		{[]string{"run", "--model", badJSON}, 1, []string{badJSON, "params[0].shape[1]"}},
		{[]string{"run", "--model", syntax}, 1, []string{syntax + ":3:", "invalid character"}},
		{[]string{"run", "--model", half}, 1, []string{half, `dtype "float16"`, "float32 gradients only"}},
		{[]string{"run", "extra"}, 2, []string{`unexpected argument "extra"`}},
		{[]string{"sweep", "--caps", "1,a"}, 2, []string{`"a" is not a size`}},
		{[]string{"sweep", "--caps", "5,2"}, 2, []string{"caps must increase"}},
		{[]string{"collective", "-b", "0"}, 2, []string{`-b/--minbytes "0"`}},
		{[]string{"collective", "-b", "4X"}, 2, []string{`-b/--minbytes "4X"`}},
		{[]string{"collective", "-b", "1M", "-e", "4K"}, 2, []string{"smaller than -b/--minbytes"}},
		{[]string{"collective", "-f", "1"}, 2, []string{"-f/--stepfactor 1"}},
		{[]string{"collective", "-f", "3", "-i", "8"}, 2, []string{"-f/--stepfactor 3", `-i/--stepbytes "8"`, "one of them"}},
		{[]string{"collective", "-b", "1", "-e", "3"}, 2, []string{"-e/--maxbytes 3", "allreduce of float with 2 ranks needs at least 4 bytes"}},
		{[]string{"collective", "--op", "allgather", "--ranks", "3", "-b", "4", "-e", "40"}, 2, []string{"-e/--maxbytes 40", "at least 48 bytes"}},
		{[]string{"collective", "-d", "int8"}, 2, []string{`-d/--datatype "int8"`}},
		{[]string{"collective", "-o", "prod"}, 2, []string{`-o/--redop "prod"`}},
		{[]string{"collective", "-c", "2"}, 2, []string{"-c/--check 2"}},
		{[]string{"collective", "-n", "0"}, 2, []string{"-n/--iters 0"}},
		{[]string{"collective", "-a", "4"}, 2, []string{"-a/--average 4"}},
		{[]string{"collective", "--op", "gather"}, 2, []string{`--op "gather"`}},
		{[]string{"collective", "--op", "broadcast", "-r", "2"}, 2, []string{"-r/--root 2"}},
		{[]string{"collective", "--op", "sendrecv", "--ranks", "1"}, 2, []string{"sendrecv needs --ranks >= 2"}},
		{[]string{"nosuch"}, 2, []string{`"nosuch"`}},
		// Output paths are checked before the benchmark runs.
		{[]string{"run", "--trace", missingDir}, 2, []string{fmt.Sprintf("--trace %q", missingDir), "no such file or directory"}},
		{[]string{"run", "--trace", dir}, 2, []string{fmt.Sprintf("--trace %q: is a directory", dir)}},
		{[]string{"sweep", "--plot", missingDir}, 2, []string{fmt.Sprintf("--plot %q", missingDir), "no such file or directory"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := run(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit status %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "ddpbench: ") {
				t.Errorf("stderr %q: want one line starting with ddpbench:", stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
		})
	}
}

// TestEnvVarNames checks that every flag of every command can be set
// through DDPBENCH_<NAME>.
func TestEnvVarNames(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	check := func(where string, flags []cli.Flag) {
		for _, f := range flags {
			name := f.Names()[0]
			ev, ok := f.(interface{ GetEnvVars() []string })
			if !ok || !slices.Equal(ev.GetEnvVars(), []string{envName(name)}) {
				t.Errorf("%s --%s: env vars %v, want [%s]", where, name, ev.GetEnvVars(), envName(name))
			}
		}
	}
	check("ddpbench", app.Flags)
	for _, c := range app.Commands {
		check(c.Name, c.Flags)
	}
	if got := envName("bucket-cap-mb"); got != "DDPBENCH_BUCKET_CAP_MB" {
		t.Errorf("envName(bucket-cap-mb) = %s", got)
	}
}

// TestEnvVars checks that the variables take effect and that the command
// line wins over them.
func TestEnvVars(t *testing.T) {
	t.Run("invalid value from the environment", func(t *testing.T) {
		t.Setenv("DDPBENCH_RANKS", "0")
		code, _, stderr := run(t, "run")
		if code != 2 || stderr != "ddpbench: --ranks 0: want 1..1024 (from DDPBENCH_RANKS)\n" {
			t.Errorf("status %d, stderr %q", code, stderr)
		}
		// On the command line, the flag is named alone.
		code, _, stderr = run(t, "run", "--ranks=0")
		if code != 2 || stderr != "ddpbench: --ranks 0: want 1..1024\n" {
			t.Errorf("status %d, stderr %q", code, stderr)
		}
		t.Setenv("DDPBENCH_MINBYTES", "4X")
		for _, args := range [][]string{{"collective"}, {"collective", "-b", "4X"}, {"collective", "--minbytes", "4X"}} {
			_, _, stderr = run(t, args...)
			if got := strings.Contains(stderr, "(from DDPBENCH_MINBYTES)"); got != (len(args) == 1) {
				t.Errorf("%v: stderr %q", args, stderr)
			}
		}
	})
	t.Run("unparsable value from the environment", func(t *testing.T) {
		t.Setenv("DDPBENCH_STEPS", "many")
		code, _, stderr := run(t, "run")
		if code == 0 || !strings.Contains(stderr, "DDPBENCH_STEPS") {
			t.Errorf("status %d, stderr %q", code, stderr)
		}
	})
	t.Run("value used", func(t *testing.T) {
		t.Setenv("DDPBENCH_FORMAT", "csv")
		t.Setenv("DDPBENCH_MAXBYTES", "4K")
		code, stdout, stderr := run(t, "collective", "-b", "1K", "-n", "1", "-w", "0")
		if code != 0 {
			t.Fatalf("status %d, stderr %q", code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if !strings.HasPrefix(lines[0], "op,size_bytes") || len(lines) != 1+2 {
			t.Errorf("want a CSV header and rows for 1K and 4K, got %q", stdout)
		}
	})
	t.Run("command line wins", func(t *testing.T) {
		t.Setenv("DDPBENCH_FORMAT", "xml")
		code, stdout, stderr := run(t, "collective", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--format", "json")
		if code != 0 || !json.Valid([]byte(stdout)) {
			t.Errorf("status %d, stderr %q, stdout %q", code, stderr, stdout)
		}
	})
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"8", 8}, {"4K", 4096}, {"4k", 4096}, {"4KB", 4096}, {"4KiB", 4096}, {"256M", 256 << 20}, {"1G", 1 << 30}, {" 2M ", 2 << 20},
		{"0", 0}, {"-4K", 0}, {"K", 0}, {"4T", 0}, {"1.5M", 0}, {"", 0},
	}
	for _, tt := range tests {
		got, err := parseSize("-b", tt.in)
		if tt.want == 0 {
			if err == nil {
				t.Errorf("parseSize(%q) = %d, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestGroupDigits(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 25557032: "25,557,032", -1234: "-1,234"} {
		if got := groupDigits(in); got != want {
			t.Errorf("groupDigits(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestRenderBar(t *testing.T) {
	tests := []struct {
		done, total int
		want        string
	}{
		{0, 10, "run [>         ] 0/10 2.5s"},
		{5, 10, "run [=====>    ] 5/10 2.5s"},
		{10, 10, "run [==========] 10/10 2.5s"},
		{12, 10, "run [==========] 10/10 2.5s"},
	}
	for _, tt := range tests {
		if got := renderBar("run", tt.done, tt.total, 2500e6, 10); got != tt.want {
			t.Errorf("renderBar(%d/%d) = %q, want %q", tt.done, tt.total, got, tt.want)
		}
	}
}

// TestProgressSilent checks that the bar writes nothing to a writer that
// is not a terminal.
func TestProgressSilent(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, "x", 3, true)
	p.add(3)
	p.stop()
	p.stop()
	if b.Len() != 0 {
		t.Errorf("progress wrote %q to a buffer", b.String())
	}
}

// tinyModel is a manifest small enough for runs in tests.
const tinyModel = `{"model":"tiny","source":"test","params":[
 {"name":"a.weight","shape":[64,32]},{"name":"a.bias","shape":[64]},
 {"name":"b.weight","shape":[1000,300]},{"name":"b.bias","shape":[1000]}]}`

func TestRunOutputs(t *testing.T) {
	model := writeFile(t, "tiny.json", tinyModel)
	common := []string{"--model", model, "--steps", "3", "--warmup", "1", "--bucket-cap-mb", "0.5", "--first-bucket-mb", "0.01"}
	t.Run("csv", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--format", "csv"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 2 || !slices.Equal(recs[0], runCSVHeader) || len(recs[1]) != len(runCSVHeader) {
			t.Fatalf("csv shape: %q", recs)
		}
		row := map[string]string{}
		for i, k := range recs[0] {
			row[k] = recs[1][i]
		}
		if row["model"] != "tiny" || row["ranks"] != "2" || row["grad_bytes"] != "1212448" || row["bytes_per_step"] != "1212448" {
			t.Errorf("csv row %v", row)
		}
		if _, err := uuid.Parse(row["run_id"]); err != nil {
			t.Errorf("run_id %q: %v", row["run_id"], err)
		}
	})
	t.Run("json", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--format", "json", "--compression", "fp16", "--zero-grad"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		var j runJSON
		dec := json.NewDecoder(strings.NewReader(stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil {
			t.Fatal(err)
		}
		if j.Model != "tiny" || j.Tensors != 4 || j.Parameters != 303112 || j.Compression != "fp16" || j.Steps != 3 {
			t.Errorf("json %+v", j)
		}
		if !j.ZeroGrad {
			t.Error("--zero-grad is not in the json output")
		}
		if _, err := uuid.Parse(j.RunID); err != nil {
			t.Errorf("run_id %q: %v", j.RunID, err)
		}
		if j.BytesPerStep != j.GradBytes/2 {
			t.Errorf("fp16 bytes per step %d, want half of %d", j.BytesPerStep, j.GradBytes)
		}
		var sum int64
		for _, b := range j.Buckets {
			sum += b
		}
		if sum != j.GradBytes || len(j.Buckets) < 2 {
			t.Errorf("buckets %v do not add up to %d", j.Buckets, j.GradBytes)
		}
	})
	t.Run("table", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--compute", "sleep", "--compute-time", "2ms"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		for _, w := range []string{"tiny: 4 tensors, 303,112 parameters", "step time (ms)", "overlap ratio", "busbw (GB/s)",
			"compute sleep at", "2.00 ms of backward", "buckets", "allocations per step"} {
			if !strings.Contains(stdout, w) {
				t.Errorf("table lacks %q:\n%s", w, stdout)
			}
		}
	})
	t.Run("trace", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "trace.json")
		code, _, stderr := run(t, append([]string{"run", "--trace", path, "--trace-steps", "2"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		checkTrace(t, path, 2, 2)
	})
}

func TestSweepOutputs(t *testing.T) {
	model := writeFile(t, "tiny.json", tinyModel)
	plot := filepath.Join(t.TempDir(), "sweep.svg")
	code, stdout, stderr := run(t, "sweep", "--model", model, "--steps", "2", "--warmup", "1", "--caps", "0.25,0.5,2", "--plot", plot)
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "best bucket cap: ") || strings.Count(stdout, "\n") < 7 {
		t.Errorf("sweep table:\n%s", stdout)
	}
	svg, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	checkXML(t, svg)
	code, stdout, stderr = run(t, "sweep", "--model", model, "--steps", "2", "--warmup", "0", "--caps", "0.25,2", "--format", "json")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var j sweepJSON
	if err := json.Unmarshal([]byte(stdout), &j); err != nil || len(j.Runs) != 2 || (j.BestBucketCap != 0.25 && j.BestBucketCap != 2) {
		t.Errorf("sweep json %+v, %v", j, err)
	}
}

func TestInfo(t *testing.T) {
	code, stdout, stderr := run(t, "info")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	for _, w := range []string{"Go:", "GOMAXPROCS", "fp16 kernels:", "inproc   built", "mpi      not built", "nccl     not built", "GPUs:"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("info lacks %q:\n%s", w, stdout)
		}
	}
	var b bytes.Buffer
	writeInfo(&b, "table", collectInfo(gpuInfo{Err: "no NVIDIA driver found (libnvidia-ml.so.1 not loadable: x)"}))
	if !strings.Contains(b.String(), "GPUs:         no NVIDIA driver found (libnvidia-ml.so.1 not loadable: x)") {
		t.Errorf("info without a driver:\n%s", b.String())
	}
	b.Reset()
	writeInfo(&b, "table", collectInfo(gpuInfo{Driver: "550.90.07", Devices: []string{"0: NVIDIA H100 80GB HBM3, 81559 MiB"}}))
	if !strings.Contains(b.String(), "GPUs:         1 (NVIDIA driver 550.90.07)\n  0: NVIDIA H100") {
		t.Errorf("info with a driver:\n%s", b.String())
	}

	code, stdout, stderr = run(t, "info", "--format", "json")
	var j infoData
	if err := json.Unmarshal([]byte(stdout), &j); code != 0 || err != nil {
		t.Fatalf("info json: status %d, %v, stderr %q", code, err, stderr)
	}
	if j.GoVersion == "" || len(j.Backends) != len(backends) || !j.Backends[0].Built || j.Backends[1].Built || j.GPUs.Devices == nil {
		t.Errorf("info json: %+v", j)
	}
	code, stdout, _ = run(t, "info", "--format", "csv")
	recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if code != 0 || err != nil || len(recs) < 10 || recs[0][0] != "key" || recs[1][0] != "go_version" {
		t.Errorf("info csv: status %d, %v, %q", code, err, recs)
	}
	for _, args := range [][]string{{"info", "extra"}, {"info", "--format", "xml"}} {
		if code, stdout, stderr := run(t, args...); code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: status %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

func TestProbeGPUs(t *testing.T) {
	g := probeGPUs()
	if g.Err == "" && g.Driver == "" {
		t.Errorf("probeGPUs: neither an error nor a driver: %+v", g)
	}
	if g.Err != "" && !strings.HasPrefix(g.Err, "no NVIDIA driver found") && !strings.Contains(g.Err, "nvmlDeviceGetCount") {
		t.Errorf("probeGPUs error %q", g.Err)
	}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"8", "4K", "256M", "1G", "4KiB", "-1", "K", "99999999999999999999G"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseSize("-b", s)
		if err != nil {
			if v != 0 {
				t.Fatalf("parseSize(%q) = %d with error %v", s, v, err)
			}
			return
		}
		if v <= 0 || v > 1<<50 {
			t.Fatalf("parseSize(%q) = %d, outside (0, 2^50]", s, v)
		}
		// A size printed back in bytes parses to itself.
		if w, err := parseSize("-b", fmt.Sprint(v)); err != nil || w != v {
			t.Fatalf("round trip of %d: %d, %v", v, w, err)
		}
	})
}

// TestMemoryCheck checks that a run or sweep that would need more memory
// than the machine has fails at once, naming the flags, instead of
// meeting the OOM killer.
func TestMemoryCheck(t *testing.T) {
	defer func(f func() (int64, bool)) { availableMemory = f }(availableMemory)
	availableMemory = func() (int64, bool) { return 1 << 30, true }
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--ranks", "16"}, []string{"--ranks 16 with --model resnet50", "97.49 MiB", "1.52 GiB", "more than the 1.00 GiB available"}},
		{[]string{"run", "--ranks", "8", "--compression", "fp16", "--grad-as-bucket-view=false"}, []string{"--ranks 8", "1.90 GiB"}},
		{[]string{"sweep", "--ranks", "16"}, []string{"--ranks 16"}},
		{[]string{"collective", "-e", "256M", "--ranks", "4"}, []string{"-e/--maxbytes 268435456 with --ranks 4", "2.00 GiB"}},
	}
	for _, tt := range tests {
		code, stdout, stderr := run(t, tt.args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q: want 2, nothing, one line", tt.args, code, stdout, stderr)
		}
		for _, w := range tt.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr %q does not contain %q", tt.args, stderr, w)
			}
		}
	}
	if got := runMemory(100, 3, true, "none"); got != 300 {
		t.Errorf("runMemory = %d, want 300", got)
	}
	if avail, ok := memAvailable(); ok && avail <= 0 {
		t.Errorf("memAvailable = %d, true", avail)
	}
}

// TestProgressAbove checks that output printed above a drawn bar comes
// after the bar is erased, and that nothing is erased when no bar is
// drawn.
func TestProgressAbove(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, label: "x", total: 3}
	p.draw()
	p.above(func() { b.WriteString("row\n") })
	p.above(func() { b.WriteString("row2\n") })
	want := "\r" + renderBar("x", 0, 3, 0, 30)
	if got := b.String(); !strings.HasPrefix(got, "\rx [") || !strings.HasSuffix(got, "\r\033[Krow\nrow2\n") || strings.Count(got, "\033[K") != 1 {
		t.Errorf("output %q; want the bar (%q), one erase, then the rows", got, want)
	}
}

// TestProgressDrawAllocs checks that redrawing the bar allocates nothing:
// it runs during the measured steps, whose allocations are reported.
func TestProgressDrawAllocs(t *testing.T) {
	p := &progress{w: io.Discard, label: "run", total: 1000, start: time.Now()}
	p.draw()
	if a := testing.AllocsPerRun(100, func() { p.add(1); p.draw() }); a != 0 {
		t.Errorf("draw allocates %v times, want 0", a)
	}
}

// TestTimeoutNamed checks that a collective cut short by --timeout says
// so, on a backend whose all-reduce always misses its deadline.
func TestTimeoutNamed(t *testing.T) {
	saved := backends
	defer func() { backends = saved }()
	backends = append([]backend{{name: "late", built: true, newGroup: func(n int) ([]comm.Communicator, error) {
		g, err := newInprocGroup(n)
		for i := range g {
			g[i] = lateComm{g[i]}
		}
		return g, err
	}}}, saved...)
	code, _, stderr := run(t, "collective", "--backend", "late", "--timeout", "3s", "-b", "4K", "-e", "4K")
	if code != 1 || !strings.HasPrefix(stderr, "ddpbench: --timeout 3s exceeded: ") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("status %d, stderr %q", code, stderr)
	}
	if err := timeoutHint(fmt.Errorf("x: %w", comm.ErrTimeout), time.Second); !strings.HasPrefix(err.Error(), "--timeout 1s exceeded: x: ") {
		t.Errorf("timeoutHint(ErrTimeout) = %v", err)
	}
	if err := timeoutHint(errors.New("other"), time.Second); err.Error() != "other" {
		t.Errorf("timeoutHint changed an unrelated error: %v", err)
	}
}

// lateComm is a communicator whose all-reduce never completes in time.
type lateComm struct{ comm.Communicator }

func (c lateComm) AllReduce(_, _ comm.Buffer, _ comm.Op) comm.Work {
	return comm.NewWork(late{}, 0)
}

type late struct{}

func (late) WaitOp(context.Context, uint64) error {
	return fmt.Errorf("waiting: %w", context.DeadlineExceeded)
}
func (late) TestOp(uint64) (bool, error) { return true, context.DeadlineExceeded }

// TestInterrupted checks that a cancelled run stops with status 130 and
// one line, from the parse of its flags to its collectives.
func TestInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{
		{"collective", "-b", "4K", "-e", "4K"},
		{"run", "--steps", "1", "--warmup", "0", "--model", writeFile(t, "m.json", `{"model":"m","params":[{"name":"w","shape":[4]}]}`)},
	} {
		var o, e bytes.Buffer
		code := runMainContext(ctx, append([]string{"ddpbench"}, args...), &o, &e)
		if code != 130 || e.String() != "ddpbench: interrupted\n" {
			t.Errorf("%v: status %d, stderr %q", args, code, e.String())
		}
	}
}
