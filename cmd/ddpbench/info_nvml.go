//go:build cgo && linux

package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// The few NVML declarations ddpbench needs (nvml.h, NVML API version 12),
// written out so that the build needs no NVIDIA header and compiles
// nothing of NVML but these calls. The library is opened at run time.
typedef int nvmlReturn_t; // an enum: NVML_SUCCESS is 0
typedef struct { void *handle; } nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

// ddp_dlopen opens a library, or returns NULL with the loader's message
// in *err; dlerror's buffer is per thread, so it is read here, on the
// thread that failed.
static void *ddp_dlopen(const char *name, const char **err) {
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		*err = dlerror();
	}
	return h;
}

static void *ddp_dlsym(void *h, const char *name) { return dlsym(h, name); }
static void ddp_dlclose(void *h) { dlclose(h); }

static nvmlReturn_t ddp_void(void *f) { return ((nvmlReturn_t (*)(void))f)(); }
static const char *ddp_error_string(void *f, nvmlReturn_t r) { return ((const char *(*)(nvmlReturn_t))f)(r); }
static nvmlReturn_t ddp_string(void *f, char *buf, unsigned int n) {
	return ((nvmlReturn_t (*)(char *, unsigned int))f)(buf, n);
}
static nvmlReturn_t ddp_count(void *f, unsigned int *n) { return ((nvmlReturn_t (*)(unsigned int *))f)(n); }
static nvmlReturn_t ddp_handle(void *f, unsigned int i, nvmlDevice_t *d) {
	return ((nvmlReturn_t (*)(unsigned int, nvmlDevice_t *))f)(i, d);
}
static nvmlReturn_t ddp_device_string(void *f, nvmlDevice_t d, char *buf, unsigned int n) {
	return ((nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned int))f)(d, buf, n);
}
static nvmlReturn_t ddp_memory(void *f, nvmlDevice_t d, unsigned long long *total) {
	nvmlMemory_t m = {0, 0, 0};
	nvmlReturn_t r = ((nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))f)(d, &m);
	*total = m.total;
	return r;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// nvmlLibrary is the NVML library probeGPUs opens: the driver's, unless a
// test points it at a stand-in.
var nvmlLibrary = "libnvidia-ml.so.1"

// nvmlSymbols are the functions probeGPUs calls, in the order of nvml's
// fields.
var nvmlSymbols = []string{"nvmlInit_v2", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion",
	"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo"}

// nvml holds the library and its functions.
type nvml struct {
	lib                                               unsafe.Pointer
	init, shutdown, errorString, driverVersion, count unsafe.Pointer
	handleByIndex, name, memoryInfo                   unsafe.Pointer
}

// openNVML opens the library and looks up every function, or says what
// is missing.
func openNVML(path string) (*nvml, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	lib := C.ddp_dlopen(cpath, &cerr)
	if lib == nil {
		return nil, fmt.Errorf("%s not loadable: %s", path, C.GoString(cerr))
	}
	n := &nvml{lib: lib}
	dst := []*unsafe.Pointer{&n.init, &n.shutdown, &n.errorString, &n.driverVersion, &n.count, &n.handleByIndex, &n.name, &n.memoryInfo}
	for i, name := range nvmlSymbols {
		cname := C.CString(name)
		*dst[i] = C.ddp_dlsym(lib, cname)
		C.free(unsafe.Pointer(cname))
		if *dst[i] == nil {
			C.ddp_dlclose(lib)
			return nil, fmt.Errorf("%s has no %s (a driver older than NVML 5.319?)", path, name)
		}
	}
	return n, nil
}

func (n *nvml) close() { C.ddp_dlclose(n.lib) }

// errorf describes an NVML return code with the library's own words.
func (n *nvml) errorf(call string, r C.nvmlReturn_t) string {
	return fmt.Sprintf("%s: %s (%d)", call, C.GoString(C.ddp_error_string(n.errorString, r)), int(r))
}

// probeGPUs asks NVML for the driver and devices. When the library cannot
// be loaded or nvmlInit fails, it reports why and calls nothing else.
func probeGPUs() gpuInfo {
	n, err := openNVML(nvmlLibrary)
	if err != nil {
		return gpuInfo{Err: "no NVIDIA driver found (" + err.Error() + ")"}
	}
	defer n.close()
	if r := C.ddp_void(n.init); r != 0 {
		return gpuInfo{Err: "no NVIDIA driver found (" + n.errorf("nvmlInit", r) + ")"}
	}
	defer C.ddp_void(n.shutdown)
	var g gpuInfo
	buf := (*C.char)(C.malloc(256))
	defer C.free(unsafe.Pointer(buf))
	if r := C.ddp_string(n.driverVersion, buf, 256); r == 0 {
		g.Driver = C.GoString(buf)
	} else {
		g.Driver = "unknown: " + n.errorf("nvmlSystemGetDriverVersion", r)
	}
	var count C.uint
	if r := C.ddp_count(n.count, &count); r != 0 {
		g.Err = fmt.Sprintf("NVIDIA driver %s, but %s", g.Driver, n.errorf("nvmlDeviceGetCount", r))
		return g
	}
	for i := range uint(count) {
		var d C.nvmlDevice_t
		if r := C.ddp_handle(n.handleByIndex, C.uint(i), &d); r != 0 {
			g.Devices = append(g.Devices, fmt.Sprintf("%d: unavailable (%s)", i, n.errorf("nvmlDeviceGetHandleByIndex", r)))
			continue
		}
		line := fmt.Sprintf("%d: ", i)
		if r := C.ddp_device_string(n.name, d, buf, 256); r == 0 {
			line += C.GoString(buf)
		} else {
			line += "name unknown (" + n.errorf("nvmlDeviceGetName", r) + ")"
		}
		var total C.ulonglong
		if r := C.ddp_memory(n.memoryInfo, d, &total); r == 0 {
			line += fmt.Sprintf(", %d MiB", uint64(total)>>20)
		}
		g.Devices = append(g.Devices, line)
	}
	return g
}
