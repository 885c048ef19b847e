package fp16_test

import (
	"fmt"

	"github.com/ddpgo/ddpgo/fp16"
)

// Compress a gradient for an fp16 all-reduce: scale by 1/ranks in float32,
// round once to half precision, sum the ranks' halves, widen the result.
func Example() {
	grads := [][]float32{{1, 2, 3, 65504}, {3, 2, 1, 65504}}
	halves := make([][]uint16, len(grads))
	for r, g := range grads {
		halves[r] = make([]uint16, len(g))
		fp16.ScaleToHalf(halves[r], g, 1/float32(len(grads)))
	}
	sum := make([]uint16, len(grads[0]))
	fp16.SumHalf(sum, halves)
	avg := make([]float32, len(sum))
	fp16.HalfToFloat32(avg, sum)
	fmt.Println(avg)
	// Output: [2 2 2 65504]
}

func ExampleFromFloat32() {
	for _, f := range []float32{1, 0.1, 65504, 65520, 1e-8} {
		h := fp16.FromFloat32(f)
		fmt.Printf("%g -> %#04x -> %g\n", f, h, fp16.ToFloat32(h))
	}
	// Output:
	// 1 -> 0x3c00 -> 1
	// 0.1 -> 0x2e66 -> 0.099975586
	// 65504 -> 0x7bff -> 65504
	// 65520 -> 0x7c00 -> +Inf
	// 1e-08 -> 0x0000 -> 0
}

func ExampleBFloat16FromFloat32() {
	b := fp16.BFloat16FromFloat32(3.14159)
	fmt.Printf("%#04x -> %g\n", b, fp16.BFloat16ToFloat32Scalar(b))
	// Output: 0x4049 -> 3.140625
}

func ExampleSumScaledBFloat16() {
	a := []uint16{fp16.BFloat16FromFloat32(1), fp16.BFloat16FromFloat32(10)}
	b := []uint16{fp16.BFloat16FromFloat32(3), fp16.BFloat16FromFloat32(-4)}
	fp16.SumScaledBFloat16(a, [][]uint16{a, b}, 0.5) // the average, in place
	out := make([]float32, len(a))
	fp16.BFloat16ToFloat32(out, a)
	fmt.Println(out)
	// Output: [2 3]
}
