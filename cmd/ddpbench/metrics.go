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
	"github.com/ddpgo/ddpgo/ddp/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveMetrics serves /metrics on addr from a registry of its own holding,
// per rank, the reducer's step metrics (ddp.Metrics, fed from each step's
// statistics) and its CommPool's collector. It returns the per-step
// callback that feeds the metrics and a stop function (idempotent).
// pools[i] is rank first+i's.
func serveMetrics(addr string, pools []*allocator.Pool, first int, log io.Writer) (func(int, bool, *ddp.StepStats), func(), error) {
	reg := prometheus.NewRegistry()
	ms := make([]*metrics.Metrics, len(pools))
	for i, p := range pools {
		r := first + i
		if err := reg.Register(metrics.NewPoolCollector(p, prometheus.Labels{"rank": strconv.Itoa(r)})); err != nil {
			return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
		}
		m, err := metrics.New(reg, r)
		if err != nil {
			return nil, nil, fmt.Errorf("--metrics-addr: %w", err)
		}
		ms[i] = m
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
	if allInterfaces(addr) {
		fmt.Fprintf(log, "ddpbench: note: --metrics-addr %q listens on every network interface, without authentication: "+
			"anyone who can reach this machine can read the run's metrics (and load the server); 127.0.0.1%s keeps them local\n",
			addr, portOf(addr))
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
			<-done
		})
	}
	return func(rank int, _ bool, s *ddp.StepStats) { ms[rank-first].Observe(s) }, stop, nil
}

// allInterfaces reports whether a listen address binds every interface:
// an empty host (":9100"), 0.0.0.0 or ::.
func allInterfaces(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// portOf returns ":port" of addr, or "" when it has none.
func portOf(addr string) string {
	if _, port, err := net.SplitHostPort(addr); err == nil {
		return ":" + port
	}
	return ""
}
