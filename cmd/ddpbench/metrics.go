package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// stepMetrics are the per-rank series ddpbench exports from each step's
// statistics.
type stepMetrics struct {
	steps     *prometheus.CounterVec
	stepTime  *prometheus.HistogramVec
	compute   *prometheus.HistogramVec
	commTime  *prometheus.HistogramVec
	overlap   *prometheus.GaugeVec
	bytes     *prometheus.CounterVec
	overflows *prometheus.CounterVec
	buckets   *prometheus.GaugeVec
	rankLabel []string
}

func newStepMetrics(reg prometheus.Registerer, ranks int) (*stepMetrics, error) {
	buckets := prometheus.ExponentialBuckets(1e-4, 2, 18) // 100 us .. 13 s
	m := &stepMetrics{
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ddpgo_steps_total",
			Help: "Synced DDP steps completed, by rank."}, []string{"rank"}),
		stepTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ddpgo_step_seconds",
			Help: "Step wall time, Begin to the end of Wait.", Buckets: buckets}, []string{"rank"}),
		compute: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ddpgo_backward_seconds",
			Help: "Backward compute as the reducer sees it: first to last gradient ready.", Buckets: buckets}, []string{"rank"}),
		commTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ddpgo_comm_seconds",
			Help: "Time during which at least one bucket was being reduced.", Buckets: buckets}, []string{"rank"}),
		overlap: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ddpgo_overlap_ratio",
			Help: "Communication hidden behind backward compute over communication, last step."}, []string{"rank"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ddpgo_comm_bytes_total",
			Help: "Payload bytes handed to collectives."}, []string{"rank"}),
		overflows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ddpgo_compression_overflows_total",
			Help: "Gradient elements that overflowed to infinity when compressed to fp16/bf16."}, []string{"rank"}),
		buckets: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ddpgo_buckets",
			Help: "Buckets in the current layout."}, []string{"rank"}),
	}
	for _, c := range []prometheus.Collector{m.steps, m.stepTime, m.compute, m.commTime, m.overlap, m.bytes, m.overflows, m.buckets} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for r := range ranks {
		m.rankLabel = append(m.rankLabel, strconv.Itoa(r))
	}
	return m, nil
}

// observe records one step of one rank.
func (m *stepMetrics) observe(rank int, s *ddp.StepStats) {
	l := m.rankLabel[rank]
	m.steps.WithLabelValues(l).Inc()
	m.stepTime.WithLabelValues(l).Observe(s.Wall.Seconds())
	m.compute.WithLabelValues(l).Observe(s.Compute.Seconds())
	m.commTime.WithLabelValues(l).Observe(s.Comm.Seconds())
	m.overlap.WithLabelValues(l).Set(s.OverlapRatio)
	m.bytes.WithLabelValues(l).Add(float64(s.Bytes))
	m.overflows.WithLabelValues(l).Add(float64(s.Overflows))
	m.buckets.WithLabelValues(l).Set(float64(len(s.Buckets)))
}

// serveMetrics serves /metrics on addr from a registry of its own holding
// each rank's CommPool collector and the step series. It returns the
// per-step callback that feeds them and a stop function (idempotent).
func serveMetrics(addr string, pools []*allocator.Pool, log io.Writer) (func(int, bool, *ddp.StepStats), func(), error) {
	reg := prometheus.NewRegistry()
	for r, p := range pools {
		if err := reg.Register(ddp.NewPoolCollector(p, prometheus.Labels{"rank": strconv.Itoa(r)})); err != nil {
			return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	m, err := newStepMetrics(reg, len(pools))
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, usagef("--metrics-addr %q: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(log, "ddpbench: metrics server: %v\n", err)
		}
	}()
	fmt.Fprintf(log, "ddpbench: serving metrics on http://%s/metrics\n", ln.Addr())
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
			<-done
		})
	}
	return func(rank int, _ bool, s *ddp.StepStats) { m.observe(rank, s) }, stop, nil
}
