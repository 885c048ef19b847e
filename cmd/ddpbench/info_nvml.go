//go:build cgo && linux

package main

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlLibrary is the NVML library probeGPUs opens: the driver's, unless a
// test points it at a stand-in.
var nvmlLibrary = "libnvidia-ml.so.1"

// nvmlSymbols are the functions probeGPUs calls. go-nvml binds them
// lazily, so a missing one would end the process at its first call: each
// is looked up first.
var nvmlSymbols = []string{"nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion",
	"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo"}

// probeGPUs asks NVML, through go-nvml, for the driver and devices. When
// the library cannot be loaded, lacks a function or fails to initialise,
// it reports why and calls nothing else of NVML. nvml.Init returns
// ERROR_LIBRARY_NOT_FOUND without the loader's message, so the library is
// first opened directly to get dlerror's text; a panic inside the binding
// is turned into an error.
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
	for _, s := range nvmlSymbols {
		if lib.Lookup(s) != nil {
			return gpuInfo{Err: fmt.Sprintf("no NVIDIA driver found (%s has no %s: a driver older than NVML 5.319?)", nvmlLibrary, s)}
		}
	}
	n := nvml.New(nvml.WithLibraryPath(nvmlLibrary))
	errorf := func(call string, r nvml.Return) string {
		return fmt.Sprintf("%s: %s (%d)", call, n.ErrorString(r), int32(r))
	}
	if ret := n.Init(); ret != nvml.SUCCESS {
		return gpuInfo{Err: "no NVIDIA driver found (" + errorf("nvmlInit", ret) + ")"}
	}
	defer n.Shutdown()
	driver, ret := n.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = "unknown: " + errorf("nvmlSystemGetDriverVersion", ret)
	}
	g.Driver = driver
	count, ret := n.DeviceGetCount()
	if ret != nvml.SUCCESS {
		g.Err = fmt.Sprintf("NVIDIA driver %s, but %s", driver, errorf("nvmlDeviceGetCount", ret))
		return g
	}
	for i := range count {
		d, ret := n.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			g.Devices = append(g.Devices, fmt.Sprintf("%d: unavailable (%s)", i, errorf("nvmlDeviceGetHandleByIndex", ret)))
			continue
		}
		line := fmt.Sprintf("%d: ", i)
		if name, ret := d.GetName(); ret == nvml.SUCCESS {
			line += name
		} else {
			line += "name unknown (" + errorf("nvmlDeviceGetName", ret) + ")"
		}
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			line += fmt.Sprintf(", %d MiB", mem.Total>>20)
		}
		g.Devices = append(g.Devices, line)
	}
	return g
}
