package fp16

import (
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ddpgo/ddpgo/internal/invariants"
)

// TestExhaustiveFloat32 converts every float32 to binary16 and to bfloat16 with
// every implementation and compares each result with the scalar reference
// (FromFloat32, BFloat16FromFloat32). The portable bulk kernels use
// different code from the scalar ones (a float addition for half
// subnormals, a rounding bias for bfloat16), so the comparison checks both.
// Chunks are spread over GOMAXPROCS goroutines. Under the race detector
// only every 64th chunk is walked (still every exponent and every tail).
func TestExhaustiveFloat32(t *testing.T) {
	if testing.Short() {
		t.Skip("walks all 2^32 float32 values")
	}
	const chunk = 1 << 16
	const chunks = 1 << 32 / chunk
	stride := int64(1)
	if invariants.RaceEnabled {
		stride = 64
	}
	ks := availableKernels()
	var next atomic.Int64
	var failures atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := make([]float32, chunk)
			half := make([][]uint16, len(ks))
			bf16 := make([][]uint16, len(ks))
			for i := range ks {
				half[i] = make([]uint16, chunk)
				bf16[i] = make([]uint16, chunk)
			}
			for {
				c := (next.Add(1) - 1) * stride
				if c >= chunks || failures.Load() > 10 {
					return
				}
				base := uint32(c) * chunk
				for i := range src {
					src[i] = math.Float32frombits(base + uint32(i))
				}
				for i, k := range ks {
					k.f32ToHalf(half[i], src)
					k.f32ToBF16(bf16[i], src)
				}
				// The portable kernels (last in ks) against the scalar
				// reference, element by element; every other kernel
				// against the portable one, by a fast comparison.
				g := len(ks) - 1
				for i, f := range src {
					if want := FromFloat32(f); half[g][i] != want {
						failures.Add(1)
						t.Errorf("%s: half(%#08x) = %#04x, want %#04x", ks[g].name, math.Float32bits(f), half[g][i], want)
					}
					if want := BFloat16FromFloat32(f); bf16[g][i] != want {
						failures.Add(1)
						t.Errorf("%s: bf16(%#08x) = %#04x, want %#04x", ks[g].name, math.Float32bits(f), bf16[g][i], want)
					}
				}
				for j := range g {
					for _, c := range []struct {
						name      string
						got, want []uint16
						ref       func(float32) uint16
					}{
						{"half", half[j], half[g], FromFloat32},
						{"bf16", bf16[j], bf16[g], BFloat16FromFloat32},
					} {
						if slices.Equal(c.got, c.want) {
							continue
						}
						for i, f := range src {
							if c.got[i] != c.ref(f) {
								failures.Add(1)
								t.Errorf("%s: %s(%#08x) = %#04x, want %#04x", ks[j].name, c.name, math.Float32bits(f), c.got[i], c.ref(f))
								break
							}
						}
					}
				}
			}
		}()
	}
	wg.Wait()
}
