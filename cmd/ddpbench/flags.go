package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// envName returns the environment variable that sets flag name.
func envName(name string) string {
	return "DDPBENCH_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func envs(name string) []string { return []string{envName(name)} }

func stringFlag(name, value, usage string, aliases ...string) *cli.StringFlag {
	return &cli.StringFlag{Name: name, Value: value, Usage: usage, Aliases: aliases, EnvVars: envs(name)}
}

func intFlag(name string, value int, usage string, aliases ...string) *cli.IntFlag {
	return &cli.IntFlag{Name: name, Value: value, Usage: usage, Aliases: aliases, EnvVars: envs(name)}
}

func floatFlag(name string, value float64, usage string, aliases ...string) *cli.Float64Flag {
	return &cli.Float64Flag{Name: name, Value: value, Usage: usage, Aliases: aliases, EnvVars: envs(name)}
}

func boolFlag(name string, value bool, usage string, aliases ...string) *cli.BoolFlag {
	return &cli.BoolFlag{Name: name, Value: value, Usage: usage, Aliases: aliases, EnvVars: envs(name)}
}

// formatFlag is --format, shared by run, sweep and collective.
func formatFlag(usage string) *cli.StringFlag {
	return stringFlag("format", "table", usage)
}

// parseFormat validates --format.
func parseFormat(s string) (string, error) {
	switch s {
	case "table", "json", "csv":
		return s, nil
	}
	return "", usagef("--format %q: want table, json or csv", s)
}

// parseSize parses a byte count with an optional K, M or G suffix (powers
// of 1024, as nccl-tests reads -b and -e), optionally followed by B.
func parseSize(flag, s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(t, "B")
	t = strings.TrimSuffix(t, "I") // KiB, MiB, GiB
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v <= 0 || v > (1<<50)/mult {
		return 0, usagef("%s %q: want a positive byte count such as 4096, 4K, 256M or 1G", flag, s)
	}
	return v * mult, nil
}

// mib converts a float count of MiB into bytes.
func mib(v float64) int { return int(v * (1 << 20)) }

// fmtBytes prints a byte count in the largest binary unit that keeps it
// readable.
func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
