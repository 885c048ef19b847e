package ddp

import (
	"github.com/ddpgo/ddpgo/allocator"
	"github.com/prometheus/client_golang/prometheus"
)

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
