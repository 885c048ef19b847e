//go:build !cgo || !linux

package main

// probeGPUs reports that NVML is unavailable: go-nvml needs cgo.
func probeGPUs() gpuInfo {
	return gpuInfo{Err: "no NVIDIA driver found (this ddpbench was built without cgo, which NVML needs)"}
}
