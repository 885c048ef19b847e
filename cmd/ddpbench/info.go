package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/ddpgo/ddpgo/fp16"
	"github.com/urfave/cli/v2"
)

func infoCommand() *cli.Command {
	return &cli.Command{
		Name:   "info",
		Usage:  "show the CPU features the fp16 kernels use, GPUs, built backends and the Go runtime",
		Action: func(c *cli.Context) error { return writeInfo(c.App.Writer, probeGPUs()) },
	}
}

// gpuInfo is what NVML reported: the driver, the devices, or why not.
type gpuInfo struct {
	Err     string // non-empty: no usable driver, and why
	Driver  string
	Devices []string // "0: NVIDIA H100 80GB HBM3, 81559 MiB"
}

func writeInfo(w io.Writer, g gpuInfo) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "Go:          %s %s/%s, GOMAXPROCS %d, %d CPUs\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.NumCPU())
	fmt.Fprintf(b, "CPU:         %s\n", cpuModel())
	fmt.Fprintf(b, "fp16 kernels: %s (CPU features: %s)\n", fp16.Impl(), orNone(fp16.CPUFeatures()))
	fmt.Fprintf(b, "Backends:\n")
	for _, be := range backends {
		state := "built"
		if !be.built {
			state = be.note
		}
		fmt.Fprintf(b, "  %-8s %s\n", be.name, state)
	}
	switch {
	case g.Err != "":
		fmt.Fprintf(b, "GPUs:        %s\n", g.Err)
	case len(g.Devices) == 0:
		fmt.Fprintf(b, "GPUs:        none (NVIDIA driver %s)\n", g.Driver)
	default:
		fmt.Fprintf(b, "GPUs:        %d (NVIDIA driver %s)\n", len(g.Devices), g.Driver)
		for _, d := range g.Devices {
			fmt.Fprintf(b, "  %s\n", d)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
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
