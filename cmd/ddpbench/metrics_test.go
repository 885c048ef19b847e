package main

import (
	"bytes"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func TestServeMetrics(t *testing.T) {
	pools, err := newPools(2, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closePools(pools)
	var log bytes.Buffer
	onStep, stop, err := serveMetrics("127.0.0.1:0", pools, 0, &log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	addr := regexp.MustCompile(`http://\S+/metrics`).FindString(log.String())
	if addr == "" {
		t.Fatalf("no address in %q", log.String())
	}
	s := ddp.StepStats{Step: 1, Sync: true, Wall: 30 * time.Millisecond, Compute: 20 * time.Millisecond,
		Comm: 15 * time.Millisecond, OverlapRatio: 0.5, Bytes: 1000, Buckets: []ddp.BucketStats{
			{Index: 0, Wire: comm.Float16, WireBytes: 600}, {Index: 1, Wire: comm.Float16, WireBytes: 400}, {Index: 2, Wire: comm.Float16}}}
	onStep(0, true, &s)
	onStep(1, true, &s)
	onStep(1, true, &s)
	resp, err := http.Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`ddpgo_steps_total{rank="0",sync="true"} 1`, `ddpgo_steps_total{rank="1",sync="true"} 2`,
		`ddpgo_collective_bytes_total{dtype="half",rank="1"} 2000`, `ddpgo_overlap_ratio{rank="0"} 0.5`,
		`ddpgo_step_duration_seconds_count{rank="1"} 2`, `ddpgo_commpool_limit_bytes{rank="1"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// What a Prometheus server scrapes lints clean.
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	stop()
	stop()
	if _, err := http.Get(addr); err == nil {
		t.Error("server still answers after stop")
	}
}

func TestMetricsAddrInUse(t *testing.T) {
	pools, err := newPools(1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closePools(pools)
	var log bytes.Buffer
	_, stop, err := serveMetrics("127.0.0.1:0", pools, 0, &log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	addr := strings.TrimSuffix(strings.TrimPrefix(regexp.MustCompile(`http://\S+/metrics`).FindString(log.String()), "http://"), "/metrics")
	pools2, _ := newPools(1, 0, nil)
	defer closePools(pools2)
	if _, _, err := serveMetrics(addr, pools2, 0, io.Discard); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("second server on %s: %v", addr, err)
	}
}

// TestPoolsFitLargeModels checks that the pools --metrics-addr supplies
// hold a model whose gradients pass the allocator's default limit, as the
// pools a Reducer makes for itself do.
func TestPoolsFitLargeModels(t *testing.T) {
	const grads = 1600 << 20 // 1.56 GiB of gradients: one bucket of it
	pools, err := newPools(1, grads, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closePools(pools)
	b, err := pools[0].Get(grads) // mapped, never touched: cheap
	if err != nil {
		t.Fatalf("Get(%d): %v", grads, err)
	}
	if err := pools[0].Put(b); err != nil {
		t.Fatal(err)
	}
	if got := poolLimit(0); got != allocator.DefaultLimit {
		t.Errorf("poolLimit(0) = %d, want the default %d", got, allocator.DefaultLimit)
	}
}
