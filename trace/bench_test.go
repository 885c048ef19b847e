package trace_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/trace"
	"github.com/ddpgo/ddpgo/trace/tracetest"
)

// BenchmarkStep records and writes one step of a 64-bucket rank: per
// bucket a ready mark, four phase spans, a flow and two counter samples.
func BenchmarkStep(b *testing.B) {
	const buckets = 64
	w := trace.New(io.Discard, trace.Options{MaxSteps: -1})
	w.Process(1, "rank 0")
	for tid := laneCompute; tid <= laneDecompress; tid++ {
		w.Thread(1, tid, laneNames[tid])
	}
	events := 0
	for b.Loop() {
		events = 0
		for k := range buckets {
			t := time.Duration(k) * 100 * time.Microsecond
			bucket := trace.Int("bucket", int64(k))
			w.Instant(1, laneCompute, "ready", "ready", t, bucket)
			w.Span(1, laneWait, "bucket", "ddp", t, 1000, bucket)
			w.Span(1, laneCompress, "bucket", "ddp", t+1000, 4000, bucket)
			w.Span(1, laneCollective, "bucket", "ddp", t+5000, 25000, bucket, trace.Int("bytes", 1<<20))
			w.Span(1, laneDecompress, "bucket", "ddp", t+30000, 4000, bucket)
			w.Flow(uint64(k), "launch", "ddp", trace.Point{Pid: 1, Tid: laneCompute, TS: t}, trace.Point{Pid: 1, Tid: laneCollective, TS: t + 5000})
			w.Counter(1, "bytes in flight", t+5000, trace.Int("bytes", 1<<20))
			w.Counter(1, "bytes in flight", t+30000, trace.Int("bytes", 0))
			events += 9
		}
		if err := w.EndStep(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
}

// BenchmarkValidate checks fifty steps of the example trace.
func BenchmarkValidate(b *testing.B) {
	var buf bytes.Buffer
	if err := writeExampleTrace(trace.New(&buf, trace.Options{MaxSteps: -1}), 50); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := tracetest.Validate(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
