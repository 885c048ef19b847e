// Package metrics exports a ddp.Reducer's step statistics, and its
// CommPool's, as Prometheus metrics. It is a package of its own so that a
// program using ddp links Prometheus, protobuf and net/http only if it
// imports this one.
package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics exports one rank's step statistics as Prometheus metrics. Every
// series carries a constant label rank, so the Metrics of several ranks
// (inproc ranks of one process) can share a registry. Feed it with Observe
// after each Wait:
//
//	m, err := metrics.New(prometheus.DefaultRegisterer, rank)
//	...
//	r.Wait(ctx)
//	r.StatsInto(&s)
//	m.Observe(&s)
//
// The series (label names bounded: rank, bucket index, wire dtype, sync):
//
//	ddpgo_steps_total{rank,sync}                           counter
//	ddpgo_step_duration_seconds{rank}                      histogram: Begin to the end of Wait
//	ddpgo_backward_duration_seconds{rank}                  histogram: first to last gradient ready
//	ddpgo_comm_duration_seconds{rank}                      histogram: time with a bucket in reduction
//	ddpgo_exposed_comm_duration_seconds{rank}              histogram: communication not hidden by backward
//	ddpgo_bucket_allreduce_duration_seconds{rank,bucket}   histogram: the collective of one bucket
//	ddpgo_bucket_latency_seconds{rank,bucket}              histogram: bucket complete to bucket reduced
//	ddpgo_collective_bytes_total{rank,dtype}               counter: payload handed to collectives
//	ddpgo_gradient_bytes_total{rank}                       counter: gradient bytes reduced
//	ddpgo_overlap_ratio{rank}                              gauge: last step's hidden share of communication
//	ddpgo_fp16_overflows_total{rank}                       counter: values that overflowed in compression
//
// The dtype of ddpgo_collective_bytes_total is each bucket's wire dtype,
// as its hook reports it (ddp.BucketStats.Wire), spelled as
// comm.DType.String does ("float", "half", "bfloat16", "double"). Use
// NewPoolCollector for the CommPool's memory.
type Metrics struct {
	mu sync.Mutex // Observe may be called from several goroutines

	synced, local prometheus.Counter
	step, backward, commTime,
	exposed prometheus.Observer
	grad, overflows prometheus.Counter
	overlap         prometheus.Gauge

	wireBytes          *prometheus.CounterVec
	allreduce, latency *prometheus.HistogramVec
	// Children resolved the first time a bucket index or a wire dtype is
	// seen, so that Observe allocates nothing afterwards.
	allreduceObs, latencyObs []prometheus.Observer
	wire                     [256]prometheus.Counter // by comm.DType
}

// DurationBuckets are the histogram bounds of Metrics' durations, in
// seconds: 10 µs to about 42 s, a factor of 4 apart.
var DurationBuckets = prometheus.ExponentialBuckets(10e-6, 4, 12)

// New registers rank's collectors on reg and returns them. Calling New
// again for the same rank on the same registry returns Metrics sharing
// the already registered collectors (a Reducer rebuilt after a failure
// keeps its counters). A nil reg registers nothing.
func New(reg prometheus.Registerer, rank int) (*Metrics, error) {
	if rank < 0 {
		return nil, fmt.Errorf("metrics: rank %d: want a non-negative rank", rank)
	}
	labels := prometheus.Labels{"rank": strconv.Itoa(rank)}
	hist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: name, Help: help, ConstLabels: labels, Buckets: DurationBuckets,
		})
	}
	bucketHist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: name, Help: help, ConstLabels: labels, Buckets: DurationBuckets,
		}, []string{"bucket"})
	}
	steps := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ddpgo_steps_total", Help: "Steps completed, synced (gradients averaged) or not (no-sync, local accumulation).", ConstLabels: labels,
	}, []string{"sync"})
	step := hist("ddpgo_step_duration_seconds", "Duration of synced steps, from Begin to the end of Wait.")
	backward := hist("ddpgo_backward_duration_seconds", "Backward compute of synced steps as the reducer sees it: first to last gradient marked ready.")
	commTime := hist("ddpgo_comm_duration_seconds", "Time during which at least one bucket was being reduced, per synced step.")
	exposed := hist("ddpgo_exposed_comm_duration_seconds", "Communication not hidden behind backward compute, per synced step.")
	allreduce := bucketHist("ddpgo_bucket_allreduce_duration_seconds", "Duration of one bucket's collective, per synced step.")
	latency := bucketHist("ddpgo_bucket_latency_seconds", "Time from a bucket's last gradient being marked ready to the bucket holding the average.")
	wireBytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ddpgo_collective_bytes_total", Help: "Payload bytes handed to collectives (after compression), by wire dtype.", ConstLabels: labels,
	}, []string{"dtype"})
	gradBytes := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ddpgo_gradient_bytes_total", Help: "Gradient bytes averaged across ranks (before compression).", ConstLabels: labels,
	})
	overlap := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ddpgo_overlap_ratio", Help: "Share of the last synced step's communication time hidden behind backward compute (0 to 1).", ConstLabels: labels,
	})
	overflows := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ddpgo_fp16_overflows_total", Help: "Gradient elements that became infinite when compressed to float16 or bfloat16, or in the compressed sum.", ConstLabels: labels,
	})

	if reg != nil {
		g := registrar{reg: reg, rank: rank}
		steps = register(&g, steps)
		step = register(&g, step)
		backward = register(&g, backward)
		commTime = register(&g, commTime)
		exposed = register(&g, exposed)
		allreduce = register(&g, allreduce)
		latency = register(&g, latency)
		wireBytes = register(&g, wireBytes)
		gradBytes = register(&g, gradBytes)
		overlap = register(&g, overlap)
		overflows = register(&g, overflows)
		if g.err != nil {
			return nil, g.err
		}
	}
	return &Metrics{
		synced: steps.WithLabelValues("true"), local: steps.WithLabelValues("false"),
		step: step, backward: backward, commTime: commTime, exposed: exposed,
		wireBytes: wireBytes, grad: gradBytes,
		overflows: overflows, overlap: overlap,
		allreduce: allreduce, latency: latency,
	}, nil
}

// registrar registers collectors and keeps the first error.
type registrar struct {
	reg  prometheus.Registerer
	rank int
	err  error
}

// register registers c and returns it or, if an equal collector (same
// name, help, labels and type) is already registered, that one.
func register[T prometheus.Collector](g *registrar, c T) T {
	if g.err != nil {
		return c
	}
	err := g.reg.Register(c)
	if err == nil {
		return c
	}
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		if existing, ok := dup.ExistingCollector.(T); ok {
			return existing
		}
	}
	g.err = fmt.Errorf("metrics: registering the metrics of rank %d: %w", g.rank, err)
	return c
}

// Observe records one completed step, as Reducer.StatsInto (or Stats)
// gives it: call it after Wait, or after the Begin that ends a no-sync
// step. It takes a lock, and allocates only the first time it sees a
// bucket index or a wire dtype.
func (m *Metrics) Observe(s *ddp.StepStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !s.Sync {
		m.local.Inc()
		return
	}
	m.synced.Inc()
	m.step.Observe(s.Wall.Seconds())
	m.backward.Observe(s.Compute.Seconds())
	m.commTime.Observe(s.Comm.Seconds())
	m.exposed.Observe(max(s.Comm-s.Overlap, 0).Seconds())
	m.overlap.Set(s.OverlapRatio)
	m.overflows.Add(float64(s.Overflows))
	var grad int64
	for i := range s.Buckets {
		b := &s.Buckets[i]
		grad += b.Bytes
		for len(m.allreduceObs) <= b.Index {
			k := strconv.Itoa(len(m.allreduceObs))
			m.allreduceObs = append(m.allreduceObs, m.allreduce.WithLabelValues(k))
			m.latencyObs = append(m.latencyObs, m.latency.WithLabelValues(k))
		}
		m.allreduceObs[b.Index].Observe(seconds(b.CollectiveEnd - b.CollectiveStart))
		m.latencyObs[b.Index].Observe(seconds(b.Done - b.Ready))
		wire := b.Wire
		if wire == 0 {
			wire = comm.Float32 // as a Param's DType 0 is
		}
		if m.wire[wire] == nil {
			m.wire[wire] = m.wireBytes.WithLabelValues(wire.String())
		}
		m.wire[wire].Add(float64(b.WireBytes))
	}
	m.grad.Add(float64(grad))
}

func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }

// PoolCollector exports a CommPool's statistics, read from Pool.Stats at
// every scrape: bytes in use, peak bytes, bytes mapped and their limit,
// slabs, outstanding blocks, and counters of gets (by hit or miss), puts,
// exhausted gets and trimmed bytes. Every series carries the collector's
// constant labels (for example the rank, when each rank has its own pool).
type PoolCollector struct {
	pool *allocator.Pool

	inUse, peak, mapped, limit, slabs, blocks *prometheus.Desc
	gets, puts, exhausted, trimmed            *prometheus.Desc
}

// NewPoolCollector returns a collector of p's statistics whose series carry
// labels. Register it on a prometheus.Registerer.
func NewPoolCollector(p *allocator.Pool, labels prometheus.Labels) *PoolCollector {
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc("ddpgo_commpool_"+name, help, variable, labels)
	}
	return &PoolCollector{
		pool:      p,
		inUse:     d("bytes_in_use", "Bytes in blocks handed out by the communication buffer pool and not yet returned."),
		peak:      d("peak_bytes", "The largest value bytes in use has reached."),
		mapped:    d("mapped_bytes", "Bytes the pool has mapped from its memory source."),
		limit:     d("limit_bytes", "The limit on the bytes the pool may map."),
		slabs:     d("slabs", "Slabs currently mapped by the pool."),
		blocks:    d("blocks", "Blocks handed out and not yet returned."),
		gets:      d("gets_total", "Successful block requests, by whether they were served from mapped memory (hit) or mapped a new slab (miss).", "result"),
		puts:      d("puts_total", "Blocks returned to the pool."),
		exhausted: d("exhausted_total", "Block requests refused because the pool's limit was reached."),
		trimmed:   d("trimmed_bytes_total", "Bytes the pool has returned to its memory source."),
	}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inUse, c.peak, c.mapped, c.limit, c.slabs, c.blocks, c.gets, c.puts, c.exhausted, c.trimmed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(c.inUse, float64(s.InUse))
	gauge(c.peak, float64(s.Peak))
	gauge(c.mapped, float64(s.Mapped))
	gauge(c.limit, float64(s.Limit))
	gauge(c.slabs, float64(s.Slabs))
	gauge(c.blocks, float64(s.Blocks))
	counter(c.gets, float64(s.Hits), "hit")
	counter(c.gets, float64(s.Misses), "miss")
	counter(c.puts, float64(s.Puts))
	counter(c.exhausted, float64(s.Exhausted))
	counter(c.trimmed, float64(s.Trimmed))
}
