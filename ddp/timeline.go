package ddp

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/ddpgo/ddpgo/trace"
)

// Lanes of a rank's timeline (trace thread ids). A phase whose spans of
// two buckets overlap in time (the wait of a bucket that is complete
// before an earlier bucket has launched, say) spills into further lanes
// of the same kind, numbered base+1, base+2, ...; LaneStride apart leaves
// room for them.
const (
	LaneCompute    = 1                // the step, gradient-ready marks, arrow starts
	LaneWait       = 1 + 1*LaneStride // bucket complete -> launched
	LaneCompress   = 1 + 2*LaneStride // hook: conversion to the wire type
	LaneCollective = 1 + 3*LaneStride // the collective on the wire
	LaneDecompress = 1 + 4*LaneStride // hook: back to float32
	LaneGather     = 1 + 5*LaneStride // Options.Shard: the parameters' all-gather
	LaneStride     = 1 << 10
)

// TimelinePid returns the trace process id of rank: rank+1, since viewers
// reserve pid 0.
func TimelinePid(rank int) int { return rank + 1 }

// WriteTimeline records one rank's step s, as returned by Reducer.Stats or
// StatsInto, on w: process "rank N" with
//
//   - a compute lane holding a span for the whole step (Begin to the end of
//     Wait) and an instant per parameter marked ready, named after params
//     (nil: by index);
//   - per bucket, spans on the wait lane (complete to launched), the
//     compress lane, the collective lane and the decompress lane, and with
//     Options.Shard the gather lane (the parameters' all-gather); phases
//     a hook does not have are left out;
//   - an arrow from the bucket's last ready mark to its collective;
//   - a "bytes in flight" counter: the wire bytes of the collectives
//     running at each moment.
//
// Times are placed with w.At(s.Start), so ranks and steps recorded on one
// Writer share a clock. Spans on one lane never overlap. WriteTimeline
// does not end the Writer's step: record every rank's step, then call
// w.EndStep (or leave the events buffered until w.Close).
func WriteTimeline(w *trace.Writer, rank int, s *StepStats, params []Param) {
	if !w.Recording() {
		return
	}
	pid := TimelinePid(rank)
	t0 := w.At(s.Start)
	w.Process(pid, fmt.Sprintf("rank %d", rank))
	w.Thread(pid, LaneCompute, "compute")

	name := fmt.Sprintf("step %d", s.Step)
	if !s.Sync {
		name += " (no sync)"
	}
	w.Span(pid, LaneCompute, name, "step", t0, s.Wall,
		trace.Int("step", int64(s.Step)),
		trace.Float("backward_us", micros(s.Compute)),
		trace.Float("comm_us", micros(s.Comm)),
		trace.Float("overlap_ratio", s.OverlapRatio),
		trace.Int("wire_bytes", s.Bytes))
	for i, t := range s.ParamReady {
		if t < 0 {
			continue
		}
		pname := fmt.Sprintf("param %d", i)
		if i < len(params) && params[i].Name != "" {
			pname = params[i].Name
		}
		kind := "ready"
		if slices.Contains(s.Unused, i) {
			kind = "unused"
		}
		w.Instant(pid, LaneCompute, kind+" "+pname, kind, t0+t, trace.Int("param", int64(i)))
	}
	if !s.Sync || len(s.Buckets) == 0 {
		return
	}

	var lanes laneSplitter
	for i := range s.Buckets {
		b := &s.Buckets[i]
		bname := fmt.Sprintf("bucket %d", b.Index)
		bucketArg := trace.Int("bucket", int64(b.Index))
		phase := func(base int, lane string, start, end time.Duration, args ...trace.Arg) int {
			if end <= start {
				return 0
			}
			tid := lanes.place(base, start, end)
			if tid == base {
				w.Thread(pid, tid, lane)
			} else {
				w.Thread(pid, tid, fmt.Sprintf("%s %d", lane, tid-base+1))
			}
			w.Span(pid, tid, bname, "ddp", t0+start, end-start, args...)
			return tid
		}
		phase(LaneWait, "bucket wait", b.Ready, b.Launch, bucketArg, trace.Int("params", int64(b.Params)))
		phase(LaneCompress, "compress", b.CompressStart, b.CompressEnd, bucketArg)
		// A collective always gets a span, at least 1ns long, so that the
		// arrow has a span to land on.
		collEnd := max(b.CollectiveEnd, b.CollectiveStart+1)
		collTid := phase(LaneCollective, "collective", b.CollectiveStart, collEnd, bucketArg,
			trace.Int("wire_bytes", b.WireBytes), trace.Int("bytes", b.Bytes), trace.Int("overflows", b.Overflows))
		phase(LaneDecompress, "decompress", b.CollectiveEnd, b.DecompressEnd, bucketArg)
		phase(LaneGather, "gather", b.GatherStart, b.GatherEnd, bucketArg, trace.Int("gather_bytes", b.GatherBytes))

		from := trace.Point{Pid: pid, Tid: LaneCompute, TS: t0 + min(b.Ready, b.CollectiveStart)}
		to := trace.Point{Pid: pid, Tid: collTid, TS: t0 + b.CollectiveStart}
		w.Flow(flowID(s.Step, rank, b.Index), "launch", "ddp", from, to)
	}
	writeInFlight(w, pid, t0, s)
}

// flowID makes a bucket's arrow id unique among steps, ranks and buckets.
func flowID(step uint64, rank, bucket int) uint64 {
	return step<<32 | uint64(rank&0xffff)<<16 | uint64(bucket&0xffff)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// laneSplitter assigns spans to lanes of a kind so that spans on one lane
// never overlap: the first lane of the kind on which the span overlaps
// nothing, else a new one. Spans may be placed in any order (buckets are
// visited by index, not by time).
type laneSplitter struct {
	spans map[int][][]interval // base -> per lane, its spans so far
}

type interval struct{ start, end time.Duration }

func (l *laneSplitter) place(base int, start, end time.Duration) int {
	if l.spans == nil {
		l.spans = make(map[int][][]interval)
	}
	lanes := l.spans[base]
	for j, lane := range lanes {
		if !slices.ContainsFunc(lane, func(o interval) bool { return o.start < end && start < o.end }) {
			lanes[j] = append(lane, interval{start, end})
			return base + j
		}
	}
	if len(lanes) == LaneStride-1 {
		// Out of lanes: stack on the last one. Only a step with about a
		// thousand simultaneously waiting buckets gets here.
		lanes[len(lanes)-1] = append(lanes[len(lanes)-1], interval{start, end})
		return base + len(lanes) - 1
	}
	l.spans[base] = append(lanes, []interval{{start, end}})
	return base + len(lanes)
}

// writeInFlight records the bytes-in-flight counter of a step: the sum of
// the wire bytes of the collectives running at each moment, from 0 at the
// step's start back to 0 at its end.
func writeInFlight(w *trace.Writer, pid int, t0 time.Duration, s *StepStats) {
	type change struct {
		at    time.Duration
		delta int64
	}
	changes := make([]change, 0, 2*len(s.Buckets))
	for i := range s.Buckets {
		b := &s.Buckets[i]
		end := max(b.CollectiveEnd, b.CollectiveStart+1)
		changes = append(changes, change{b.CollectiveStart, b.WireBytes}, change{end, -b.WireBytes})
	}
	slices.SortStableFunc(changes, func(a, b change) int { return cmp.Compare(a.at, b.at) })
	const name = "bytes in flight"
	w.Counter(pid, name, t0, trace.Int("bytes", 0))
	var cur int64
	for i, c := range changes {
		cur += c.delta
		if i+1 < len(changes) && changes[i+1].at == c.at {
			continue // one sample per instant, after all its changes
		}
		w.Counter(pid, name, t0+c.at, trace.Int("bytes", cur))
	}
}
