package ddp

import (
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// StepStats describes one step. Durations named as points in time (Ready,
// Launch, ...) are offsets from Start, taken from the monotonic clock.
type StepStats struct {
	Step  uint64    // 1 for the first step begun
	Sync  bool      // a synced step (false: no-sync, nothing communicated)
	Start time.Time // when Begin returned
	// Active is, with Options.Join, the number of ranks that contributed
	// gradients to the step (the others had joined); 0 without Join.
	Active int
	// Joined marks a step this rank shadowed inside Join, contributing
	// zeros.
	Joined bool
	// ZeroComm is the time the launcher spent zeroing
	// stale gradients (parameters marked ready, by the caller or as
	// unused, with no Grad, SetGrad or AddGrad since the last synced
	// step) before reducing their buckets: the sum of BucketStats.Zero.
	ZeroComm time.Duration

	Wall       time.Duration // Begin to the end of Wait
	FirstReady time.Duration // first parameter marked ready by the caller
	LastReady  time.Duration // last parameter marked ready by the caller
	// Compute is LastReady - FirstReady: the backward pass as the Reducer
	// sees it.
	Compute time.Duration
	// Comm is the time during which at least one bucket was being reduced
	// (the union of the buckets' [Launch, Done] intervals).
	Comm time.Duration
	// Overlap is the part of Comm before LastReady: communication hidden
	// behind backward compute.
	Overlap time.Duration
	// OverlapRatio is Overlap / Comm (0 when Comm is 0).
	OverlapRatio float64
	Bytes        int64 // payload bytes handed to collectives (after compression)
	Overflows    int64 // elements that overflowed to ±Inf in compression (see hooks.Bucket)

	Buckets []BucketStats // per bucket of the layout used in the step
	// ParamReady is, per parameter, when it was marked ready, or -1 if it
	// was not (a no-sync step may leave parameters unmarked).
	ParamReady []time.Duration
	// Unused lists the parameters that got no Ready from the caller and
	// were marked by the Reducer (FindUnusedParameters, StaticGraph).
	Unused []int
}

// Stats returns a copy of the statistics of the last completed step, with
// slices of its own, which no later step touches; it allocates them.
// StatsInto copies into the caller's StepStats instead, reusing its
// slices, and allocates nothing once they are large enough. Neither may
// run concurrently with Wait or Begin: call them from the training
// goroutine (a metrics exporter on another goroutine takes the copy it is
// handed).
func (r *Reducer) Stats() StepStats {
	var s StepStats
	r.StatsInto(&s)
	return s
}

// StatsInto copies the statistics of the last completed step into dst,
// reusing dst's slices.
func (r *Reducer) StatsInto(dst *StepStats) {
	b, p, u := dst.Buckets, dst.ParamReady, dst.Unused
	*dst = *r.last
	dst.Buckets = append(b[:0], r.last.Buckets...)
	dst.ParamReady = append(p[:0], r.last.ParamReady...)
	dst.Unused = append(u[:0], r.last.Unused...)
}

// BucketStats is the timeline of one bucket in a step, as offsets from the
// step's Start.
type BucketStats struct {
	Index  int
	Params int        // parameters in the bucket
	Bytes  int64      // gradient bytes in the bucket
	DType  comm.DType // the gradients' dtype
	Wire   comm.DType // the dtype the hook puts on the wire (Hook.Wire)

	Ready  time.Duration // the bucket's last parameter was marked ready
	Launch time.Duration // the launcher took it up
	// Zero is the time spent, after Launch and before the hook, zeroing
	// the bucket's stale gradients (see StepStats.ZeroComm).
	Zero            time.Duration
	CompressStart   time.Duration // the hook's Launch began (compression, if any)
	CompressEnd     time.Duration // the hook's Launch returned
	CollectiveStart time.Duration // the collective was issued (= CompressEnd)
	CollectiveEnd   time.Duration // the finisher saw the collective complete
	DecompressEnd   time.Duration // the hook's Finish returned
	Done            time.Duration // the bucket holds the average
	WireBytes       int64         // payload bytes handed to collectives
	Overflows       int64
	// With Options.Shard: the all-gather of the bucket's parameters was
	// issued and seen complete, and the bytes this rank contributed.
	GatherStart, GatherEnd time.Duration
	GatherBytes            int64
}

// Latency is the time from the bucket being complete to it being reduced.
func (b BucketStats) Latency() time.Duration { return b.Done - b.Ready }

// reset prepares s for a new step over n parameters.
func (s *StepStats) reset(step uint64, sync bool, n int) {
	b, p, u := s.Buckets, s.ParamReady, s.Unused
	*s = StepStats{Step: step, Sync: sync}
	s.Buckets = b[:0]
	s.ParamReady = p[:n]
	for i := range s.ParamReady {
		s.ParamReady[i] = -1
	}
	s.Unused = u[:0]
}

// finalize computes the step's totals from the per-parameter and
// per-bucket records.
func (s *StepStats) finalize(L *layout, unused []bool) {
	first, last := time.Duration(-1), time.Duration(-1)
	for i, t := range s.ParamReady {
		if t < 0 || unused[i] {
			continue
		}
		if first < 0 || t < first {
			first = t
		}
		last = max(last, t)
	}
	if first < 0 {
		first, last = 0, 0
	}
	s.FirstReady, s.LastReady, s.Compute = first, last, last-first
	if !s.Sync {
		s.Buckets = s.Buckets[:0]
		return
	}
	// The union of the busy intervals; buckets launch in index order, so
	// their intervals are sorted by start.
	var comm, hidden, end time.Duration
	for k := range s.Buckets {
		b := &s.Buckets[k]
		b.Ready = 0
		for _, p := range L.buckets[k].Tensors {
			b.Ready = max(b.Ready, s.ParamReady[p])
		}
		s.Bytes += b.WireBytes
		s.ZeroComm += b.Zero
		s.Overflows += b.Overflows
		lo, hi := max(b.Launch, end), b.Done
		if hi <= lo {
			continue
		}
		comm += hi - lo
		if lo < last {
			hidden += min(hi, last) - lo
		}
		end = hi
	}
	s.Comm, s.Overlap = comm, hidden
	if comm > 0 {
		s.OverlapRatio = float64(hidden) / float64(comm)
	}
}
