package trace_test

import (
	"bytes"
	"fmt"
	"time"

	"github.com/ddpgo/ddpgo/trace"
	"github.com/ddpgo/ddpgo/trace/tracetest"
)

// Lanes of one rank, numbered from 1: Perfetto reserves pid 0 and tid 0.
const (
	laneCompute = iota + 1
	laneWait
	laneCompress
	laneCollective
	laneDecompress
)

var laneNames = []string{"", "compute", "bucket wait", "compress", "collective", "decompress"}

// bucketTiming is what a reducer knows about one bucket in one step, as
// offsets from the start of the step.
type bucketTiming struct {
	params []int           // parameter indices, in ready order
	ready  []time.Duration // when each became ready
	// Phase starts; the bucket waits from its last ready mark to launch.
	launch, collective, decompress, done time.Duration
	bytes                                int64
}

// stepTiming is one rank's step: backward until the loop calls Wait, Wait
// until every bucket is reduced, then the optimizer.
type stepTiming struct {
	backwardEnd, waitEnd, optimizerEnd time.Duration
	buckets                            []bucketTiming
}

// exampleStep is a two-bucket step; rank r runs r*1.5µs behind rank 0.
func exampleStep(rank int) stepTiming {
	us := func(f float64) time.Duration { return time.Duration(f*1000) + time.Duration(rank)*1500 }
	return stepTiming{
		backwardEnd: us(90), waitEnd: us(113.5), optimizerEnd: us(130),
		buckets: []bucketTiming{
			{params: []int{3, 2}, ready: []time.Duration{us(10), us(30)},
				launch: us(31), collective: us(35), decompress: us(60), done: us(64), bytes: 4096},
			{params: []int{1, 0}, ready: []time.Duration{us(50), us(80)},
				launch: us(81.25), collective: us(85), decompress: us(110), done: us(113.5), bytes: 8192},
		},
	}
}

// recordStep maps one rank's step, starting at t0, onto the trace; the
// rank is process rank+1.
func recordStep(w *trace.Writer, step, rank int, t0 time.Duration, st stepTiming) {
	pid := rank + 1
	w.Span(pid, laneCompute, "backward", "compute", t0, st.backwardEnd)
	w.Span(pid, laneCompute, "wait", "compute", t0+st.backwardEnd, st.waitEnd-st.backwardEnd)
	w.Span(pid, laneCompute, "optimizer", "compute", t0+st.waitEnd, st.optimizerEnd-st.waitEnd)
	for b, bt := range st.buckets {
		bucket := trace.Int("bucket", int64(b))
		for i, p := range bt.params {
			w.Instant(pid, laneCompute, fmt.Sprintf("ready p%d", p), "ready", t0+bt.ready[i], bucket)
		}
		last := bt.ready[len(bt.ready)-1]
		name := fmt.Sprintf("bucket %d", b)
		w.Span(pid, laneWait, name, "ddp", t0+last, bt.launch-last, bucket)
		w.Span(pid, laneCompress, name, "ddp", t0+bt.launch, bt.collective-bt.launch, bucket)
		w.Span(pid, laneCollective, name, "ddp", t0+bt.collective, bt.decompress-bt.collective,
			bucket, trace.Int("bytes", bt.bytes))
		w.Span(pid, laneDecompress, name, "ddp", t0+bt.decompress, bt.done-bt.decompress, bucket)
		// The arrow from the last gradient to the collective it released.
		id := uint64(step)<<32 | uint64(rank)<<16 | uint64(b)
		w.Flow(id, "launch", "ddp",
			trace.Point{Pid: pid, Tid: laneCompute, TS: t0 + last},
			trace.Point{Pid: pid, Tid: laneCollective, TS: t0 + bt.collective})
		w.Counter(pid, "bytes in flight", t0+bt.collective, trace.Int("bytes", bt.bytes))
		w.Counter(pid, "bytes in flight", t0+bt.decompress, trace.Int("bytes", 0))
	}
}

// writeExampleTrace records steps steps of two ranks into a Writer.
func writeExampleTrace(w *trace.Writer, steps int) error {
	for rank := range 2 {
		w.Process(rank+1, fmt.Sprintf("rank %d", rank))
		for tid := laneCompute; tid <= laneDecompress; tid++ {
			w.Thread(rank+1, tid, laneNames[tid])
		}
	}
	for step := range steps {
		if !w.Recording() {
			break // past the step bound: skip the work of building events
		}
		t0 := time.Duration(step) * 200 * time.Microsecond
		for rank := range 2 {
			recordStep(w, step, rank, t0, exampleStep(rank))
		}
		if err := w.EndStep(); err != nil {
			return err
		}
	}
	return w.Close()
}

// Example records a two-rank, two-bucket data-parallel step timeline with
// ready marks, per-phase lanes, launch arrows and a bytes-in-flight counter,
// then checks it.
func Example() {
	var buf bytes.Buffer
	w := trace.New(&buf, trace.Options{
		MaxSteps: 3,
		Metadata: map[string]string{"world_size": "2", "hook": "fp16"},
	})
	if err := writeExampleTrace(w, 5); err != nil {
		fmt.Println(err)
		return
	}
	sum, err := tracetest.Validate(&buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("steps %d, processes %v, lanes %d, flows %d\n", w.Steps(), sum.Pids, len(sum.Lanes), sum.Flows)
	fmt.Printf("spans %d, ready marks %d, counter samples %d\n", sum.Phases["X"], sum.Phases["i"], sum.Phases["C"])
	fmt.Printf("from %v to %v\n", sum.Start, sum.End)
	// Output:
	// steps 3, processes [1 2], lanes 10, flows 12
	// spans 66, ready marks 24, counter samples 24
	// from 0s to 531.5µs
}
