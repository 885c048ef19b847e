package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/mpi"
)

// TestMessages checks what the command prints: errors carry the program
// name once (main adds it), one rank is "1 rank", and -stats says whether
// overlap can show on this many cores.
func TestMessages(t *testing.T) {
	cfg := defaultConfig()
	cfg.Ranks = 0
	err := run(&bytes.Buffer{}, cfg)
	if err == nil || strings.Contains(err.Error(), "digits:") || !strings.HasPrefix(err.Error(), "invalid configuration: -ranks 0") {
		t.Errorf("error %q: want it without the program name, which main prefixes", err)
	}

	cfg = defaultConfig()
	cfg.Ranks, cfg.Epochs, cfg.Stats = 1, 1, true
	var out bytes.Buffer
	if err := run(&out, cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), " examples, 1 rank, batch") || strings.Contains(out.String(), "1 ranks") {
		t.Errorf("output:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "\nnote: 1 rank on ") {
		t.Errorf("-stats printed no note on overlap:\n%s", out.String())
	}
	if n := overlapNote(4, 2); !strings.Contains(n, "4 ranks compute backward on 2 cores") || !strings.Contains(n, "little or none") {
		t.Errorf("overlapNote(4, 2) = %q", n)
	}
	if n := overlapNote(1, 1); !strings.Contains(n, "1 rank computes backward on 1 cores") {
		t.Errorf("overlapNote(1, 1) = %q", n)
	}
	if n := overlapNote(2, 16); !strings.Contains(n, "a core is free") {
		t.Errorf("overlapNote(2, 16) = %q", n)
	}
}

// TestTraceMetadata checks that the trace's own step count agrees with
// the steps it says it holds.
func TestTraceMetadata(t *testing.T) {
	cfg := defaultConfig()
	cfg.Epochs, cfg.Ranks = 1, 2
	cfg.Trace = filepath.Join(t.TempDir(), "trace.json")
	if err := run(&bytes.Buffer{}, cfg); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(cfg.Trace)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OtherData map[string]string `json:"otherData"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OtherData["steps"] != "2..4" || doc.OtherData["trace_steps"] != "3" {
		t.Errorf("otherData %v: want steps 2..4 and trace_steps 3", doc.OtherData)
	}

	cfg.Trace = filepath.Join(t.TempDir(), "missing", "trace.json")
	if err := run(&bytes.Buffer{}, cfg); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a trace in a missing directory: %v", err)
	}
}

// TestMPINotBuilt checks that -backend mpi in a binary built without the
// mpi tag says how to build this one, and that an unknown -backend is
// refused by name.
func TestMPINotBuilt(t *testing.T) {
	cfg := defaultConfig()
	cfg.Epochs = 1
	cfg.Backend = "nccl"
	if err := run(&bytes.Buffer{}, cfg); !errors.Is(err, errConfig) || !strings.Contains(err.Error(), `-backend "nccl"`) {
		t.Errorf("-backend nccl: %v, want errConfig naming it", err)
	}
	if mpi.LibraryInfo().Built {
		t.Skip("built with the mpi tag: TestMPIMatchesInproc runs -backend mpi under mpirun (MPI, once finalized, cannot start again in this process)")
	}
	cfg.Backend = "mpi"
	err := run(&bytes.Buffer{}, cfg)
	if !errors.Is(err, mpi.ErrNotBuilt) || !strings.Contains(err.Error(), "go build -tags mpi ./examples/digits") {
		t.Errorf("-backend mpi without the tag: %v, want ErrNotBuilt and the build command", err)
	}
}
