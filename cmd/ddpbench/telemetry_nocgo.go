//go:build !cgo || !linux

package main

import "errors"

// openNVML reports that NVML is unavailable: opening libnvidia-ml at run
// time takes cgo (dlopen), and this ddpbench was built without it.
func openNVML([]int) (gpuSource, error) {
	return nil, errors.New("this ddpbench was built without cgo, which opening NVML needs (rebuild with CGO_ENABLED=1 and a C compiler)")
}
