//go:build cgo && linux

package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The telemetry is tested over fakeNVML, a C stand-in for libnvidia-ml
// built by the test, rather than over go-nvml's mocks: the stand-in goes
// through what can break on a real driver (dlopen, the symbols looked up
// first, go-nvml's lazy binding, the layout of nvmlFieldValue_t), which
// the mocks replace. go-nvml binds NVML's functions once per process, so
// each stand-in runs ddpbench in a child process of its own.

// ddpbenchWithNVML runs ddpbench with args in a child process whose NVML
// is the library at path, over the NCCL stand-in standIn set up.
func ddpbenchWithNVML(t *testing.T, path string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	a, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestTelemetryChild$")
	cmd.Env = append(os.Environ(), "DDPBENCH_TEST_NVML="+path, "DDPBENCH_TEST_ARGS="+string(a))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child running ddpbench %v: %v\n%s", args, err, out)
	}
	i := bytes.Index(out, []byte("RESULT "))
	if i < 0 {
		t.Fatalf("child running ddpbench %v printed no result:\n%s", args, out)
	}
	var r struct {
		Code           int
		Stdout, Stderr string
	}
	if err := json.Unmarshal(bytes.SplitN(out[i+7:], []byte("\n"), 2)[0], &r); err != nil {
		t.Fatalf("child running ddpbench %v: %v\n%s", args, err, out)
	}
	return r.Code, r.Stdout, r.Stderr
}

// TestTelemetryChild is the child of ddpbenchWithNVML.
func TestTelemetryChild(t *testing.T) {
	path := os.Getenv("DDPBENCH_TEST_NVML")
	if path == "" {
		t.Skip("run by ddpbenchWithNVML")
	}
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv("DDPBENCH_TEST_ARGS")), &args); err != nil {
		t.Fatal(err)
	}
	nvmlLibrary = path
	code, stdout, stderr := run(t, args...)
	b, err := json.Marshal(struct {
		Code           int
		Stdout, Stderr string
	}{code, stdout, stderr})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("RESULT %s\n", b)
}

// TestTelemetryFake runs collective and run on the nccl backend (its
// stand-in, two ranks on devices 0 and 1) with fakeNVML, and checks every
// figure in the table, JSON and CSV against what the stand-in reports.
func TestTelemetryFake(t *testing.T) {
	standIn(t)
	lib := buildFakeNVML(t, "-DINIT_RESULT=0")
	model := writeFile(t, "tiny.json", `{"model":"tiny","params":[{"name":"a","shape":[300,256]},{"name":"b","shape":[256]}]}`)
	// 10 ms of backward per step, sampled every 10 ms: several samples per
	// rank in 6 measured steps, however slow the machine.
	runArgs := []string{"run", "--backend", "nccl", "--ranks", "2", "--model", model, "--steps", "6", "--warmup", "1",
		"--compute-time", "10ms", "--telemetry-interval", "10ms"}

	code, out, stderr := ddpbenchWithNVML(t, lib, runArgs...)
	if code != 0 {
		t.Fatalf("run: status %d: %s\n%s", code, stderr, out)
	}
	for _, want := range []string{
		"GPU telemetry (NVML, every 10ms over the measured steps; 2 ranks, ",
		"memory used (GiB)              1.50       2.00 (rank 1)\n",
		"power (W)                     250.5      251.0 (rank 1)\n",
		"PCIe TX (GB/s)                 1.02       1.02 (rank 0)\n",
		"PCIe RX (GB/s)                 2.05       2.05 (rank 0)\n",
		"NVLink TX (GB/s)               1.02       1.02 (rank 0); rank 1: Not Supported\n",
		"NVLink RX (GB/s)               2.05       2.05 (rank 0); rank 1: Not Supported\n",
		"GPU utilisation (%)  ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("run table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(stderr, "no GPU telemetry") {
		t.Errorf("run: stderr says there is no telemetry: %s", stderr)
	}

	code, out, stderr = ddpbenchWithNVML(t, lib, append(runArgs, "--format", "json")...)
	var j runJSON
	if err := json.Unmarshal([]byte(out), &j); code != 0 || err != nil || j.GPUTelemetry == nil {
		t.Fatalf("run json: status %d, %v: %s\n%s", code, err, stderr, out)
	}
	g := j.GPUTelemetry
	if g.IntervalMS != 10 || g.Samples < 2 || fmt.Sprint(g.Ranks) != "[0 1]" || len(g.PerRank) != 2 {
		t.Fatalf("run json telemetry: %+v", g)
	}
	util, mem, power := g.Figures["gpu_util_pct"], g.Figures["memory_used_bytes"], g.Figures["power_w"]
	if util == nil || util.Peak != 91 || util.PeakRank != 1 || util.Median < 40 || util.Median > 91 {
		t.Errorf("utilisation %+v: want a median in [40, 91] and a peak of 91 on rank 1", util)
	}
	if mem == nil || mem.Median != 1.5*(1<<30) || mem.Peak != 2<<30 || power == nil || power.Median != 250.5 || power.Peak != 251 {
		t.Errorf("memory %+v, power %+v", mem, power)
	}
	for key, want := range map[string]float64{"pcie_tx_gbs": 1.024, "pcie_rx_gbs": 2.048, "nvlink_tx_gbs": 1.024, "nvlink_rx_gbs": 2.048} {
		// NVLink's rates are bytes over microseconds in float64: near, not equal.
		if f := g.Figures[key]; f == nil || math.Abs(f.Median-want) > 1e-9 || math.Abs(f.Peak-want) > 1e-9 || f.PeakRank != 0 {
			t.Errorf("%s %+v: want %g on rank 0", key, f, want)
		}
	}
	if r1 := g.PerRank[1]; r1.Rank != 1 || r1.Figures["nvlink_tx_gbs"] != nil || r1.Figures["power_w"] == nil || r1.Figures["power_w"].Median != 251 {
		t.Errorf("rank 1's figures: %+v (want power 251 W and no NVLink)", r1.Figures)
	}

	code, out, stderr = ddpbenchWithNVML(t, lib, append(runArgs, "--format", "csv")...)
	row := csvRow(t, code, out, stderr)
	if row["power_w_median"] != "250.5" || row["power_w_peak"] != "251" || row["nvlink_tx_gbs_peak"] != "1.024" || row["gpu_util_pct_peak"] != "91" {
		t.Errorf("run csv: %v", row)
	}

	// collective: the sweep's figures in the table's footer and the JSON,
	// each size's in its JSON row and CSV row.
	collArgs := []string{"collective", "--backend", "nccl", "-b", "64K", "-e", "256K", "-f", "4", "-n", "200", "-w", "1", "--telemetry-interval", "10ms"}
	code, out, stderr = ddpbenchWithNVML(t, lib, collArgs...)
	if code != 0 {
		t.Fatalf("collective: status %d: %s\n%s", code, stderr, out)
	}
	for _, want := range []string{"# GPU telemetry (NVML, every 10ms over the sweep; 2 ranks, ",
		"# power (W)                     250.5      251.0 (rank 1)\n", "# NVLink TX (GB/s)               1.02       1.02 (rank 0); rank 1: Not Supported\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("collective table lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(out, "not a GPU's\n") {
		t.Errorf("the stand-in's line no longer closes the table:\n%s", out)
	}
	code, out, stderr = ddpbenchWithNVML(t, lib, append(collArgs, "--format", "json")...)
	var cj collectiveJSON
	if err := json.Unmarshal([]byte(out), &cj); code != 0 || err != nil || cj.GPUTelemetry == nil || len(cj.Rows) != 2 {
		t.Fatalf("collective json: status %d, %v: %s\n%s", code, err, stderr, out)
	}
	if p := cj.GPUTelemetry.Figures["power_w"]; p == nil || p.Peak != 251 {
		t.Errorf("collective json: power %+v", p)
	}
	rowSamples := 0
	for _, r := range cj.Rows {
		if r.GPUTelemetry != nil {
			rowSamples += r.GPUTelemetry.Samples
		}
	}
	if rowSamples > cj.GPUTelemetry.Samples || cj.GPUTelemetry.Samples < 1 {
		t.Errorf("collective json: %d samples over the sweep, %d in its rows", cj.GPUTelemetry.Samples, rowSamples)
	}
	code, out, stderr = ddpbenchWithNVML(t, lib, append(collArgs, "--format", "csv")...)
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if code != 0 || err != nil || len(recs) != 3 || recs[0][len(recs[0])-1] != "stand_in" {
		t.Fatalf("collective csv: status %d, %v: %s\n%s", code, err, stderr, out)
	}
}

// csvRow parses a CSV output of one header and one row into a map.
func csvRow(t *testing.T, code int, out, stderr string) map[string]string {
	t.Helper()
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if code != 0 || err != nil || len(recs) != 2 {
		t.Fatalf("csv: status %d, %v: %s\n%s", code, err, stderr, out)
	}
	row := map[string]string{}
	for i, k := range recs[0] {
		row[k] = recs[1][i]
	}
	return row
}

// TestTelemetryAbsent: without NVML, or with an NVML that lacks a function
// the telemetry calls, run and collective on the nccl backend print what
// they printed before and say once, on standard error, why there is no
// telemetry; --telemetry-interval 0 says nothing.
func TestTelemetryAbsent(t *testing.T) {
	standIn(t)
	model := writeFile(t, "tiny.json", `{"model":"tiny","params":[{"name":"a","shape":[300,256]}]}`)
	runArgs := []string{"run", "--backend", "nccl", "--ranks", "2", "--model", model, "--steps", "2", "--warmup", "1", "--compute", "none"}
	collArgs := []string{"collective", "--backend", "nccl", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1"}
	missing := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	for _, c := range []struct {
		lib, why string
	}{
		{missing, "no GPU telemetry: " + missing + " not loadable"},
		{buildFakeNVML(t, "-DINIT_RESULT=0", "-DNO_FIELD_VALUES"), "has no nvmlDeviceGetFieldValues"},
		{buildFakeNVML(t, "-DINIT_RESULT=12"), "no GPU telemetry: nvmlInit: Fake library not found (12)"},
	} {
		for _, args := range [][]string{runArgs, collArgs, append(runArgs, "--format", "json"), append(collArgs, "--format", "json")} {
			code, out, stderr := ddpbenchWithNVML(t, c.lib, args...)
			if code != 0 || strings.Count(stderr, "no GPU telemetry") != 1 || !strings.Contains(stderr, c.why) {
				t.Errorf("%v with %s: status %d, stderr %q; want 0 and one line saying %q", args, c.lib, code, stderr, c.why)
			}
			if strings.Contains(out, "telemetry") {
				t.Errorf("%v with %s: the output mentions telemetry:\n%s", args, c.lib, out)
			}
		}
	}
	code, _, stderr := ddpbenchWithNVML(t, missing, append(runArgs, "--telemetry-interval", "0")...)
	if code != 0 || strings.Contains(stderr, "telemetry") {
		t.Errorf("--telemetry-interval 0: status %d, stderr %q; want 0 and no word on telemetry", code, stderr)
	}
}
