package main

import (
	"fmt"
	"io"
	"os"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/trace"
)

// writeTraceFile writes res.Trace as a Chrome trace with ddp's timeline
// of each rank's steps: one process per rank, the step and its ready
// marks, the wait, compress, collective and decompress lanes of the
// buckets, arrows from each bucket's last ready mark to its collective,
// and the bytes in flight.
//
// In a launched job each process writes its own rank's steps (first is
// its rank), to a file of its own.
func writeTraceFile(path string, o *runOpts, res *bench.Result, first int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	if err := writeTrace(f, o, res, first); err != nil {
		f.Close()
		return fmt.Errorf("--trace %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	return nil
}

func writeTrace(out io.Writer, o *runOpts, res *bench.Result, first int) error {
	opts := trace.Options{MaxSteps: -1, Metadata: map[string]string{
		"run_id": o.runID, "model": o.model.Model, "ranks": fmt.Sprint(o.ranks), "backend": o.backend.Name,
		"bucket_cap_mb": fmt.Sprint(o.bucketCapMB), "first_bucket_mb": fmt.Sprint(o.firstMB),
		"compression": o.compression, "compute": o.compute.String(),
	}}
	// The clock starts at the earliest rank's first traced step.
	if len(res.Trace) > 0 {
		opts.Start = res.Trace[0][0].Start
		for _, s := range res.Trace[0] {
			if s.Start.Before(opts.Start) {
				opts.Start = s.Start
			}
		}
	}
	params := make([]ddp.Param, len(o.model.Params))
	for i, p := range o.model.Params {
		params[i] = ddp.Param{Name: p.Name, Shape: p.Shape}
	}
	w := trace.New(out, opts)
	for _, ranks := range res.Trace {
		for r := range ranks {
			ddp.WriteTimeline(w, first+r, &ranks[r], params)
		}
		if err := w.EndStep(); err != nil {
			return err
		}
	}
	return w.Close()
}
