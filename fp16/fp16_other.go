//go:build purego || !amd64

package fp16

var bestKernels = genericKernels

// cpuFeatures is empty: no SIMD implementation is built.
const cpuFeatures = ""

// availableKernels lists every implementation usable on this machine.
func availableKernels() []*kernels { return []*kernels{&genericKernels} }
