//go:build cgo && linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeNVML is a stand-in for libnvidia-ml with the signatures of nvml.h:
// two devices whose names, memory and telemetry depend on the handle NVML
// gave out, so that a handle passed wrongly shows in the output. The
// telemetry (see TestTelemetryFake): utilisation alternates 40 and 90
// percent, plus the device's index; memory used is 1 GiB per index plus
// one; power 250 W plus 1 W per index; PCIe 1,000,000 KB/s out and twice
// that in; the NVLink counters grow by 1 KiB per microsecond out and 2 in
// on device 0, and device 1 has no NVLink (NVML_ERROR_NOT_SUPPORTED).
const fakeNVML = `
#include <stdio.h>
#include <time.h>
typedef struct { void *handle; } nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
	unsigned int fieldId, scopeId;
	long long timestamp, latencyUsec;
	int valueType, nvmlReturn;
	unsigned long long value;
} nvmlFieldValue_t;
static int devs[2];
static int calls[2];
static int index_of(nvmlDevice_t d) { return (int)((int *)d.handle - devs); }
int nvmlInit_v2(void) { return INIT_RESULT; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 12 ? "Fake library not found" : r == 3 ? "Not Supported" : "Fake error"; }
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "555.42.fake"); return 0; }
int nvmlDeviceGetCount_v2(unsigned int *c) { *c = 3; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	if (i >= 2) return 2;
	d->handle = &devs[i];
	return 0;
}
int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) {
	snprintf(name, n, "Fake GPU %d", (int)((int *)d.handle - devs));
	return 0;
}
#ifndef NO_MEMORY
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	m->total = (80ULL << 30) + (unsigned long long)((int *)d.handle - devs) * (1ULL << 20);
	m->used = (unsigned long long)(index_of(d) + 1) << 30;
	m->free = m->total - m->used;
	return 0;
}
#endif
int nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int n) { snprintf(uuid, n, "GPU-fake-%d", index_of(d)); return 0; }
int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
	int i = index_of(d);
	u->gpu = (calls[i]++ % 2 ? 90 : 40) + i;
	u->memory = 0;
	return 0;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) { *mw = 250000 + 1000 * index_of(d); return 0; }
int nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs) { (void)d; *kbs = counter == 0 ? 1000000 : 2000000; return 0; }
#ifndef NO_FIELD_VALUES
int nvmlDeviceGetFieldValues(nvmlDevice_t d, int n, nvmlFieldValue_t *v) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	long long us = ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
	for (int k = 0; k < n; k++) {
		v[k].timestamp = us;
		v[k].latencyUsec = 0;
		if (index_of(d) == 1) {
			v[k].nvmlReturn = 3;
			continue;
		}
		v[k].nvmlReturn = 0;
		v[k].valueType = 3;
		v[k].value = (unsigned long long)us * (v[k].fieldId == 138 ? 1 : 2);
	}
	return 0;
}
#endif
`

// buildFakeNVML compiles fakeNVML with the given -D flags into a shared
// library and returns its path.
func buildFakeNVML(t *testing.T, defines ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build a stand-in NVML", cc)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fake.c")
	if err := os.WriteFile(src, []byte(fakeNVML), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libfake-nvml.so")
	args := append([]string{"-shared", "-fPIC", "-o", lib, src}, defines...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", cc, args, err, out)
	}
	return lib
}

// probeIn runs probeGPUs against the NVML library at path in a child
// process: go-nvml binds NVML's functions lazily, once per process, so
// each stand-in needs a process of its own.
func probeIn(t *testing.T, path string) gpuInfo {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestProbeGPUsChild$")
	cmd.Env = append(os.Environ(), "DDPBENCH_TEST_NVML="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child probing %s: %v\n%s", path, err, out)
	}
	i := bytes.Index(out, []byte("PROBE "))
	if i < 0 {
		t.Fatalf("child probing %s printed no result:\n%s", path, out)
	}
	var g gpuInfo
	if err := json.Unmarshal(bytes.SplitN(out[i+6:], []byte("\n"), 2)[0], &g); err != nil {
		t.Fatalf("child probing %s: %v\n%s", path, err, out)
	}
	return g
}

// TestProbeGPUsChild is the child of probeIn.
func TestProbeGPUsChild(t *testing.T) {
	path := os.Getenv("DDPBENCH_TEST_NVML")
	if path == "" {
		t.Skip("run by TestProbeGPUsFake")
	}
	nvmlLibrary = path
	b, err := json.Marshal(probeGPUs())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PROBE %s\n", b)
}

// TestProbeGPUsFake checks the NVML calls against a stand-in library:
// the driver, every device with its name and memory, a device whose
// handle is refused, a failed nvmlInit and a missing function.
func TestProbeGPUsFake(t *testing.T) {
	g := probeIn(t, buildFakeNVML(t, "-DINIT_RESULT=0"))
	want := []string{"0: Fake GPU 0, 81920 MiB", "1: Fake GPU 1, 81921 MiB", "2: unavailable (nvmlDeviceGetHandleByIndex: Fake error (2))"}
	if g.Err != "" || g.Driver != "555.42.fake" || strings.Join(g.Devices, "|") != strings.Join(want, "|") {
		t.Errorf("probeGPUs = %+v, want driver 555.42.fake and devices %q", g, want)
	}

	if g := probeIn(t, buildFakeNVML(t, "-DINIT_RESULT=12")); g.Err != "no NVIDIA driver found (nvmlInit: Fake library not found (12))" || len(g.Devices) != 0 {
		t.Errorf("failed init: %+v", g)
	}

	if g := probeIn(t, buildFakeNVML(t, "-DINIT_RESULT=0", "-DNO_MEMORY")); !strings.HasPrefix(g.Err, "no NVIDIA driver found (") || !strings.Contains(g.Err, "has no nvmlDeviceGetMemoryInfo") {
		t.Errorf("missing function: %+v", g)
	}

	if g := probeIn(t, filepath.Join(t.TempDir(), "libnothere.so")); !strings.Contains(g.Err, "libnothere.so not loadable: ") {
		t.Errorf("missing library: %+v", g)
	}
}
