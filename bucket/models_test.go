package bucket

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/models"
)

const (
	mib = 1 << 20
	// defaultFirstBucketBytes is PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES.
	defaultFirstBucketBytes = 1 * mib
	// defaultBucketCap is DDP's default bucket_cap_mb=25.
	defaultBucketCap = 25 * mib
)

// loadModel returns a built-in model manifest (package models: the
// parameters of public architectures in registration order, as
// nn.Module.named_parameters() lists them) and its parameters as tensors.
func loadModel(tb testing.TB, name string) (*models.Manifest, []Tensor) {
	tb.Helper()
	m, err := models.Builtin(name)
	if err != nil {
		tb.Fatal(err)
	}
	ts := make([]Tensor, len(m.Params))
	for i, p := range m.Params {
		ts[i] = Tensor{Numel: p.Numel(), DType: m.Elem}
	}
	return m, ts
}

// greedy is the assignment rule for one dtype on one device written out
// directly: the sizes of the buckets in visit order.
func greedy(ts []Tensor, order []int, limits []int) []int {
	var sizes []int
	size, open, li := 0, false, 0
	for _, t := range order {
		size += ts[t].Bytes()
		open = true
		if size >= limits[li] {
			sizes = append(sizes, size)
			size, open = 0, false
			li = min(li+1, len(limits)-1)
		}
	}
	if open {
		sizes = append(sizes, size)
	}
	return sizes
}

func TestModels(t *testing.T) {
	for _, tc := range []struct {
		model  string
		params int
		numel  int
		// Bucket counts for limits [1 MiB, 25 MiB]. ResNet-50: fc alone
		// passes 1 MiB, then layer4 needs two 25 MiB buckets and the rest
		// two more. BERT-base: an encoder layer is 28,351,488 bytes and
		// reaches 25 MiB only with its last tensor, so each layer is one
		// bucket, plus the pooler (first) and the embeddings (last).
		initial, rebuilt int
	}{
		{"resnet50", 161, 25_557_032, 5, 5},
		{"bert-base", 199, 109_482_240, 14, 14},
	} {
		t.Run(tc.model, func(t *testing.T) {
			m, ts := loadModel(t, tc.model)
			total := 0
			for _, tn := range ts {
				total += tn.Numel
			}
			if len(ts) != tc.params || total != tc.numel {
				t.Fatalf("%s: %d params, %d elements; want %d, %d", m.Model, len(ts), total, tc.params, tc.numel)
			}
			n := len(ts)
			registration := make([]int, n)
			for i := range registration {
				registration[i] = i
			}
			reversed := slices.Clone(registration)
			slices.Reverse(reversed)
			limits := []int{defaultFirstBucketBytes, defaultBucketCap}

			var out strings.Builder
			fmt.Fprintf(&out, "model %s: %d params, %d elements, %d bytes (%s)\n", m.Model, n, total, 4*total, m.Source)

			// DDP's constructor with find_unused_parameters=True and the
			// default cap: registration order, sorted, then the bucket list
			// reversed. No rebuild follows in that mode.
			initial, err := Assign(ts, limits, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkAgainstGreedy(t, "initial", ts, initial, registration, limits)
			if len(initial) != tc.initial {
				t.Errorf("initial: %d buckets, want %d", len(initial), tc.initial)
			}
			slices.Reverse(initial)
			writeLayout(&out, "initial, find_unused_parameters=True: registration order, limits [1 MiB, 25 MiB], bucket list reversed", m, initial)

			// DDP's constructor by default (find_unused_parameters=False):
			// limits [sys.maxsize], one bucket until the rebuild.
			one, err := Assign(ts, []int{math.MaxInt64}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(one) != 1 || one[0].Bytes != 4*total {
				t.Errorf("limits [MaxInt64]: %d buckets, want one of %d bytes", len(one), 4*total)
			}
			writeLayout(&out, "initial, default: limits [sys.maxsize]", m, one)

			// Reducer::rebuild_buckets after the first iteration, with
			// gradients ready in reverse registration order.
			rebuilt, err := Rebuild(ts, reversed, defaultFirstBucketBytes, defaultBucketCap)
			if err != nil {
				t.Fatal(err)
			}
			checkAgainstGreedy(t, "rebuild", ts, rebuilt, reversed, limits)
			if len(rebuilt) != tc.rebuilt {
				t.Errorf("rebuild: %d buckets, want %d", len(rebuilt), tc.rebuilt)
			}
			if rebuilt[0].Limit != defaultFirstBucketBytes || rebuilt[len(rebuilt)-1].Limit != defaultBucketCap {
				t.Errorf("rebuild: limits %d .. %d, want first 1 MiB, last 25 MiB", rebuilt[0].Limit, rebuilt[len(rebuilt)-1].Limit)
			}
			writeLayout(&out, "rebuild: reverse registration ready order, limits [1 MiB, 25 MiB]", m, rebuilt)

			checkGolden(t, filepath.Join("testdata", tc.model+".golden"), out.String())
		})
	}
}

// checkAgainstGreedy compares a single-dtype layout with the direct rule:
// same bucket sizes, each bucket a run of consecutive visits.
func checkAgainstGreedy(t *testing.T, what string, ts []Tensor, bs []Bucket, order, limits []int) {
	t.Helper()
	if err := Validate(ts, bs); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	want := greedy(ts, order, limits)
	var got []int
	pos := 0
	for k, b := range bs {
		got = append(got, b.Bytes)
		for i, tn := range b.Tensors {
			if tn != order[pos] {
				t.Fatalf("%s: bucket %d tensor %d is %d, want %d (visit %d)", what, k, i, tn, order[pos], pos)
			}
			pos++
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: bucket sizes %v, want %v", what, got, want)
	}
}

func writeLayout(w *strings.Builder, title string, m *models.Manifest, bs []Bucket) {
	fmt.Fprintf(w, "\n%s: %d buckets\n", title, len(bs))
	for k, b := range bs {
		first, last := m.Params[b.Tensors[0]].Name, m.Params[b.Tensors[len(b.Tensors)-1]].Name
		fmt.Fprintf(w, "  %2d: %3d params %10d bytes (%6.2f MiB) limit %s  %s .. %s\n",
			k, len(b.Tensors), b.Bytes, float64(b.Bytes)/mib, formatLimit(b.Limit), first, last)
	}
}

func formatLimit(l int) string {
	if l == math.MaxInt64 {
		return "max"
	}
	if l%mib == 0 {
		return fmt.Sprintf("%d MiB", l/mib)
	}
	return fmt.Sprintf("%d B", l)
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update and review the diff)\n got:\n%s\nwant:\n%s", path, got, want)
	}
}
