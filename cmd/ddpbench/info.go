package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/mpi"
	"github.com/ddpgo/ddpgo/nccl"
	"github.com/urfave/cli/v2"
)

func infoCommand() *cli.Command {
	return &cli.Command{
		Name:  "info",
		Usage: "show the CPU features the fp16 kernels use, GPUs, built backends and the Go runtime",
		Flags: []cli.Flag{formatFlag("output: table, json or csv (key,value rows)")},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return unexpectedArg(c, c.Args().First(), "info takes flags only")
			}
			format, err := parseFormat(c.String("format"))
			if err != nil {
				return err
			}
			return writeInfo(c.App.Writer, format, collectInfo(probeGPUs()))
		},
	}
}

// gpuInfo is what NVML reported: the driver, the devices, or why not.
type gpuInfo struct {
	Err     string   `json:"error,omitempty"` // non-empty: no usable driver, and why
	Driver  string   `json:"driver,omitempty"`
	Devices []string `json:"devices"` // "0: NVIDIA H100 80GB HBM3, 81559 MiB"
}

// infoData is everything info reports.
type infoData struct {
	GoVersion   string        `json:"go_version"`
	OS          string        `json:"os"`
	Arch        string        `json:"arch"`
	GOMAXPROCS  int           `json:"gomaxprocs"`
	CPUs        int           `json:"cpus"`
	CPU         string        `json:"cpu"`
	FP16Kernels string        `json:"fp16_kernels"`
	CPUFeatures string        `json:"cpu_features"`
	Backends    []backendInfo `json:"backends"`
	GPUs        gpuInfo       `json:"gpus"`
}

type backendInfo struct {
	Name  string `json:"name"`
	Built bool   `json:"built"`
	Note  string `json:"note,omitempty"`
	// Library describes the library the backend runs on: MPI's version
	// and thread level, or what NCCL's loader found.
	Library string `json:"library,omitempty"`
}

// libraryLine describes backend name's library, as its setup says.
func libraryLine(name string) string {
	if l := setups[name].library; l != nil {
		return l()
	}
	return ""
}

// mpiLibrary describes the MPI library: its version and thread level.
func mpiLibrary() string {
	i := mpi.LibraryInfo()
	if !i.Built {
		return ""
	}
	return fmt.Sprintf("%s; asks for %s", i.Library, i.Requested)
}

// ncclLibrary says what NCCL's loader finds, and whether it is usable.
func ncclLibrary() string {
	i := nccl.GetInfo(nccl.Libraries{})
	switch {
	case i.NCCLVersion == 0:
		return "not usable: " + i.Err.Error()
	case i.Err != nil:
		return "not usable: " + ncclLibraryLine(i)
	case len(i.Devices) == 0:
		return "not usable (no CUDA device): " + ncclLibraryLine(i)
	case i.StandIn != "":
		return "usable, but over the test STAND-IN (" + i.StandIn + "): " + ncclLibraryLine(i)
	}
	return "usable: " + ncclLibraryLine(i)
}

func collectInfo(g gpuInfo) infoData {
	d := infoData{GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH,
		GOMAXPROCS: runtime.GOMAXPROCS(0), CPUs: runtime.NumCPU(), CPU: cpuModel(),
		FP16Kernels: fp16.Impl(), CPUFeatures: fp16.CPUFeatures(), GPUs: g}
	if d.GPUs.Devices == nil {
		d.GPUs.Devices = []string{}
	}
	for _, be := range backends {
		d.Backends = append(d.Backends, backendInfo{Name: be.Name, Built: be.built(), Note: be.NotBuilt, Library: libraryLine(be.Name)})
	}
	return d
}

func writeInfo(w io.Writer, format string, d infoData) error {
	switch format {
	case "json":
		return writeJSON(w, d)
	case "csv":
		return writeInfoCSV(w, d)
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "Go:           %s %s/%s, GOMAXPROCS %d, %d CPUs\n", d.GoVersion, d.OS, d.Arch, d.GOMAXPROCS, d.CPUs)
	fmt.Fprintf(b, "CPU:          %s\n", d.CPU)
	fmt.Fprintf(b, "fp16 kernels: %s (CPU features: %s)\n", d.FP16Kernels, orNone(d.CPUFeatures))
	fmt.Fprintf(b, "Backends:\n")
	for _, be := range d.Backends {
		state := "built"
		if !be.Built {
			state = be.Note
		}
		fmt.Fprintf(b, "  %-8s %s\n", be.Name, state)
		if be.Library != "" {
			fmt.Fprintf(b, "  %-8s %s\n", "", be.Library)
		}
	}
	g := d.GPUs
	switch {
	case g.Err != "":
		fmt.Fprintf(b, "GPUs:         %s\n", g.Err)
	case len(g.Devices) == 0:
		fmt.Fprintf(b, "GPUs:         none (NVIDIA driver %s)\n", g.Driver)
	default:
		fmt.Fprintf(b, "GPUs:         %d (NVIDIA driver %s)\n", len(g.Devices), g.Driver)
		for _, dev := range g.Devices {
			fmt.Fprintf(b, "  %s\n", dev)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeInfoCSV writes info as key,value records.
func writeInfoCSV(w io.Writer, d infoData) error {
	recs := [][]string{{"key", "value"},
		{"go_version", d.GoVersion}, {"os", d.OS}, {"arch", d.Arch},
		{"gomaxprocs", fmt.Sprint(d.GOMAXPROCS)}, {"cpus", fmt.Sprint(d.CPUs)}, {"cpu", d.CPU},
		{"fp16_kernels", d.FP16Kernels}, {"cpu_features", d.CPUFeatures}}
	for _, be := range d.Backends {
		state := "built"
		if !be.Built {
			state = be.Note
		}
		recs = append(recs, []string{"backend." + be.Name, state})
		if be.Library != "" {
			recs = append(recs, []string{"backend." + be.Name + ".library", be.Library})
		}
	}
	recs = append(recs, []string{"gpu_driver", d.GPUs.Driver}, []string{"gpu_error", d.GPUs.Err})
	for i, dev := range d.GPUs.Devices {
		recs = append(recs, []string{fmt.Sprintf("gpu.%d", i), dev})
	}
	for _, r := range recs {
		if err := writeCSV(w, r); err != nil {
			return err
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// cpuModel returns the first "model name" of /proc/cpuinfo, or the
// architecture when there is none.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
