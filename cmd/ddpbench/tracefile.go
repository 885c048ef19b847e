package main

import (
	"fmt"
	"os"
	"time"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/trace"
)

// Lanes of a rank in the trace.
// Perfetto reserves pid 0 and tid 0: ranks are processes rank+1, lanes
// start at 1.
const (
	laneStep = iota + 1
	laneBackward
	laneCompress
	laneCollective
	laneDecompress
)

// writeTraceFile writes res.Trace as a Chrome trace: one process per rank;
// lanes for the step (with a mark where each bucket became ready), the
// backward pass and the three phases of each bucket's reduction, with an
// arrow from each bucket's ready mark to its collective. The marks sit on
// the step lane because the last bucket becomes ready exactly when the
// backward span ends, and an arrow must start inside a span.
func writeTraceFile(path string, o *runOpts, res *bench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	if err := writeTrace(f, o, res); err != nil {
		f.Close()
		return fmt.Errorf("--trace %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	return nil
}

func writeTrace(f *os.File, o *runOpts, res *bench.Result) error {
	var origin time.Time
	if len(res.Trace) > 0 {
		origin = res.Trace[0][0].Start
		for _, s := range res.Trace[0] {
			if s.Start.Before(origin) {
				origin = s.Start
			}
		}
	}
	w := trace.New(f, trace.Options{MaxSteps: -1, Start: origin, Metadata: map[string]string{
		"model": o.model.Model, "ranks": fmt.Sprint(o.ranks), "backend": o.backend.name,
		"bucket_cap_mb": fmt.Sprint(o.bucketCapMB), "compression": o.compression, "compute": o.compute.String(),
	}})
	for r := range o.ranks {
		pid := r + 1
		w.Process(pid, fmt.Sprintf("rank %d", r))
		w.Thread(pid, laneStep, "step")
		w.Thread(pid, laneBackward, "backward")
		w.Thread(pid, laneCompress, "compress")
		w.Thread(pid, laneCollective, "collective")
		w.Thread(pid, laneDecompress, "decompress")
	}
	var flow uint64
	for _, ranks := range res.Trace {
		for r, s := range ranks {
			addStep(w, r+1, &s, &flow)
		}
		if err := w.EndStep(); err != nil {
			return err
		}
	}
	return w.Close()
}

// addStep adds one rank's step to w as process pid.
func addStep(w *trace.Writer, r int, s *ddp.StepStats, flow *uint64) {
	t0 := w.At(s.Start)
	w.Span(r, laneStep, fmt.Sprintf("step %d", s.Step), "step", t0, s.Wall,
		trace.Float("overlap_ratio", s.OverlapRatio), trace.Int("bytes", s.Bytes))
	if s.LastReady > s.FirstReady || s.Compute > 0 {
		w.Span(r, laneBackward, "backward", "compute", t0+s.FirstReady, s.LastReady-s.FirstReady)
	}
	for _, b := range s.Buckets {
		name := fmt.Sprintf("bucket %d", b.Index)
		args := []trace.Arg{trace.Int("bucket", int64(b.Index)), trace.Int("params", int64(b.Params)), trace.Int("bytes", b.Bytes)}
		w.Instant(r, laneStep, name+" ready", "ready", t0+b.Ready, args...)
		if b.CompressEnd > b.CompressStart {
			w.Span(r, laneCompress, name, "compress", t0+b.CompressStart, b.CompressEnd-b.CompressStart, args...)
		}
		w.Span(r, laneCollective, name, "collective", t0+b.CollectiveStart, b.CollectiveEnd-b.CollectiveStart,
			append(args, trace.Int("wire_bytes", b.WireBytes))...)
		if b.DecompressEnd > b.CollectiveEnd {
			w.Span(r, laneDecompress, name, "decompress", t0+b.CollectiveEnd, b.DecompressEnd-b.CollectiveEnd, args...)
		}
		*flow++
		w.Flow(*flow, name, "launch",
			trace.Point{Pid: r, Tid: laneStep, TS: t0 + b.Ready},
			trace.Point{Pid: r, Tid: laneCollective, TS: t0 + b.CollectiveStart})
	}
}
