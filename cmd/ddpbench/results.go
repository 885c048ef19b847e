package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/mpi"
)

// runRecord is one run's configuration and result: a row of the run and
// sweep outputs.
type runRecord struct {
	o     runOpts
	res   *bench.Result
	gpu   *gpuSummary  // GPU telemetry over the measured steps, or nil
	hosts []bench.Host // where each rank ran (rankHosts)
	// early: printed as an interrupt came, before the run ended (its
	// allocations were not counted).
	early bool
	// launches counts this process's NCCL launches over the run (nccl);
	// nil for the other backends.
	launches *launchesJSON
}

// runCSVHeader names the CSV columns of run and sweep. Times are in
// milliseconds, bandwidth in GB/s (1e9 bytes), sizes in bytes.
var runCSVHeader = slices.Concat([]string{
	"run_id", "model", "ranks", "backend", "bucket_cap_mb", "first_bucket_mb", "compression", "grad_as_bucket_view", "zero_grad",
	"compute", "compute_target_ms", "steps", "steps_requested", "warmup", "interrupted", "quantile_steps",
	"step_ms_median", "step_ms_p10", "step_ms_p90",
	"iter_ms_median", "iter_ms_p10", "iter_ms_p90",
	"compute_ms_median", "compute_ms_p10", "compute_ms_p90",
	"comm_ms_median", "comm_ms_p10", "comm_ms_p90",
	"overlap_median", "overlap_p10", "overlap_p90",
	"busbw_gbs_median", "busbw_gbs_p10", "busbw_gbs_p90",
	"bytes_per_step", "grad_bytes", "buckets", "bucket_bytes", "fp16_overflows", "allocs_per_step",
	"shard", "gather_ms_median", "gather_ms_p10", "gather_ms_p90",
}, telemetryCSVHeader(), []string{"library", "stand_in"})

func (r runRecord) csv() []string {
	o, res := r.o, r.res
	ms := func(d bench.Dist) []string {
		return []string{fmtFloat(d.Median * 1e3), fmtFloat(d.P10 * 1e3), fmtFloat(d.P90 * 1e3)}
	}
	raw := func(d bench.Dist) []string {
		return []string{fmtFloat(d.Median), fmtFloat(d.P10), fmtFloat(d.P90)}
	}
	sizes := make([]string, len(res.Buckets))
	for i, b := range res.Buckets {
		sizes[i] = fmt.Sprint(b)
	}
	rec := []string{o.runID, o.model.Model, fmt.Sprint(o.ranks), o.backend.Name, fmtFloat(o.bucketCapMB), fmtFloat(o.firstMB),
		o.compression, fmt.Sprint(o.bucketView), fmt.Sprint(o.zeroGrad), o.compute.String(), fmtFloat(res.ComputeTarget * 1e3),
		fmt.Sprint(res.Steps), fmt.Sprint(o.steps), fmt.Sprint(res.Warmup), fmt.Sprint(res.Interrupted), fmt.Sprint(res.Sampled)}
	rec = append(rec, ms(res.StepTime)...)
	rec = append(rec, ms(res.IterTime)...)
	rec = append(rec, ms(res.ComputeTime)...)
	rec = append(rec, ms(res.CommTime)...)
	rec = append(rec, raw(res.OverlapRatio)...)
	rec = append(rec, raw(res.BusBW)...)
	rec = append(rec, fmt.Sprint(res.WireBytes), fmt.Sprint(res.GradBytes), fmt.Sprint(len(res.Buckets)),
		strings.Join(sizes, " "), fmt.Sprint(res.Overflows), fmtFloat(res.AllocsPerStep))
	rec = append(rec, shardNames[o.shard])
	rec = append(rec, ms(res.GatherTime)...)
	rec = append(rec, r.gpu.csv()...)
	return append(rec, r.library(), o.backend.standIn)
}

// distJSON is a Dist in the JSON output.
type distJSON struct {
	Median float64 `json:"median"`
	P10    float64 `json:"p10"`
	P90    float64 `json:"p90"`
}

func toJSON(d bench.Dist, scale float64) distJSON {
	return distJSON{d.Median * scale, d.P10 * scale, d.P90 * scale}
}

// runJSON is one run in the JSON output.
type runJSON struct {
	RunID            string   `json:"run_id"`
	Model            string   `json:"model"`
	ModelSource      string   `json:"model_source"`
	Tensors          int      `json:"tensors"`
	Parameters       int64    `json:"parameters"`
	Ranks            int      `json:"ranks"`
	Backend          string   `json:"backend"`
	Library          string   `json:"library,omitempty"`  // the library the backend runs on (mpi, nccl)
	StandIn          string   `json:"stand_in,omitempty"` // not empty: the test stand-in, not NCCL, no GPU
	BucketCapMB      float64  `json:"bucket_cap_mb"`
	FirstBucketMB    float64  `json:"first_bucket_mb"`
	Compression      string   `json:"compression"`
	GradAsBucketView bool     `json:"grad_as_bucket_view"`
	ZeroGrad         bool     `json:"zero_grad"`
	Compute          string   `json:"compute"`
	RateParamsPerSec float64  `json:"rate_params_per_s,omitempty"`
	ComputeTargetMS  float64  `json:"compute_target_ms"`
	Steps            int      `json:"steps"` // measured steps completed
	StepsRequested   int      `json:"steps_requested"`
	Warmup           int      `json:"warmup"`
	Interrupted      bool     `json:"interrupted"`
	QuantileSteps    int      `json:"quantile_steps"` // steps the quantiles come from: all, or a uniform sample
	StepMS           distJSON `json:"step_ms"`
	IterMS           distJSON `json:"iter_ms"`
	ComputeMS        distJSON `json:"compute_ms"`
	CommMS           distJSON `json:"comm_ms"`
	Overlap          distJSON `json:"overlap_ratio"`
	BusBW            distJSON `json:"busbw_gbs"`
	BytesPerStep     int64    `json:"bytes_per_step"`
	GradBytes        int64    `json:"grad_bytes"`
	Buckets          []int64  `json:"bucket_bytes"`
	Overflows        int64    `json:"fp16_overflows"`
	AllocsPerStep    float64  `json:"allocs_per_step"`
	// Shard is --shard: none (the all-reduce step), elements or params
	// (the sharded step: reduce-scatter, then all-gather). With it,
	// comm_ms covers both collectives, busbw_gbs counts their payload as
	// an all-reduce's, and GatherMS is the all-gathers' alone.
	Shard    string    `json:"shard"`
	GatherMS *distJSON `json:"gather_ms,omitempty"`
	// GPUTelemetry is NVML's view of the ranks' GPUs over the measured
	// steps (a device backend with NVML); absent otherwise.
	GPUTelemetry *telemetryJSON `json:"gpu_telemetry,omitempty"`
	// Hosts is the number of hosts the ranks ran on and RankHosts each
	// rank's host and process: the rank table.
	Hosts     int            `json:"hosts"`
	RankHosts []rankHostJSON `json:"rank_hosts"`
	// Transport is what the mpi backend chose for Open MPI, as the
	// table's header says it; absent for other backends.
	Transport *transportJSON `json:"transport,omitempty"`
	// NCCLLaunches counts this process's launches (nccl); absent for
	// other backends.
	NCCLLaunches *launchesJSON `json:"nccl_launches,omitempty"`
}

func (r runRecord) json() runJSON {
	o, res := r.o, r.res
	j := runJSON{
		RunID: o.runID, Model: o.model.Model, ModelSource: o.model.Source, Tensors: len(o.model.Params), Parameters: o.model.Numel(),
		Ranks: o.ranks, Backend: o.backend.Name, Library: r.library(), StandIn: o.backend.standIn, BucketCapMB: o.bucketCapMB, FirstBucketMB: o.firstMB,
		Compression: o.compression, GradAsBucketView: o.bucketView, ZeroGrad: o.zeroGrad, Compute: o.compute.String(), RateParamsPerSec: o.rate,
		ComputeTargetMS: res.ComputeTarget * 1e3, Steps: res.Steps, StepsRequested: o.steps, Warmup: res.Warmup,
		Interrupted: res.Interrupted, QuantileSteps: res.Sampled,
		StepMS: toJSON(res.StepTime, 1e3), IterMS: toJSON(res.IterTime, 1e3), ComputeMS: toJSON(res.ComputeTime, 1e3), CommMS: toJSON(res.CommTime, 1e3),
		Overlap: toJSON(res.OverlapRatio, 1), BusBW: toJSON(res.BusBW, 1),
		BytesPerStep: res.WireBytes, GradBytes: res.GradBytes, Buckets: res.Buckets,
		Overflows: res.Overflows, AllocsPerStep: res.AllocsPerStep, GPUTelemetry: r.gpu.json(),
		Hosts: distinctHosts(r.hosts), RankHosts: rankHostsJSON(r.hosts), NCCLLaunches: r.launches,
		Shard: shardNames[o.shard],
	}
	if o.shard != ddp.ShardOff {
		g := toJSON(res.GatherTime, 1e3)
		j.GatherMS = &g
	}
	if o.backend.Name == "mpi" {
		if j.Transport = mpiTransport(mpi.LibraryInfo()); j.Transport != nil {
			j.Hosts = j.Transport.Hosts
		}
	}
	return j
}

// library names the library the backend runs on: the one nccl loaded, or
// MPI's once it is initialised; "" for the others.
func (r runRecord) library() string {
	if r.o.backend.Name == "mpi" {
		if i := mpi.LibraryInfo(); i.Initialized {
			return i.Library
		}
	}
	return r.o.backend.library
}

// writeRunResults writes one run (as an object in json) or several (a
// sweep: an array) in the chosen format.
func writeRunResults(w io.Writer, format string, recs []runRecord) error {
	switch format {
	case "json":
		if len(recs) == 1 {
			return writeJSON(w, recs[0].json())
		}
		out := make([]runJSON, len(recs))
		for i, r := range recs {
			out[i] = r.json()
		}
		return writeJSON(w, out)
	case "csv":
		if err := writeCSV(w, runCSVHeader); err != nil {
			return err
		}
		for _, r := range recs {
			if err := writeCSV(w, r.csv()); err != nil {
				return err
			}
		}
		return nil
	}
	for i, r := range recs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if _, err := io.WriteString(w, r.table()); err != nil {
			return err
		}
	}
	return nil
}

// libraryLine names the library a device backend loaded (nccl), with its
// newline; "" for the others.
func (o *runOpts) libraryLine() string {
	if o.backend.library == "" {
		return ""
	}
	return fmt.Sprintf("library: %s; gradients in device memory\n", o.backend.library)
}

// describe is the configuration of a run: the model, the ranks and the
// buckets, a line each.
func (o *runOpts) describe() string {
	b := &strings.Builder{}
	if o.backend.standIn != "" {
		b.WriteString(o.backend.standInBanner() + "\n")
	}
	b.WriteString(o.modelLine() + "\n" + o.ranksLine() + "\n" + o.libraryLine())
	view := "gradients as bucket views"
	if !o.bucketView {
		view = "gradients copied into buckets"
	}
	if o.zeroGrad {
		view += ", accumulated into zeroed gradients"
	} else {
		view += ", assigned (no zeroing)"
	}
	fmt.Fprintf(b, "buckets: cap %g MiB (first %g MiB), compression %s, %s\n", o.bucketCapMB, o.firstMB, o.compressionLabel(), view)
	if o.shard != ddp.ShardOff {
		fmt.Fprintf(b, "sharded step (--shard %s): each bucket reduce-scattered, then all-gathered\n", shardNames[o.shard])
	}
	return b.String()
}

func (o *runOpts) modelLine() string {
	return fmt.Sprintf("%s: %d tensors, %s parameters, %s of float32 gradients",
		o.model.Model, len(o.model.Params), groupDigits(o.model.Numel()), fmtBytes(o.model.Bytes()))
}

func (o *runOpts) ranksLine() string {
	s := rankCount(o.ranks) + ", " + o.backend.Name
	if o.backend.About != "" {
		s += " (" + o.backend.About + ")"
	}
	if o.backend.Name == "mpi" {
		s += mpiTuning(mpi.LibraryInfo())
	}
	return s
}

// mpiTuning says, once MPI is initialised, how many hosts the ranks span
// and what the backend chose for Open MPI (see package mpi).
func mpiTuning(i mpi.Info) string {
	if !i.Initialized {
		return ""
	}
	hosts := "1 host"
	if i.Hosts != 1 {
		hosts = fmt.Sprintf("%d hosts", i.Hosts)
	}
	s := "\n          " + i.Library + "; " + hosts
	if i.Hierarchy != "" {
		s += " of " + i.Hierarchy + " ranks, hierarchical (a reduction inside each host, then across the hosts)"
		if i.HierarchyChunk > 0 {
			s += ", all-reduces pipelined in " + fmtBytes(int64(i.HierarchyChunk)) + " chunks"
		}
	}
	if i.LargeAllReduce != "" {
		s += ", all-reduces from 1 MiB on the " + i.LargeAllReduce
	}
	if i.SharedMemory {
		s += fmt.Sprintf(", collectives in shared memory (in place from %s)", fmtBytes(int64(i.SharedMemoryMin)))
	}
	if i.SharedMemoryFailure != "" {
		s += " (some left to MPI: " + i.SharedMemoryFailure + ")"
	}
	if i.TCPTuned && i.TCPFlags >= 0 && i.TCPEagerLimit >= 0 {
		put := "on"
		if i.TCPFlags&mpi.TCPFlagPut == 0 {
			put = "off"
		}
		s += fmt.Sprintf(", TCP transport: put %s, eager limit %d", put, i.TCPEagerLimit)
	}
	return s
}

// computeLine says what the simulated backward is, at which rate and
// where the rate came from.
func (o *runOpts) computeLine(res *bench.Result) string {
	how := "sleeping (CPU left free, as a GPU's backward leaves it)"
	switch o.compute {
	case bench.ComputeNone:
		return "backward: none (--compute none): every gradient is ready at once, so nothing can overlap;\n" +
			"          the step is the reduction alone"
	case bench.ComputeSpin:
		how = "spinning (CPU busy, as a CPU backward keeps it)"
	}
	return fmt.Sprintf("backward: simulated by %s, %.2f ms per step\n          (%.4g params/s per rank, from the %s)",
		how, res.ComputeTarget*1e3, o.rate, o.rateFrom)
}

func (r runRecord) table() string {
	o, res := r.o, r.res
	b := &strings.Builder{}
	if res.Interrupted {
		fmt.Fprintf(b, "INTERRUPTED after %d of %d measured steps: the statistics below cover those\n", res.Steps, o.steps)
	}
	b.WriteString(o.describe())
	fmt.Fprintf(b, "%s\n", o.computeLine(res))
	fmt.Fprintf(b, "%d steps measured after %d warmup", res.Steps, res.Warmup)
	if res.Sampled < res.Steps {
		fmt.Fprintf(b, "; quantiles from a uniform sample of %s of them (memory stays fixed), means from all", groupDigits(int64(res.Sampled)))
	}
	if l := r.launches; l != nil {
		fmt.Fprintf(b, "\nNCCL launches of this process, warmup included: %d, of which %d answered ncclInProgress", l.Launches, l.InProgress)
	}
	fmt.Fprintf(b, "\n\n%-24s %10s %10s %10s\n", "", "median", "p10", "p90")
	row := func(name string, d bench.Dist, scale float64, prec int) {
		fmt.Fprintf(b, "%-24s %10.*f %10.*f %10.*f\n", name, prec, d.Median*scale, prec, d.P10*scale, prec, d.P90*scale)
	}
	row("step time (ms)", res.StepTime, 1e3, 2)
	row("backward compute (ms)", res.ComputeTime, 1e3, 2)
	row("communication (ms)", res.CommTime, 1e3, 2)
	if o.shard != ddp.ShardOff {
		row("  of it all-gather (ms)", res.GatherTime, 1e3, 2)
	}
	row("overlap ratio", res.OverlapRatio, 1, 3)
	row("busbw (GB/s)", res.BusBW, 1, 2)
	b.WriteString("\n")
	if o.compute != bench.ComputeNone {
		// A reducer that started communicating only when backward ended
		// would take both, one after the other.
		step, serial := res.StepTime.Median*1e3, (res.ComputeTime.Median+res.CommTime.Median)*1e3
		fmt.Fprintf(b, "%-24s %.2f ms per step (%.2f against %.2f ms for backward, then communication; medians)\n",
			"overlap saves", serial-step, step, serial)
	}
	sizes := make([]string, len(res.Buckets))
	for i, s := range res.Buckets {
		sizes[i] = fmtBytes(s)
	}
	fmt.Fprintf(b, "%-24s %s (%s)\n", "bytes per step", groupDigits(res.WireBytes), fmtBytes(res.WireBytes))
	fmt.Fprintf(b, "%-24s %d: %s\n", "buckets", len(res.Buckets), strings.Join(sizes, ", "))
	if o.compression == "fp16" || o.compression == "bf16" {
		fmt.Fprintf(b, "%-24s %d\n", o.compression+" overflows", res.Overflows)
	}
	if r.early {
		fmt.Fprintf(b, "%-24s %s\n", "allocations per step", "not counted (interrupted)")
	} else {
		fmt.Fprintf(b, "%-24s %.1f\n", "allocations per step", res.AllocsPerStep)
	}
	if r.gpu != nil {
		b.WriteString("\n" + r.gpu.table("", "over the measured steps"))
	}
	b.WriteString(rankTable(r.hosts))
	return b.String()
}

// groupDigits prints n with thousands separators.
func groupDigits(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// rankCount is "1 rank" or "N ranks".
func rankCount(n int) string {
	if n == 1 {
		return "1 rank"
	}
	return fmt.Sprintf("%d ranks", n)
}
