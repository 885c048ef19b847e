//go:build cgo && linux

package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// telemetrySymbols are the NVML functions the telemetry calls, each
// looked up before the first call (go-nvml binds them lazily, and a
// missing one would end the process).
var telemetrySymbols = []string{"nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlDeviceGetCount_v2",
	"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
	"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetFieldValues"}

// nvmlSource reads GPUs through go-nvml.
type nvmlSource struct {
	lib  *dl.DynamicLibrary
	n    nvml.Interface
	devs []nvml.Device
}

// openNVML opens NVML (nvmlLibrary) and finds the GPU of each CUDA device
// ordinal (see cudaToNVML).
func openNVML(ordinals []int) (src gpuSource, err error) {
	defer func() {
		if r := recover(); r != nil {
			src, err = nil, fmt.Errorf("NVML failed: %v", r)
		}
	}()
	lib := dl.New(nvmlLibrary, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := lib.Open(); err != nil {
		return nil, fmt.Errorf("%s not loadable (NVIDIA's driver installs it): %v", nvmlLibrary, err)
	}
	for _, s := range telemetrySymbols {
		if lib.Lookup(s) != nil {
			lib.Close()
			return nil, fmt.Errorf("%s has no %s (a driver older than the telemetry needs)", nvmlLibrary, s)
		}
	}
	n := nvml.New(nvml.WithLibraryPath(nvmlLibrary))
	if ret := n.Init(); ret != nvml.SUCCESS {
		lib.Close()
		return nil, fmt.Errorf("nvmlInit: %s (%d)", n.ErrorString(ret), int32(ret))
	}
	s := &nvmlSource{lib: lib, n: n}
	fail := func(err error) (gpuSource, error) {
		s.close()
		return nil, err
	}
	count, ret := n.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fail(s.errorf("nvmlDeviceGetCount", ret))
	}
	all := make([]nvml.Device, count)
	uuids := make([]string, count)
	for i := range count {
		if all[i], ret = n.DeviceGetHandleByIndex(i); ret != nvml.SUCCESS {
			continue // an unusable GPU is an error only if a rank is on it
		}
		uuids[i], _ = all[i].GetUUID()
	}
	visible := os.Getenv("CUDA_VISIBLE_DEVICES")
	for _, o := range ordinals {
		idx, err := cudaToNVML(o, visible, uuids)
		if err != nil {
			return fail(err)
		}
		if all[idx] == nil {
			_, ret := n.DeviceGetHandleByIndex(idx)
			return fail(fmt.Errorf("CUDA device %d, NVML's %d: %w", o, idx, s.errorf("nvmlDeviceGetHandleByIndex", ret)))
		}
		s.devs = append(s.devs, all[idx])
	}
	return s, nil
}

func (s *nvmlSource) errorf(call string, ret nvml.Return) error {
	return errors.New(call + ": " + s.n.ErrorString(ret))
}

// nvlinkAll is the scope id that sums an NVLink counter over every link.
const nvlinkAll = math.MaxUint32

func (s *nvmlSource) read(i int) gpuRaw {
	d := s.devs[i]
	var r gpuRaw
	for f := range r.vals {
		r.vals[f] = math.NaN()
	}
	set := func(f int, v float64, ret nvml.Return) {
		if ret == nvml.SUCCESS {
			r.vals[f] = v
		} else {
			r.why[f] = s.n.ErrorString(ret)
		}
	}
	u, ret := d.GetUtilizationRates()
	set(figUtil, float64(u.Gpu), ret)
	m, ret := d.GetMemoryInfo()
	set(figMem, float64(m.Used), ret)
	p, ret := d.GetPowerUsage() // milliwatts
	set(figPower, float64(p)/1e3, ret)
	// NVML gives PCIe throughput in KB/s over its last 20 ms; KB is taken
	// as 1024 bytes, as NVML's NVLink counters count KiB.
	tx, ret := d.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES)
	set(figPCIeTx, float64(tx)*1024, ret)
	rx, ret := d.GetPcieThroughput(nvml.PCIE_UTIL_RX_BYTES)
	set(figPCIeRx, float64(rx)*1024, ret)

	r.nvTx, r.nvRx = math.NaN(), math.NaN()
	fv := []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: nvlinkAll},
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: nvlinkAll},
	}
	if ret := d.GetFieldValues(fv); ret != nvml.SUCCESS {
		r.why[figNVLinkTx], r.why[figNVLinkRx] = s.n.ErrorString(ret), s.n.ErrorString(ret)
		return r
	}
	kib := func(v nvml.FieldValue, f int) float64 {
		if ret := nvml.Return(v.NvmlReturn); ret != nvml.SUCCESS {
			r.why[f] = s.n.ErrorString(ret)
			return math.NaN()
		}
		switch nvml.ValueType(v.ValueType) {
		case nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG:
			return float64(binary.LittleEndian.Uint64(v.Value[:])) * 1024
		case nvml.VALUE_TYPE_UNSIGNED_INT:
			return float64(binary.LittleEndian.Uint32(v.Value[:])) * 1024
		}
		r.why[f] = fmt.Sprintf("NVML value type %d", v.ValueType)
		return math.NaN()
	}
	r.nvTx, r.nvRx = kib(fv[0], figNVLinkTx), kib(fv[1], figNVLinkRx)
	r.nvAt = max(fv[0].Timestamp, fv[1].Timestamp)
	return r
}

func (s *nvmlSource) close() {
	s.n.Shutdown()
	s.lib.Close()
}
