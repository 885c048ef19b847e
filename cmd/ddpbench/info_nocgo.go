//go:build !cgo || !linux

package main

// probeGPUs reports that NVML is unavailable: opening libnvidia-ml at run
// time takes cgo (dlopen), and this ddpbench was built without it.
func probeGPUs() gpuInfo {
	return gpuInfo{Err: "no NVIDIA driver found (this ddpbench was built without cgo, which opening NVML needs; rebuild with CGO_ENABLED=1 and a C compiler)"}
}
