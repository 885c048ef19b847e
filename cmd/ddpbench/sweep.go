package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
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
		Description: "Runs `run` once per bucket cap on one group of ranks, prints a row per cap and the\n" +
			"cap with the lowest median step time, saying which other caps are within noise of it\n" +
			"(their p10-p90 ranges overlap); --plot draws step time (median, p10-p90 bars) and\n" +
			"overlap ratio against the cap as SVG. Ctrl-C prints the caps measured so far.\n\n" + exitRule,
		Flags: append(stepFlags(false),
			stringFlag("caps", "1,2,5,10,25,50,100", "bucket caps in MiB, comma-separated"),
			stringFlag("plot", "", "write an SVG plot of step time and overlap against bucket cap to `FILE.svg`"),
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
	if c.Args().Present() {
		return unexpectedArg(c, c.Args().First(), "sweep takes flags only")
	}
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
		if err := checkPlotPath(plot); err != nil {
			return err
		}
	}
	g, err := startGroup(c.Context, o.backend, o.ranks, o.timeout)
	if err != nil {
		return err
	}
	defer g.close()
	out, errOut := c.App.Writer, c.App.ErrWriter
	if g.quietRank() {
		out, errOut = io.Discard, io.Discard // rank 0 prints the group's results
	}
	// Device pools are made once, for every cap; a rank that cannot make
	// them tells its peers before the first collective (agree).
	var setup error
	if o.backend.DeviceMemory {
		_, setup = g.devicePools(4 * o.model.Numel())
	}
	if err := g.agree(c.Context, setup, o.timeout, c.App.ErrWriter, rawArgs(c)); err != nil {
		return err
	}
	hosts, err := rankHosts(c.Context, g)
	if err != nil {
		return err
	}
	o.bucketCapMB = caps[0] // for the notes, which do not depend on it
	o.notes(errOut)
	bar := newProgress(errOut, "sweep", len(caps)*(o.steps+o.warmup), o.format == "table")
	defer bar.stop()
	var recs []runRecord
	var stopped error
	for _, capMB := range caps {
		ro := o
		ro.bucketCapMB = capMB
		cfg := ro.benchConfig(g.comms)
		if o.backend.DeviceMemory {
			if cfg.Pools, err = g.devicePools(4 * o.model.Numel()); err != nil {
				return err
			}
		}
		cfg.OnStep = func(rank int, _ bool, _ *ddp.StepStats) {
			if rank == 0 {
				bar.add(1)
			}
		}
		launches := o.backend.launchesSince()
		res, err := bench.Run(c.Context, cfg)
		if err != nil && (res == nil || !res.Interrupted) {
			return fmt.Errorf("bucket cap %g MiB: %w", capMB, timeoutHint(err, o.timeout))
		}
		if res.Steps > 0 {
			recs = append(recs, runRecord{o: ro, res: res, hosts: hosts, launches: launches()})
		}
		if res.Interrupted {
			stopped = err
			break
		}
	}
	bar.stop()
	if len(recs) == 0 {
		return interruptedError{msg: fmt.Sprintf("interrupted before the first of %d measured steps at bucket cap %g MiB completed: nothing to report", o.steps, caps[0]), err: stopped}
	}
	if plot != "" && !g.quietRank() {
		if err := writePlotFile(plot, &o, recs); err != nil {
			return err
		}
	}
	if err := writeSweep(out, o.format, recs); err != nil {
		return err
	}
	if stopped != nil {
		last := recs[len(recs)-1]
		done := len(recs)
		if last.res.Interrupted {
			done--
		}
		return interruptedError{msg: fmt.Sprintf("interrupted: %d of %d bucket caps measured in full%s",
			done, len(caps), partialNote(last)), err: stopped}
	}
	return nil
}

// partialNote describes the cap that was cut short, if r was.
func partialNote(r runRecord) string {
	if !r.res.Interrupted {
		return ""
	}
	return fmt.Sprintf("; %g MiB over %d of %d steps", r.o.bucketCapMB, r.res.Steps, r.o.steps)
}

// checkPlotPath refuses a --plot file the SVG would be misread from: a
// name that promises another format (x.png holding SVG opens nowhere).
func checkPlotPath(path string) error {
	if ext := filepath.Ext(path); !strings.EqualFold(ext, ".svg") {
		return usagef("--plot %q: the plot is SVG, so its file must end in .svg (for a PNG: rsvg-convert -o plot.png plot.svg)", path)
	}
	return checkOutputPath("--plot", path)
}

// best returns the index of the complete record with the lowest median
// step time (a cap cut short by an interruption competes only if it is
// the only one).
func best(recs []runRecord) int {
	b := -1
	for i, r := range recs {
		if r.res.Interrupted && len(recs) > 1 {
			continue
		}
		if b < 0 || r.res.StepTime.Median < recs[b].res.StepTime.Median {
			b = i
		}
	}
	return max(b, 0)
}

// withinNoise returns the caps other than recs[b] whose p10-p90 range of
// step time overlaps that of recs[b]: the data cannot tell them apart.
func withinNoise(recs []runRecord, b int) []float64 {
	lo, hi := recs[b].res.StepTime.P10, recs[b].res.StepTime.P90
	out := []float64{}
	for i, r := range recs {
		if i != b && r.res.StepTime.P10 <= hi && r.res.StepTime.P90 >= lo {
			out = append(out, r.o.bucketCapMB)
		}
	}
	return out
}

// sweepJSON is the json output of sweep.
type sweepJSON struct {
	Runs           []runJSON `json:"runs"`
	BestBucketCap  float64   `json:"best_bucket_cap_mb"`
	BestStepMedian float64   `json:"best_step_ms_median"`
	// WithinNoise lists the caps whose p10-p90 step time range overlaps
	// the best one's: as good, as far as the measurement can tell.
	WithinNoise []float64 `json:"within_noise_of_best_mb"`
	Interrupted bool      `json:"interrupted"`
}

func writeSweep(w io.Writer, format string, recs []runRecord) error {
	if len(recs) == 0 {
		return nil
	}
	bi := best(recs)
	b := recs[bi]
	switch format {
	case "json":
		j := sweepJSON{BestBucketCap: b.o.bucketCapMB, BestStepMedian: b.res.StepTime.Median * 1e3,
			WithinNoise: withinNoise(recs, bi), Interrupted: recs[len(recs)-1].res.Interrupted}
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
	// The configuration lines, without the cap, which varies.
	if o.backend.standIn != "" {
		sb.WriteString(o.backend.standInBanner() + "\n")
	}
	fmt.Fprintf(sb, "%s\n%s\n%sbuckets: first %g MiB, compression %s\n%s\n",
		o.modelLine(), o.ranksLine(), o.libraryLine(), o.firstMB, o.compression, o.computeLine(recs[0].res))
	fmt.Fprintf(sb, "%d steps after %d warmup per cap\n", o.steps, o.warmup)
	if last := recs[len(recs)-1]; last.res.Interrupted {
		fmt.Fprintf(sb, "INTERRUPTED: the last row (%g MiB) covers %d of %d steps\n", last.o.bucketCapMB, last.res.Steps, last.o.steps)
	}
	fmt.Fprintf(sb, "\n%9s %7s %10s %9s %9s %11s %9s %8s %9s\n",
		"cap(MiB)", "buckets", "step(ms)", "p10", "p90", "compute(ms)", "comm(ms)", "overlap", "busbw")
	for _, r := range recs {
		res := r.res
		fmt.Fprintf(sb, "%9g %7d %10.2f %9.2f %9.2f %11.2f %9.2f %8.3f %9.2f\n",
			r.o.bucketCapMB, len(res.Buckets), res.StepTime.Median*1e3, res.StepTime.P10*1e3, res.StepTime.P90*1e3,
			res.ComputeTime.Median*1e3, res.CommTime.Median*1e3, res.OverlapRatio.Median, res.BusBW.Median)
	}
	bi := best(recs)
	b := recs[bi]
	fmt.Fprintf(sb, "\nbest bucket cap: %g MiB (median step %.2f ms, p10-p90 %.2f-%.2f)", b.o.bucketCapMB,
		b.res.StepTime.Median*1e3, b.res.StepTime.P10*1e3, b.res.StepTime.P90*1e3)
	if near := withinNoise(recs, bi); len(near) > 0 {
		caps := make([]string, len(near))
		for i, c := range near {
			caps[i] = fmt.Sprintf("%g", c)
		}
		fmt.Fprintf(sb, "\n  within noise of it: %s MiB (their p10-p90 ranges overlap); more --steps may separate them", strings.Join(caps, ", "))
	}
	sb.WriteString("\n")
	_, err := io.WriteString(w, sb.String())
	return err
}

func writePlotFile(path string, o *runOpts, recs []runRecord) error {
	pts := make([]plotPoint, len(recs))
	for i, r := range recs {
		pts[i] = plotPoint{CapMB: r.o.bucketCapMB, StepMS: r.res.StepTime.Median * 1e3,
			StepP10: r.res.StepTime.P10 * 1e3, StepP90: r.res.StepTime.P90 * 1e3, Overlap: r.res.OverlapRatio.Median}
	}
	title := fmt.Sprintf("%s, %s (%s), compression %s, compute %s", o.model.Model, rankCount(o.ranks), o.backend.Name, o.compression, o.compute)
	if o.compute != bench.ComputeNone && len(recs) > 0 {
		title += fmt.Sprintf(" (%.2f ms per step)", recs[0].res.ComputeTarget*1e3)
	}
	if len(recs) > 0 && recs[len(recs)-1].res.Interrupted {
		title += ", interrupted"
	}
	if err := os.WriteFile(path, []byte(plotSVG(title, pts)), 0o644); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	return nil
}
