package ddp

import (
	"context"
	"slices"
	"testing"

	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestPyTorchRebuild: a Reducer whose gradients become ready in the order
// PyTorch's DDP saw for ResNet-50 rebuilds the buckets PyTorch rebuilt
// (testdata/pytorch), parameter for parameter, for the default caps and
// for caps of 1 and 100 MiB.
func TestPyTorchRebuild(t *testing.T) {
	testutil.NoLeak(t)
	oracle := testutil.ReadPyTorchBuckets(t)
	params := loadManifest(t, "resnet50")
	for _, key := range []string{"default", "cap1", "cap100"} {
		t.Run(key, func(t *testing.T) {
			c, ok := oracle.Models["resnet50"][key]
			if !ok || !c.Rebuilt {
				t.Fatalf("no rebuilt layout for resnet50/%s in the oracle", key)
			}
			o := Options{NoZeroGrad: true}
			if c.DDPArgs.BucketCapMB != 0 {
				o.BucketCap = int(c.DDPArgs.BucketCapMB * (1 << 20))
			}
			r, err := New(context.Background(), commtest.Solo{}, params, o)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			for range 2 { // the second Begin adopts the layout rebuilt after the first step
				if err := r.Begin(Sync); err != nil {
					t.Fatal(err)
				}
				for _, i := range c.ReadyOrder {
					if err := r.Ready(i); err != nil {
						t.Fatal(err)
					}
				}
				if err := r.Wait(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			bs := r.Buckets()
			if len(bs) != len(c.RebuiltBucketSizes) {
				t.Fatalf("%d buckets, PyTorch rebuilt %d", len(bs), len(c.RebuiltBucketSizes))
			}
			for k, b := range bs {
				if b.Bytes != c.RebuiltBucketSizes[k] || !slices.Equal(b.Params, c.RebuiltBucketParams[k]) {
					t.Errorf("bucket %d: %d bytes, parameters %v; PyTorch's %d bytes, %v", k, b.Bytes, b.Params, c.RebuiltBucketSizes[k], c.RebuiltBucketParams[k])
				}
			}
		})
	}
}
