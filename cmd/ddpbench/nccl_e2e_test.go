//go:build cgo

package main

import (
	"encoding/csv"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/internal/standin"
	"github.com/ddpgo/ddpgo/nccl"
)

// standIn builds the NCCL and CUDA stand-in (nccl/testdata/standin) and
// points DDPGO_NCCL_LIBRARY and DDPGO_CUDA_LIBRARY at it for the rest of
// the test. It is not NCCL and not a GPU: these tests check that ddpbench
// drives the backend and says so, never a figure.
func standIn(t *testing.T) {
	t.Helper()
	lib, err := standin.Build(t.TempDir(), "../../nccl/testdata/standin/standin.c")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(nccl.EnvNCCL, lib.NCCL)
	t.Setenv(nccl.EnvCUDA, lib.CUDA)
	// In-process ranks: no launcher's variables.
	for _, k := range []string{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

const standInMark = "STAND-IN: ddpgo's test stand-in"

// standInNCCL is the NCCL the stand-in claims to be: 2.26 by default,
// 2.21 under DDPGO_STANDIN_NCCL=2.21 (see nccl/testdata/standin).
var standInNCCL = func() string {
	if os.Getenv("DDPGO_STANDIN_NCCL") == "2.21" {
		return "NCCL 2.21.5"
	}
	return "NCCL 2.26.6"
}()

// TestNCCLCollective runs `ddpbench collective --backend nccl` over the
// stand-in, two ranks in this process on devices 0 and 1: every output
// names the backend, the library and the stand-in, and every checked
// element is right.
func TestNCCLCollective(t *testing.T) {
	standIn(t)
	code, out, stderr := run(t, "collective", "--backend", "nccl", "-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1")
	if code != 0 {
		t.Fatalf("status %d: %s\n%s", code, stderr, out)
	}
	for _, want := range []string{"# Collective test: all_reduce, backend nccl", "# Library: " + standInNCCL + " (", "libnccl.so.2), CUDA driver API 12.6",
		"buffers in device memory", "# " + standInMark, "not NCCL's and not a GPU's", "nRanks 2 ",
		"#  Rank  1 Group  0 Pid", "device  1 [stand-in device 1 (not a GPU)] nccl", "# Out of bounds values : 0 OK"} {
		if !strings.Contains(out, want) {
			t.Errorf("collective table lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, standInMark) != 2 || !strings.HasSuffix(out, "not a GPU's\n") {
		t.Errorf("the stand-in is not named at the head and at the foot of the table:\n%s", out)
	}

	for _, op := range []string{"allgather", "reducescatter", "broadcast", "sendrecv"} {
		code, out, stderr = run(t, "collective", "--backend", "nccl", "--ranks", "3", "--collective", op, "-d", "bfloat16", "-b", "1K", "-e", "16K",
			"-f", "4", "-n", "2", "-w", "1", "--format", "json")
		var j collectiveJSON
		if err := json.Unmarshal([]byte(out), &j); code != 0 || err != nil {
			t.Fatalf("%s json: status %d, %v: %s\n%s", op, code, err, stderr, out)
		}
		if j.Backend != "nccl" || !strings.Contains(j.StandIn, "stand-in") || !strings.Contains(j.Library, standInNCCL) || !j.DeviceMemory ||
			j.Ranks != 3 || j.Wrong != 0 || len(j.Rows) != 3 || j.Rows[0].OutOfPlace.Wrong == nil {
			t.Errorf("%s json: %+v", op, j)
		}
	}

	code, out, stderr = run(t, "collective", "--backend", "nccl", "-b", "4K", "-e", "4K", "-n", "2", "-w", "0", "--format", "csv")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if code != 0 || err != nil || len(recs) != 2 {
		t.Fatalf("csv: status %d, %v: %s\n%s", code, err, stderr, out)
	}
	row := map[string]string{}
	for i, k := range recs[0] {
		row[k] = recs[1][i]
	}
	if row["backend"] != "nccl" || !strings.Contains(row["stand_in"], "stand-in") || !strings.Contains(row["library"], "libnccl.so.2") || row["oop_wrong"] != "0" {
		t.Errorf("csv row %v", row)
	}
}

// TestNCCLRun runs `ddpbench run --backend nccl --ranks 2` over the
// stand-in: gradients in each rank's device pool, written and checked
// through the kernels (bench.Run verifies every step's average, so a
// status of 0 means they were right), and the outputs name the stand-in.
func TestNCCLRun(t *testing.T) {
	standIn(t)
	model := writeFile(t, "tiny.json", `{"model":"tiny","params":[{"name":"a","shape":[300,256]},{"name":"b","shape":[256]},{"name":"c","shape":[10,256]}]}`)
	args := []string{"run", "--backend", "nccl", "--ranks", "2", "--model", model, "--bucket-cap-mb", "0.25", "--first-bucket-mb", "0.1",
		"--steps", "3", "--warmup", "1", "--compute", "none"}
	code, out, stderr := run(t, args...)
	if code != 0 {
		t.Fatalf("status %d: %s\n%s", code, stderr, out)
	}
	for _, want := range []string{standInMark, "2 ranks, nccl (one GPU per rank", "library: " + standInNCCL + " (", "gradients in device memory", "3 steps measured",
		"NCCL launches of this process, warmup included: "} {
		if !strings.Contains(out, want) {
			t.Errorf("run table lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasPrefix(out, standInMark) {
		t.Errorf("the run table does not open with the stand-in's line:\n%s", out)
	}

	for _, compression := range []string{"none", "fp16"} {
		code, out, stderr = run(t, append(args, "--compression", compression, "--format", "json")...)
		var j runJSON
		if err := json.Unmarshal([]byte(out), &j); code != 0 || err != nil {
			t.Fatalf("%s json: status %d, %v: %s\n%s", compression, code, err, stderr, out)
		}
		if j.Backend != "nccl" || !strings.Contains(j.StandIn, "stand-in") || !strings.Contains(j.Library, standInNCCL) || j.Ranks != 2 || j.Steps != 3 {
			t.Errorf("%s json: %+v", compression, j)
		}
		// As 2.26, the stand-in answers ncclInProgress to every launch of
		// a non-blocking communicator; as 2.21, to none.
		l, as221 := j.NCCLLaunches, standInNCCL == "NCCL 2.21.5"
		if l == nil || l.Launches == 0 || as221 && l.InProgress != 0 || !as221 && l.InProgress != l.Launches {
			t.Errorf("%s json: nccl_launches %+v; want launches, every one answering ncclInProgress (none as 2.21)", compression, l)
		}
	}

	code, out, stderr = run(t, append(args, "--format", "csv")...)
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if code != 0 || err != nil || len(recs) != 2 || recs[0][len(recs[0])-1] != "stand_in" || !strings.Contains(recs[1][len(recs[1])-1], "stand-in") {
		t.Errorf("csv: status %d, %v: %s\n%s", code, err, stderr, out)
	}

	// The sweep's table carries the same lines.
	code, out, stderr = run(t, "sweep", "--backend", "nccl", "--ranks", "2", "--model", model, "--caps", "0.25,0.5", "--first-bucket-mb", "0.1",
		"--steps", "2", "--warmup", "1", "--compute", "none")
	if code != 0 || !strings.HasPrefix(out, standInMark) || !strings.Contains(out, "library: "+standInNCCL+" (") {
		t.Errorf("sweep: status %d, %s; want a table opening with the stand-in's line and naming the library:\n%s", code, stderr, out)
	}

	code, _, stderr = run(t, append(args, "--grad-as-bucket-view=false")...)
	if code != 2 || !strings.Contains(stderr, "device memory") {
		t.Errorf("--grad-as-bucket-view=false with nccl: status %d, %s; want 2 saying the gradients are in device memory", code, stderr)
	}
}

// TestNCCLMissing: without NCCL, --backend nccl fails at once saying what
// to install and which variable points at it; info says it is not usable.
func TestNCCLMissing(t *testing.T) {
	standIn(t)
	t.Setenv(nccl.EnvNCCL, "/nonexistent/lib/libnccl.so.2")
	code, _, stderr := run(t, "collective", "--backend", "nccl")
	for _, want := range []string{"--backend nccl", "/nonexistent/lib/libnccl.so.2", "install NCCL 2.14.0 or newer", "nvidia-nccl-cu12", nccl.EnvNCCL} {
		if code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("collective without NCCL: status %d, %q; want 1 saying %q", code, stderr, want)
		}
	}
	code, out, _ := run(t, "info")
	if code != 0 || !strings.Contains(out, "not usable: nccl: cannot load /nonexistent/lib/libnccl.so.2") {
		t.Errorf("info without NCCL: status %d\n%s", code, out)
	}
}

// TestNCCLInfo: over the stand-in, info says nccl is usable only as the
// stand-in.
func TestNCCLInfo(t *testing.T) {
	standIn(t)
	code, out, _ := run(t, "info")
	if code != 0 || !strings.Contains(out, "usable, but over the test STAND-IN (") || !strings.Contains(out, "4 device(s)") {
		t.Errorf("info over the stand-in: status %d\n%s", code, out)
	}
}
