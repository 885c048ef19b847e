package metrics

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// observedRun runs real synced steps: ranks ranks over an inproc group,
// four parameters in several buckets, gradients marked last parameter
// first with a short pause between them so that buckets overlap with the
// remaining "backward". It returns each rank's statistics of every step.
func observedRun(t testing.TB, ranks, steps int, hook func() hooks.Hook) [][]ddp.StepStats {
	t.Helper()
	cs, err := inproc.NewGroup(ranks)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	params := []ddp.Param{{Name: "w1", Shape: []int{64, 32}}, {Name: "b1", Shape: []int{64}}, {Name: "w2", Shape: []int{10, 64}}, {Name: "b2", Shape: []int{10}}}
	out := make([][]ddp.StepStats, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for rank, c := range cs {
		wg.Go(func() {
			errs[rank] = func() error {
				r, err := ddp.New(context.Background(), c, params, ddp.Options{Hook: hook(), BucketCap: 1 << 10, FirstBucketCap: 1 << 10})
				if err != nil {
					return err
				}
				defer r.Close()
				for step := range steps {
					if err := r.Begin(ddp.Sync); err != nil {
						return err
					}
					for i := len(params) - 1; i >= 0; i-- {
						g, err := r.Grad(i)
						if err != nil {
							return err
						}
						for k := range g {
							g[k] = float32(rank+1) * float32(k%7) / float32(step+1)
						}
						if err := r.Ready(i); err != nil {
							return err
						}
						time.Sleep(50 * time.Microsecond)
					}
					if err := r.Wait(context.Background()); err != nil {
						return err
					}
					out[rank] = append(out[rank], r.Stats())
				}
				return r.Close()
			}()
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	return out
}

func TestPoolCollector(t *testing.T) {
	pool, err := allocator.New(allocator.Options{Limit: 4 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	a, err := pool.Get(1000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Get(3 << 20) // larger than a slab: a dedicated one
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Put(b); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Get(8 << 20); err == nil {
		t.Fatal("a Get beyond the limit succeeded")
	}
	st := pool.Stats()

	c := NewPoolCollector(pool, prometheus.Labels{"rank": "3"})
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	want := `
# HELP ddpgo_commpool_bytes_in_use Bytes in blocks handed out by the communication buffer pool and not yet returned.
# TYPE ddpgo_commpool_bytes_in_use gauge
ddpgo_commpool_bytes_in_use{rank="3"} 1024
# HELP ddpgo_commpool_blocks Blocks handed out and not yet returned.
# TYPE ddpgo_commpool_blocks gauge
ddpgo_commpool_blocks{rank="3"} 1
# HELP ddpgo_commpool_gets_total Successful block requests, by whether they were served from mapped memory (hit) or mapped a new slab (miss).
# TYPE ddpgo_commpool_gets_total counter
ddpgo_commpool_gets_total{rank="3",result="hit"} HITS
ddpgo_commpool_gets_total{rank="3",result="miss"} MISSES
# HELP ddpgo_commpool_exhausted_total Block requests refused because the pool's limit was reached.
# TYPE ddpgo_commpool_exhausted_total counter
ddpgo_commpool_exhausted_total{rank="3"} 1
`
	want = strings.NewReplacer("HITS", itoa(st.Hits), "MISSES", itoa(st.Misses)).Replace(want)
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"ddpgo_commpool_bytes_in_use", "ddpgo_commpool_blocks", "ddpgo_commpool_gets_total", "ddpgo_commpool_exhausted_total"); err != nil {
		t.Fatal(err)
	}
	if st.Hits+st.Misses != 2 {
		t.Fatalf("pool counted %d hits + %d misses for 2 successful gets", st.Hits, st.Misses)
	}
	for name, v := range map[string]float64{
		"ddpgo_commpool_peak_bytes":   float64(st.Peak),
		"ddpgo_commpool_mapped_bytes": float64(st.Mapped),
		"ddpgo_commpool_limit_bytes":  4 << 20,
		"ddpgo_commpool_slabs":        float64(st.Slabs),
	} {
		if got := gaugeValue(t, c, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	if st.Peak < 1024+3<<20 {
		t.Errorf("peak %d below the two blocks held at once", st.Peak)
	}

	// Two ranks' collectors on one registry differ by their rank label.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c, NewPoolCollector(pool, prometheus.Labels{"rank": "4"}))
	if n, err := testutil.GatherAndCount(reg, "ddpgo_commpool_slabs"); err != nil || n != 2 {
		t.Fatalf("gathered %d slabs series (%v), want 2", n, err)
	}
	if err := pool.Put(a); err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, c, "ddpgo_commpool_bytes_in_use"); got != 0 {
		t.Fatalf("bytes in use after the last Put = %v, want 0", got)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// gaugeValue returns the value of the single series of gauge (or counter)
// name that c collects.
func gaugeValue(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		if len(mf.Metric) != 1 {
			t.Fatalf("%s has %d series, want 1", name, len(mf.Metric))
		}
		m := mf.Metric[0]
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
		t.Fatalf("%s is neither a gauge nor a counter", name)
	}
	t.Fatalf("%s not collected", name)
	return 0
}

// metricStats is a synthetic step: two buckets with known timings, half
// on the wire.
func metricStats(step uint64) *ddp.StepStats {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	return &ddp.StepStats{
		Step: step, Sync: true, Wall: us(1000), FirstReady: us(100), LastReady: us(700),
		Compute: us(600), Comm: us(500), Overlap: us(200), OverlapRatio: 0.4,
		Bytes: 3000, Overflows: 2,
		Buckets: []ddp.BucketStats{
			{Index: 0, Params: 2, Bytes: 4000, DType: comm.Float32, Wire: comm.Float16, Ready: us(300), Launch: us(310), CollectiveStart: us(320), CollectiveEnd: us(420), Done: us(430), WireBytes: 2000, Overflows: 2},
			{Index: 1, Params: 1, Bytes: 2000, DType: comm.Float32, Wire: comm.Float16, Ready: us(700), Launch: us(710), CollectiveStart: us(720), CollectiveEnd: us(920), Done: us(950), WireBytes: 1000},
		},
	}
}

// histogram returns the sample count and sum of the histogram series of
// name whose labels include want.
func histogram(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			if hasLabels(m, want) {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatalf("no %s%v", name, want)
	return 0, 0
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.Label {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

func TestMetricsValues(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m0, err := New(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	m1, err := New(reg, 1)
	if err != nil {
		t.Fatal(err)
	}
	for step := range uint64(3) {
		m0.Observe(metricStats(step + 1))
	}
	m0.Observe(&ddp.StepStats{Step: 4}) // a no-sync step
	last := metricStats(5)
	last.OverlapRatio = 0.25
	m1.Observe(last)

	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	want := `
# HELP ddpgo_collective_bytes_total Payload bytes handed to collectives (after compression), by wire dtype.
# TYPE ddpgo_collective_bytes_total counter
ddpgo_collective_bytes_total{dtype="half",rank="0"} 9000
ddpgo_collective_bytes_total{dtype="half",rank="1"} 3000
# HELP ddpgo_fp16_overflows_total Gradient elements that became infinite when compressed to float16 or bfloat16, or in the compressed sum.
# TYPE ddpgo_fp16_overflows_total counter
ddpgo_fp16_overflows_total{rank="0"} 6
ddpgo_fp16_overflows_total{rank="1"} 2
# HELP ddpgo_gradient_bytes_total Gradient bytes averaged across ranks (before compression).
# TYPE ddpgo_gradient_bytes_total counter
ddpgo_gradient_bytes_total{rank="0"} 18000
ddpgo_gradient_bytes_total{rank="1"} 6000
# HELP ddpgo_overlap_ratio Share of the last synced step's communication time hidden behind backward compute (0 to 1).
# TYPE ddpgo_overlap_ratio gauge
ddpgo_overlap_ratio{rank="0"} 0.4
ddpgo_overlap_ratio{rank="1"} 0.25
# HELP ddpgo_steps_total Steps completed, synced (gradients averaged) or not (no-sync, local accumulation).
# TYPE ddpgo_steps_total counter
ddpgo_steps_total{rank="0",sync="false"} 1
ddpgo_steps_total{rank="0",sync="true"} 3
ddpgo_steps_total{rank="1",sync="false"} 0
ddpgo_steps_total{rank="1",sync="true"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ddpgo_collective_bytes_total", "ddpgo_fp16_overflows_total", "ddpgo_gradient_bytes_total",
		"ddpgo_overlap_ratio", "ddpgo_steps_total"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		count  uint64
		sum    float64
	}{
		{"ddpgo_step_duration_seconds", map[string]string{"rank": "0"}, 3, 3 * 1000e-6},
		{"ddpgo_backward_duration_seconds", map[string]string{"rank": "0"}, 3, 3 * 600e-6},
		{"ddpgo_comm_duration_seconds", map[string]string{"rank": "0"}, 3, 3 * 500e-6},
		{"ddpgo_exposed_comm_duration_seconds", map[string]string{"rank": "0"}, 3, 3 * 300e-6},
		{"ddpgo_bucket_allreduce_duration_seconds", map[string]string{"rank": "0", "bucket": "0"}, 3, 3 * 100e-6},
		{"ddpgo_bucket_allreduce_duration_seconds", map[string]string{"rank": "0", "bucket": "1"}, 3, 3 * 200e-6},
		{"ddpgo_bucket_latency_seconds", map[string]string{"rank": "0", "bucket": "1"}, 3, 3 * 250e-6},
		{"ddpgo_bucket_latency_seconds", map[string]string{"rank": "1", "bucket": "0"}, 1, 130e-6},
	} {
		count, sum := histogram(t, reg, tc.name, tc.labels)
		if count != tc.count || !near(sum, tc.sum) {
			t.Errorf("%s%v: %d samples summing to %g, want %d summing to %g", tc.name, tc.labels, count, sum, tc.count, tc.sum)
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 }

// TestMetricsRegisterTwice checks that a second NewMetrics for the same
// rank on the same registry shares the first one's series.
func TestMetricsRegisterTwice(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a, err := New(reg, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(reg, 2)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	a.Observe(metricStats(1))
	b.Observe(metricStats(2))
	if got := gatheredValue(t, reg, "ddpgo_collective_bytes_total"); got != 6000 {
		t.Fatalf("collective bytes %v, want 6000 from both Metrics", got)
	}
	if count, _ := histogram(t, reg, "ddpgo_bucket_allreduce_duration_seconds", map[string]string{"bucket": "1"}); count != 2 {
		t.Fatalf("bucket 1 histogram has %d samples, want 2", count)
	}
	if _, err := New(reg, -1); err == nil {
		t.Fatal("New accepted rank -1")
	}
	// A registry already holding an incompatible metric of the same name.
	bad := prometheus.NewPedanticRegistry()
	bad.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "ddpgo_overlap_ratio", Help: "other", ConstLabels: prometheus.Labels{"rank": "0", "x": "y"}}))
	if _, err := New(bad, 0); err == nil || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("conflicting registration: %v", err)
	}
	// The same description registered by a collector of another type.
	other := prometheus.NewPedanticRegistry()
	other.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ddpgo_overlap_ratio", ConstLabels: prometheus.Labels{"rank": "3"},
		Help: "Share of the last synced step's communication time hidden behind backward compute (0 to 1).",
	}, func() float64 { return 0 }))
	if _, err := New(other, 3); err == nil {
		t.Fatal("New adopted a collector of another type")
	}
}

func gatheredValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			m := mf.Metric[0]
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}

func TestMetricsObserveAllocatesNothing(t *testing.T) {
	m, err := New(prometheus.NewRegistry(), 0)
	if err != nil {
		t.Fatal(err)
	}
	s := metricStats(1)
	m.Observe(s)
	if n := testing.AllocsPerRun(100, func() { m.Observe(s) }); n != 0 {
		t.Fatalf("Observe allocates %v times per step, want 0", n)
	}
	if m, err := New(nil, 0); err != nil || m == nil {
		t.Fatalf("New(nil) = %v, %v", m, err)
	} else {
		m.Observe(s)
	}
}

// TestMetricsRealRun feeds the statistics of real two-rank steps with the
// fp16 hook into Metrics: the wire carries exactly half the gradient bytes.
func TestMetricsRealRun(t *testing.T) {
	const steps = 3
	runs := observedRun(t, 2, steps, hooks.FP16)
	reg := prometheus.NewPedanticRegistry()
	for rank, ss := range runs {
		m, err := New(reg, rank)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			m.Observe(&s)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			key := mf.GetName()
			for _, lp := range m.Label {
				key += fmt.Sprintf(",%s=%s", lp.GetName(), lp.GetValue())
			}
			if m.Counter != nil {
				values[key] = m.Counter.GetValue()
			}
		}
	}
	const gradBytes = 4 * (64*32 + 64 + 10*64 + 10)
	for rank := range 2 {
		r := strconv.Itoa(rank)
		if got := values["ddpgo_gradient_bytes_total,rank="+r]; got != steps*gradBytes {
			t.Errorf("rank %d: gradient bytes %v, want %d", rank, got, steps*gradBytes)
		}
		if got := values["ddpgo_collective_bytes_total,dtype=half,rank="+r]; got != steps*gradBytes/2 {
			t.Errorf("rank %d: fp16 wire bytes %v, want %d", rank, got, steps*gradBytes/2)
		}
		if got := values["ddpgo_steps_total,rank="+r+",sync=true"]; got != steps {
			t.Errorf("rank %d: %v synced steps, want %d", rank, got, steps)
		}
		nb := len(runs[rank][steps-1].Buckets)
		if nb < 2 {
			t.Fatalf("rank %d: %d buckets; the test wants several", rank, nb)
		}
		for k := range nb {
			if count, _ := histogram(t, reg, "ddpgo_bucket_allreduce_duration_seconds", map[string]string{"rank": r, "bucket": strconv.Itoa(k)}); count == 0 {
				t.Errorf("rank %d bucket %d: no all-reduce duration recorded", rank, k)
			}
		}
	}
}

// ExampleNew exports the statistics of each step of rank 0.
func ExampleNew() {
	reg := prometheus.NewRegistry()
	m, err := New(reg, 0) // the FP16 hook puts half on the wire
	if err != nil {
		fmt.Println(err)
		return
	}
	for step := range uint64(2) {
		// In a program: r.Begin(ddp.Sync); backward; r.Wait(ctx); then
		m.Observe(metricStats(step + 1)) // r.StatsInto(&s); m.Observe(&s)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, s := range mf.Metric {
			switch {
			case s.Counter != nil:
				fmt.Println(mf.GetName(), labelString(s), s.Counter.GetValue())
			case s.Gauge != nil:
				fmt.Println(mf.GetName(), labelString(s), s.Gauge.GetValue())
			case s.Histogram != nil:
				fmt.Println(mf.GetName(), labelString(s), "count", s.Histogram.GetSampleCount())
			}
		}
	}
	// Output:
	// ddpgo_backward_duration_seconds {rank="0"} count 2
	// ddpgo_bucket_allreduce_duration_seconds {bucket="0",rank="0"} count 2
	// ddpgo_bucket_allreduce_duration_seconds {bucket="1",rank="0"} count 2
	// ddpgo_bucket_latency_seconds {bucket="0",rank="0"} count 2
	// ddpgo_bucket_latency_seconds {bucket="1",rank="0"} count 2
	// ddpgo_collective_bytes_total {dtype="half",rank="0"} 6000
	// ddpgo_comm_duration_seconds {rank="0"} count 2
	// ddpgo_exposed_comm_duration_seconds {rank="0"} count 2
	// ddpgo_fp16_overflows_total {rank="0"} 4
	// ddpgo_gradient_bytes_total {rank="0"} 12000
	// ddpgo_overlap_ratio {rank="0"} 0.4
	// ddpgo_step_duration_seconds {rank="0"} count 2
	// ddpgo_steps_total {rank="0",sync="false"} 0
	// ddpgo_steps_total {rank="0",sync="true"} 2
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, lp := range m.Label {
		parts = append(parts, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func BenchmarkMetricsObserve(b *testing.B) {
	m, err := New(prometheus.NewRegistry(), 0)
	if err != nil {
		b.Fatal(err)
	}
	s := metricStats(1)
	for b.Loop() {
		m.Observe(s)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/step")
}
