package bucket

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

func f32s(numel ...int) []Tensor {
	ts := make([]Tensor, len(numel))
	for i, n := range numel {
		ts[i] = Tensor{Numel: n, DType: comm.Float32}
	}
	return ts
}

// alternating is PyTorch's mixed test model: float 50 / double 25, six tensors.
func alternating() []Tensor {
	var ts []Tensor
	for range 3 {
		ts = append(ts, Tensor{Numel: 50, DType: comm.Float32}, Tensor{Numel: 25, DType: comm.Float64})
	}
	return ts
}

func indices(bs []Bucket) [][]int {
	out := make([][]int, len(bs))
	for k, b := range bs {
		out[k] = b.Tensors
	}
	return out
}

func limitsOf(bs []Bucket) []int {
	out := make([]int, len(bs))
	for k, b := range bs {
		out[k] = b.Limit
	}
	return out
}

func TestAssignPyTorchVectors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tensors    []Tensor
		limits     []int
		order      []int
		want       [][]int
		wantLimits []int
	}{
		{"single_limit_single_dtype", f32s(100, 200, 100, 50), []int{400}, nil,
			[][]int{{0}, {1}, {2}, {3}}, []int{400, 400, 400, 400}},
		{"single_limit_multi_dtype", alternating(), []int{400}, nil,
			[][]int{{0, 2}, {1, 3}, {4}, {5}}, []int{400, 400, 400, 400}},
		{"multi_limit_single_dtype", f32s(10, 10, 10, 10), []int{40, 80}, nil,
			[][]int{{0}, {1, 2}, {3}}, []int{40, 80, 80}},
		{"multi_limit_multi_dtype", alternating(), []int{200, 400}, nil,
			[][]int{{0}, {1}, {2, 4}, {3, 5}}, []int{200, 200, 400, 400}},
		{"tensor_indices", f32s(1, 1, 1, 1, 1), []int{4, 8}, []int{2, 0, 4, 1, 3},
			[][]int{{2}, {0, 4}, {1, 3}}, []int{4, 8, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs, err := Assign(tc.tensors, tc.limits, tc.order)
			if err != nil {
				t.Fatal(err)
			}
			if got := indices(bs); !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("buckets %v, want %v", got, tc.want)
			}
			if got := limitsOf(bs); !slices.Equal(got, tc.wantLimits) {
				t.Errorf("limits %v, want %v", got, tc.wantLimits)
			}
			if err := Validate(tc.tensors, bs); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	ok := f32s(1, 2, 3)
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"no tensors", second(Assign(nil, []int{4}, nil)), ErrTensor},
		{"negative numel", second(Assign(f32s(1, -1), []int{4}, nil)), ErrTensor},
		{"unknown dtype", second(Assign([]Tensor{{Numel: 1, DType: 99}}, []int{4}, nil)), ErrTensor},
		{"no limits", second(Assign(ok, nil, nil)), ErrLimit},
		{"zero limit", second(Assign(ok, []int{0}, nil)), ErrLimit},
		{"duplicate", second(Assign(ok, []int{4}, []int{0, 1, 1})), ErrOrder},
		{"out of range", second(Assign(ok, []int{4}, []int{0, 1, 3})), ErrOrder},
		{"short", second(Assign(ok, []int{4}, []int{2, 1})), ErrOrder},
		{"rebuild missing", second(Rebuild(ok, []int{0, 2}, 4, 8)), ErrOrder},
		{"rebuild nil order", second(Rebuild(ok, nil, 4, 8)), ErrOrder},
		{"rebuild cap", second(Rebuild(ok, []int{2, 1, 0}, 4, -1)), ErrLimit},
		{"decode empty", second(Decode(ok, nil)), ErrLayout},
		{"decode tensors", second(Decode(nil, []int64{1, 0})), ErrTensor},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// reference is compute_bucket_assignment_by_size transcribed naively: a map
// of groups, a list of results, the leftovers visited in reverse order of
// first appearance, and a sort when there is no order.
func reference(ts []Tensor, limits, order []int) (buckets [][]int, lims []int) {
	type key struct {
		dt  comm.DType
		dev int
	}
	type acc struct {
		idx         []int
		size, limit int
		li          int
	}
	accs := map[key]*acc{}
	var keys []key
	type res struct {
		idx   []int
		limit int
	}
	var out []res
	for i := range ts {
		t := i
		if len(order) != 0 {
			t = order[i]
		}
		k := key{ts[t].DType, ts[t].Device}
		a := accs[k]
		if a == nil {
			a = &acc{}
			accs[k] = a
			keys = append(keys, k)
		}
		a.idx = append(a.idx, t)
		a.size += ts[t].Bytes()
		a.limit = limits[a.li]
		if a.size >= a.limit {
			out = append(out, res{a.idx, a.limit})
			a.idx, a.size = nil, 0
			if a.li+1 < len(limits) {
				a.li++
			}
		}
	}
	for i := len(keys) - 1; i >= 0; i-- {
		if a := accs[keys[i]]; len(a.idx) > 0 {
			out = append(out, res{a.idx, a.limit})
		}
	}
	if len(order) == 0 {
		slices.SortFunc(out, func(a, b res) int { return slices.Min(a.idx) - slices.Min(b.idx) })
	}
	for _, r := range out {
		buckets = append(buckets, r.idx)
		lims = append(lims, r.limit)
	}
	return buckets, lims
}

func randomCase(r *rand.Rand) (ts []Tensor, limits, order []int) {
	n := 1 + r.IntN(40)
	ngroups := 1 + r.IntN(3)
	for range n {
		g := r.IntN(ngroups)
		ts = append(ts, Tensor{
			Numel:  r.IntN(64),
			DType:  []comm.DType{comm.Float32, comm.Float16, comm.Float64}[g%3],
			Device: g / 2,
		})
	}
	for range 1 + r.IntN(3) {
		limits = append(limits, 1+r.IntN(300))
	}
	if r.IntN(2) == 0 {
		order = r.Perm(n)
	}
	return ts, limits, order
}

func TestAssignMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		ts, limits, order := randomCase(r)
		bs, err := Assign(ts, limits, order)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if err := Validate(ts, bs); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		want, wantLimits := reference(ts, limits, order)
		if got := indices(bs); !slices.EqualFunc(got, want, slices.Equal) || !slices.Equal(limitsOf(bs), wantLimits) {
			t.Fatalf("case %d: tensors %v limits %v order %v:\n got %v %v\nwant %v %v",
				i, ts, limits, order, got, limitsOf(bs), want, wantLimits)
		}
		// Every bucket but a group's leftover reached its limit, and only
		// with its last tensor.
		for k, b := range bs {
			last := ts[b.Tensors[len(b.Tensors)-1]].Bytes()
			if b.Bytes-last >= b.Limit {
				t.Fatalf("case %d: bucket %d (%d bytes, limit %d) should have closed before its last tensor", i, k, b.Bytes, b.Limit)
			}
		}
		back, err := Decode(ts, Encode(bs))
		if err != nil || !slices.EqualFunc(indices(back), indices(bs), slices.Equal) {
			t.Fatalf("case %d: round trip: %v", i, err)
		}
	}
}

func TestRebuildIsAssignInReadyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		ts, _, _ := randomCase(r)
		ready := r.Perm(len(ts))
		first, cap := 1+r.IntN(100), 1+r.IntN(400)
		got, err := Rebuild(ts, ready, first, cap)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := reference(ts, []int{first, cap}, ready)
		if !slices.EqualFunc(indices(got), want, slices.Equal) {
			t.Fatalf("case %d: %v, want %v", i, indices(got), want)
		}
	}
}

// TestAssignDoesNotAliasInput checks that the result owns its slices.
func TestAssignDoesNotAliasInput(t *testing.T) {
	ts := f32s(1, 1, 1, 1)
	order := []int{3, 2, 1, 0}
	bs, err := Assign(ts, []int{8}, order)
	if err != nil {
		t.Fatal(err)
	}
	order[0] = 99
	if bs[0].Tensors[0] != 3 {
		t.Fatalf("bucket aliases order: %v", bs[0].Tensors)
	}
	// Appending to one bucket must not overwrite the next one.
	_ = append(bs[0].Tensors, 42)
	if bs[1].Tensors[0] != 1 {
		t.Fatalf("buckets share capacity: %v", indices(bs))
	}
}

func TestAssignAllocs(t *testing.T) {
	_, small := loadModel(t, "resnet50")
	_, large := loadModel(t, "bert-base")
	limits := []int{defaultFirstBucketBytes, defaultBucketCap}
	for _, ts := range [][]Tensor{small, large} {
		order := make([]int, len(ts))
		for i := range order {
			order[i] = len(ts) - 1 - i
		}
		for _, o := range [][]int{nil, order} {
			allocs := testing.AllocsPerRun(20, func() {
				if _, err := Assign(ts, limits, o); err != nil {
					t.Fatal(err)
				}
			})
			// groups, records, closed list, visit map, ranks, buckets,
			// and one backing array each for indices and offsets; plus
			// the permutation check when there is an order.
			if max := 9.0; allocs > max {
				t.Errorf("%d tensors: %.0f allocations per Assign, want <= %.0f", len(ts), allocs, max)
			}
		}
	}
}

func BenchmarkAssignBERT(b *testing.B) {
	_, ts := loadModel(b, "bert-base")
	ready := make([]int, len(ts))
	for i := range ready {
		ready[i] = len(ts) - 1 - i
	}
	for _, bc := range []struct {
		name  string
		order []int
	}{{"initial", nil}, {"rebuild", ready}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Assign(ts, []int{defaultFirstBucketBytes, defaultBucketCap}, bc.order); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(ts)), "ns/tensor")
		})
	}
}

func ExampleAssign() {
	tensors := []Tensor{
		{Numel: 10, DType: comm.Float32},
		{Numel: 10, DType: comm.Float32},
		{Numel: 10, DType: comm.Float32},
		{Numel: 10, DType: comm.Float32},
	}
	bs, err := Assign(tensors, []int{40, 80}, nil)
	if err != nil {
		panic(err)
	}
	for _, b := range bs {
		fmt.Println(b.Tensors, b.Offsets, b.Bytes, b.Limit)
	}
	// Output:
	// [0] [0] 40 40
	// [1 2] [0 40] 80 80
	// [3] [0] 40 80
}

func ExampleRebuild() {
	// Gradients became ready last layer first.
	tensors := []Tensor{
		{Numel: 1 << 18, DType: comm.Float32}, // 1 MiB
		{Numel: 1 << 10, DType: comm.Float32},
		{Numel: 1 << 20, DType: comm.Float32}, // 4 MiB
		{Numel: 1 << 10, DType: comm.Float32},
	}
	bs, err := Rebuild(tensors, []int{3, 2, 1, 0}, 1<<20, 25<<20)
	if err != nil {
		panic(err)
	}
	for _, b := range bs {
		fmt.Println(b.Tensors, b.Bytes, b.Limit)
	}
	// Output:
	// [3 2] 4198400 1048576
	// [1 0] 1052672 26214400
}
