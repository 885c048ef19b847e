package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/urfave/cli/v2"
)

func sweepCommand() *cli.Command {
	return &cli.Command{
		Name:  "sweep",
		Usage: "run the step benchmark over a list of bucket caps and report the best",
		Description: "Runs `run` once per bucket cap (--bucket-cap-mb is ignored) on one group of ranks,\n" +
			"prints a row per cap and the cap with the lowest median step time; --plot draws\n" +
			"step time (median, p10-p90 bars) and overlap ratio against the cap as SVG.",
		Flags: append(stepFlags(),
			stringFlag("caps", "1,2,5,10,25,50,100", "bucket caps in MiB, comma-separated"),
			stringFlag("plot", "", "write an SVG plot of step time and overlap against bucket cap to `FILE`"),
		),
		Action: sweepAction,
	}
}

// parseCaps parses --caps: positive MiB values, strictly increasing.
func parseCaps(s string) ([]float64, error) {
	var caps []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0 && v <= 4096) {
			return nil, usagef("--caps %q: %q is not a size in (0, 4096] MiB", s, f)
		}
		if len(caps) > 0 && v <= caps[len(caps)-1] {
			return nil, usagef("--caps %q: caps must increase (%g after %g)", s, v, caps[len(caps)-1])
		}
		caps = append(caps, v)
	}
	return caps, nil
}

func sweepAction(c *cli.Context) error {
	o, err := parseStepFlags(c)
	if err != nil {
		return err
	}
	caps, err := parseCaps(c.String("caps"))
	if err != nil {
		return err
	}
	plot := c.String("plot")
	if plot != "" {
		if err := checkOutputPath("--plot", plot); err != nil {
			return err
		}
	}
	g, closeGroup, err := startGroup(o.backend, o.ranks)
	if err != nil {
		return err
	}
	defer closeGroup()
	bar := newProgress(c.App.ErrWriter, "sweep", len(caps)*(o.steps+o.warmup), o.format == "table")
	defer bar.stop()
	var recs []runRecord
	for _, capMB := range caps {
		ro := o
		ro.bucketCapMB = capMB
		cfg := ro.benchConfig(g)
		cfg.OnStep = func(rank int, _ bool, _ *ddp.StepStats) {
			if rank == 0 {
				bar.add(1)
			}
		}
		res, err := bench.Run(c.Context, cfg)
		if err != nil {
			return fmt.Errorf("bucket cap %g MiB: %w", capMB, timeoutHint(err, o.timeout))
		}
		recs = append(recs, runRecord{o: ro, res: res})
	}
	bar.stop()
	if plot != "" {
		if err := writePlotFile(plot, &o, recs); err != nil {
			return err
		}
	}
	return writeSweep(c.App.Writer, o.format, recs)
}

// best returns the index of the record with the lowest median step time.
func best(recs []runRecord) int {
	b := 0
	for i, r := range recs {
		if r.res.StepTime.Median < recs[b].res.StepTime.Median {
			b = i
		}
	}
	return b
}

// sweepJSON is the json output of sweep.
type sweepJSON struct {
	Runs           []runJSON `json:"runs"`
	BestBucketCap  float64   `json:"best_bucket_cap_mb"`
	BestStepMedian float64   `json:"best_step_ms_median"`
}

func writeSweep(w io.Writer, format string, recs []runRecord) error {
	if len(recs) == 0 {
		return nil
	}
	b := recs[best(recs)]
	switch format {
	case "json":
		j := sweepJSON{BestBucketCap: b.o.bucketCapMB, BestStepMedian: b.res.StepTime.Median * 1e3}
		for _, r := range recs {
			j.Runs = append(j.Runs, r.json())
		}
		return writeJSON(w, j)
	case "csv":
		return writeRunResults(w, "csv", recs)
	}
	return writeSweepTable(w, recs)
}

func writeSweepTable(w io.Writer, recs []runRecord) error {
	o := recs[0].o
	sb := &strings.Builder{}
	// The configuration line, without the cap, which varies.
	desc := strings.SplitN(o.describe(), "\n", 3)
	fmt.Fprintf(sb, "%s\n%s (%s), first bucket %g MiB, compression %s, compute %s",
		desc[0], rankCount(o.ranks), o.backend.name, o.firstMB, o.compression, o.compute)
	if o.compute != bench.ComputeNone {
		fmt.Fprintf(sb, " (%.2f ms per step)", recs[0].res.ComputeTarget*1e3)
	}
	fmt.Fprintf(sb, "; %d steps after %d warmup per cap\n\n", o.steps, o.warmup)
	fmt.Fprintf(sb, "%9s %7s %10s %9s %9s %11s %9s %8s %9s\n",
		"cap(MiB)", "buckets", "step(ms)", "p10", "p90", "compute(ms)", "comm(ms)", "overlap", "busbw")
	for _, r := range recs {
		res := r.res
		fmt.Fprintf(sb, "%9g %7d %10.2f %9.2f %9.2f %11.2f %9.2f %8.3f %9.2f\n",
			r.o.bucketCapMB, len(res.Buckets), res.StepTime.Median*1e3, res.StepTime.P10*1e3, res.StepTime.P90*1e3,
			res.ComputeTime.Median*1e3, res.CommTime.Median*1e3, res.OverlapRatio.Median, res.BusBW.Median)
	}
	b := recs[best(recs)]
	fmt.Fprintf(sb, "\nbest bucket cap: %g MiB (median step %.2f ms)\n", b.o.bucketCapMB, b.res.StepTime.Median*1e3)
	_, err := io.WriteString(w, sb.String())
	return err
}

func writePlotFile(path string, o *runOpts, recs []runRecord) error {
	pts := make([]plotPoint, len(recs))
	for i, r := range recs {
		pts[i] = plotPoint{CapMB: r.o.bucketCapMB, StepMS: r.res.StepTime.Median * 1e3,
			StepP10: r.res.StepTime.P10 * 1e3, StepP90: r.res.StepTime.P90 * 1e3, Overlap: r.res.OverlapRatio.Median}
	}
	title := fmt.Sprintf("%s, %s (%s), compression %s, compute %s", o.model.Model, rankCount(o.ranks), o.backend.name, o.compression, o.compute)
	if o.compute != bench.ComputeNone && len(recs) > 0 {
		title += fmt.Sprintf(" (%.2f ms per step)", recs[0].res.ComputeTarget*1e3)
	}
	if err := os.WriteFile(path, []byte(plotSVG(title, pts)), 0o644); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	return nil
}
