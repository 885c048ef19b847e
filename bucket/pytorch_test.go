package bucket

import (
	"math"
	"slices"
	"testing"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestPyTorchLayouts compares Assign and Rebuild with what PyTorch's DDP
// reducer did with the same models (testdata/pytorch): its initial
// buckets, one of every gradient unless find_unused_parameters asks for
// the caps from the start, and the buckets it rebuilt from the ready
// order of the first iteration, parameter for parameter.
func TestPyTorchLayouts(t *testing.T) {
	oracle := testutil.ReadPyTorchBuckets(t)
	for name, cases := range oracle.Models {
		_, ts := loadModel(t, name)
		for key, c := range cases {
			t.Run(name+"/"+key, func(t *testing.T) {
				capBytes := defaultBucketCap
				if c.DDPArgs.BucketCapMB != 0 {
					capBytes = int(c.DDPArgs.BucketCapMB * mib)
				}
				limits := []int{math.MaxInt64}
				if c.DDPArgs.FindUnused {
					limits = []int{defaultFirstBucketBytes, capBytes}
				}
				initial, err := Assign(ts, limits, nil)
				if err != nil {
					t.Fatal(err)
				}
				// DDP reverses its list of initial buckets, so that the
				// last parameters' bucket, ready first, comes first.
				slices.Reverse(initial)
				if got := sizes(initial); !slices.Equal(got, c.InitialBucketSizes) {
					t.Errorf("initial bucket sizes %v, PyTorch's %v", got, c.InitialBucketSizes)
				}
				if !c.Rebuilt {
					return
				}
				rebuilt, err := Rebuild(ts, c.ReadyOrder, defaultFirstBucketBytes, capBytes)
				if err != nil {
					t.Fatal(err)
				}
				if got := sizes(rebuilt); !slices.Equal(got, c.RebuiltBucketSizes) {
					t.Errorf("rebuilt bucket sizes %v, PyTorch's %v", got, c.RebuiltBucketSizes)
				}
				for k, b := range rebuilt {
					if k < len(c.RebuiltBucketParams) && !slices.Equal(b.Tensors, c.RebuiltBucketParams[k]) {
						t.Errorf("rebuilt bucket %d holds parameters %v, PyTorch's %v", k, b.Tensors, c.RebuiltBucketParams[k])
					}
				}
			})
		}
	}
}

func sizes(bs []Bucket) []int {
	out := make([]int, len(bs))
	for i, b := range bs {
		out[i] = b.Bytes
	}
	return out
}
