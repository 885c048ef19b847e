package testutil

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// PyTorchBuckets is what PyTorch's DDP reducer did with each built-in
// model (package models) in each of a few configurations: the cross-package
// oracle in the repository's testdata/pytorch/ddp_buckets.json, written by
// scripts/pytorch_oracle.py from DDP's own logging data.
type PyTorchBuckets struct {
	Source string                            `json:"source"`
	Models map[string]map[string]PyTorchCase `json:"models"` // model, then configuration
}

// PyTorchCase is one model in one configuration. Gradients were made ready
// in ReadyOrder (reverse registration order); sizes are in bytes.
type PyTorchCase struct {
	DDPArgs struct {
		BucketCapMB float64 `json:"bucket_cap_mb"` // 0: DDP's default, 25
		FindUnused  bool    `json:"find_unused_parameters"`
	} `json:"ddp_args"`
	InitialBucketSizes []int `json:"initial_bucket_sizes"`
	ReadyOrder         []int `json:"ready_order"`
	// Rebuilt reports whether DDP rebuilt its buckets after the first
	// iteration; RebuiltBucketParams lists each rebuilt bucket's
	// parameters in their order inside it.
	Rebuilt             bool    `json:"rebuilt"`
	RebuiltBucketSizes  []int   `json:"rebuilt_bucket_sizes"`
	RebuiltBucketParams [][]int `json:"rebuilt_bucket_params"`
}

// ReadPyTorchBuckets reads the oracle from the repository's top-level
// testdata/.
func ReadPyTorchBuckets(t testing.TB) *PyTorchBuckets {
	t.Helper()
	path := TopLevel(t, "testdata/pytorch/ddp_buckets.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var o PyTorchBuckets
	if err := json.Unmarshal(data, &o); err != nil || len(o.Models) == 0 {
		t.Fatalf("%s: %v (or no models)", path, err)
	}
	return &o
}

// TopLevel returns the path of rel, a path from the repository's root,
// seen from the test's directory: the cross-package fixtures live in the
// top-level testdata/, and a test runs in its package's directory.
func TopLevel(t testing.TB, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, filepath.FromSlash(rel))
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the test's directory: cannot find %s", rel)
		}
		dir = parent
	}
}
