//go:build cgo && linux

package main

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

const nvmlLibrary = "libnvidia-ml.so.1"

// probeGPUs asks NVML for the driver and devices. When the library cannot
// be loaded or Init fails, it reports why and calls nothing else of NVML.
// nvml.Init returns ERROR_LIBRARY_NOT_FOUND without the loader's message,
// so the library is first opened directly to get dlerror's text; a panic
// inside the binding (older versions had some) is turned into an error.
func probeGPUs() (g gpuInfo) {
	defer func() {
		if r := recover(); r != nil {
			g = gpuInfo{Err: fmt.Sprintf("no NVIDIA driver found (NVML failed: %v)", r)}
		}
	}()
	lib := dl.New(nvmlLibrary, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := lib.Open(); err != nil {
		return gpuInfo{Err: fmt.Sprintf("no NVIDIA driver found (%s not loadable: %v)", nvmlLibrary, err)}
	}
	defer lib.Close()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return gpuInfo{Err: fmt.Sprintf("no NVIDIA driver found (nvmlInit: %v)", ret)}
	}
	defer nvml.Shutdown()
	driver, ret := nvml.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = "unknown: " + ret.Error()
	}
	g.Driver = driver
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		g.Err = fmt.Sprintf("NVIDIA driver %s, but nvmlDeviceGetCount: %v", driver, ret)
		return g
	}
	for i := range n {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			g.Devices = append(g.Devices, fmt.Sprintf("%d: unavailable (%v)", i, ret))
			continue
		}
		name, _ := d.GetName()
		line := fmt.Sprintf("%d: %s", i, name)
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			line += fmt.Sprintf(", %d MiB", mem.Total>>20)
		}
		g.Devices = append(g.Devices, line)
	}
	return g
}
