package ddp

import (
	"strconv"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

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
