package main

import (
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeGPUs is a gpuSource of two GPUs whose k-th reading (from 0) is:
// utilisation k + 100*device; no power ("Not Supported" on both); NVLink
// counters of k MB sent and 2k MB received, stamped k*100 ms, on device
// 0 only (device 1: "Not Supported").
type fakeGPUs struct {
	mu     sync.Mutex
	reads  [2]int
	closes int
}

func (f *fakeGPUs) read(i int) gpuRaw {
	f.mu.Lock()
	k := f.reads[i]
	f.reads[i]++
	f.mu.Unlock()
	var r gpuRaw
	for j := range r.vals {
		r.vals[j] = math.NaN()
	}
	r.vals[figUtil] = float64(k + 100*i)
	r.vals[figMem] = float64(i+1) * (1 << 30)
	r.why[figPower] = "Not Supported"
	r.nvTx, r.nvRx, r.nvAt = math.NaN(), math.NaN(), int64(k)*100_000
	if i == 0 {
		r.nvTx, r.nvRx = float64(k)*1e6, float64(2*k)*1e6
	} else {
		r.why[figNVLinkTx], r.why[figNVLinkRx] = "Not Supported", "Not Supported"
	}
	return r
}

func (f *fakeGPUs) close() {
	f.mu.Lock()
	f.closes++
	f.mu.Unlock()
}

// TestTelemetrySampler drives the sampler over fakeGPUs in a synctest
// bubble: a sample at start and one per interval until stop; each cut
// covers the samples since the last; medians over every rank's samples,
// peaks with their rank; NVLink rates from the counters' deltas; figures
// some or all ranks lack, with NVML's reason; the goroutine gone and the
// source closed once after stop.
func TestTelemetrySampler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeGPUs{}
		tel := newTelemetry(src, 100*time.Millisecond, []int{0, 1})
		tel.start()
		tel.start() // a second start does nothing
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if s := tel.cut(); s.samples != 4 {
			t.Errorf("first cut: %d samples, want 4 (0, 100, 200, 300 ms)", s.samples)
		}
		time.Sleep(700 * time.Millisecond)
		synctest.Wait()
		seg := tel.cut()
		tel.stop()
		tel.stop()
		if seg.samples != 7 {
			t.Errorf("second cut: %d samples, want 7", seg.samples)
		}
		if src.closes != 1 {
			t.Errorf("source closed %d times, want once", src.closes)
		}
		s := tel.summary()
		if s.samples != 11 {
			t.Fatalf("%d samples in 1 s at 100 ms, want 11", s.samples)
		}
		// Utilisation 0..10 on rank 0, 100..110 on rank 1.
		if u := s.all[figUtil]; !u.ok || u.median != 55 || u.peak != 110 || u.peakRank != 1 {
			t.Errorf("utilisation over both ranks %+v: want median 55, peak 110 on rank 1", u)
		}
		if u := s.perRank[0][figUtil]; u.median != 5 || u.peak != 10 {
			t.Errorf("rank 0's utilisation %+v: want median 5, peak 10", u)
		}
		if u := seg.all[figUtil]; u.median != 57 || u.peak != 110 {
			t.Errorf("second segment's utilisation %+v: want median 57 (4..10, 104..110), peak 110", u)
		}
		// 1 MB per 100 ms out, 2 MB in: 10 and 20 MB/s; no rate from the
		// first reading.
		if nv := s.all[figNVLinkTx]; !nv.ok || math.Abs(nv.median-1e7) > 1e-3 || nv.peakRank != 0 || s.perRank[1][figNVLinkTx].ok {
			t.Errorf("NVLink TX %+v (rank 1: %+v): want 1e7 B/s from rank 0 alone", nv, s.perRank[1][figNVLinkTx])
		}
		if nv := s.all[figNVLinkRx]; math.Abs(nv.median-2e7) > 1e-3 {
			t.Errorf("NVLink RX %+v: want 2e7 B/s", nv)
		}
		if p := s.all[figPower]; p.ok || p.why != "Not Supported" {
			t.Errorf("power %+v: want missing, Not Supported", p)
		}
		table := s.table("", "over the test")
		for _, want := range []string{
			"GPU telemetry (NVML, every 100ms over the test; 2 ranks, 11 samples each)\n",
			"GPU utilisation (%)            55.0      110.0 (rank 1)\n",
			"memory used (GiB)              1.50       2.00 (rank 1)\n",
			"power (W)                       n/a  (Not Supported)\n",
			"NVLink TX (GB/s)               0.01       0.01 (rank 0); rank 1: Not Supported\n",
			"PCIe TX (GB/s)                  n/a  (no sample)\n",
		} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
		}
		j := s.json()
		if j.Samples != 11 || j.IntervalMS != 100 || j.Figures["power_w"] != nil || j.Figures["gpu_util_pct"].Peak != 110 ||
			j.Figures["memory_used_bytes"].Median != 1.5*(1<<30) || j.PerRank[1].Figures["nvlink_tx_gbs"] != nil {
			t.Errorf("json %+v", j)
		}
		if tx := j.Figures["nvlink_tx_gbs"]; math.Abs(tx.Median-0.01) > 1e-12 {
			t.Errorf("json NVLink TX %+v GB/s, want 0.01", tx)
		}
		csv := s.csv()
		h := telemetryCSVHeader()
		if len(csv) != len(h) || h[0] != "gpu_util_pct_median" || csv[0] != "55" || csv[1] != "110" || csv[4] != "" {
			t.Errorf("csv %q under %q", csv, h)
		}
	})
}

// pausedGPUs is fakeGPUs whose first reading of device 1 waits: it says
// so on reading and returns when resume is closed.
type pausedGPUs struct {
	fakeGPUs
	reading, resume chan struct{}
	once            sync.Once
}

func (p *pausedGPUs) read(i int) gpuRaw {
	if i == 1 {
		p.once.Do(func() {
			close(p.reading)
			<-p.resume
		})
	}
	return p.fakeGPUs.read(i)
}

// TestTelemetryCutBetweenRounds: a cut taken while a sampling round is
// between its ranks' readings gets none of that round; the round lands
// whole in the next segment, so the segments' samples add up to the
// whole's (the collective's rows against its sweep).
func TestTelemetryCutBetweenRounds(t *testing.T) {
	src := &pausedGPUs{reading: make(chan struct{}), resume: make(chan struct{})}
	tel := newTelemetry(src, time.Hour, []int{0, 1})
	tel.start()
	<-src.reading // device 0 read, device 1 being read
	mid := tel.cut()
	close(src.resume)
	tel.stop()
	last := tel.cut()
	whole := tel.summary()
	if mid.samples != 0 || last.samples != 1 || whole.samples != 1 {
		t.Errorf("cut inside the first round: %d samples, then %d; %d in the whole (want 0, 1, 1)",
			mid.samples, last.samples, whole.samples)
	}
	if s := mid.perRank[0][figUtil]; s.ok {
		t.Errorf("the cut inside the round holds device 0's reading: %+v", s)
	}
}

// TestTelemetryNotStarted: a telemetry stopped before it started samples
// nothing and closes its source; a nil one (no NVML) does nothing and
// yields no output.
func TestTelemetryNotStarted(t *testing.T) {
	src := &fakeGPUs{}
	tel := newTelemetry(src, time.Second, []int{0})
	tel.stop()
	tel.start()
	if src.reads[0] != 0 || src.closes != 1 || tel.summary().samples != 0 {
		t.Errorf("stopped before start: %d reads, %d closes", src.reads[0], src.closes)
	}
	var none *telemetry
	none.start()
	none.stop()
	if none.cut() != nil || none.summary() != nil {
		t.Error("a nil telemetry has a summary")
	}
	var s *gpuSummary
	if s.table("", "") != "" || s.json() != nil || len(s.csv()) != 2*nFigures || strings.Join(s.csv(), "") != "" {
		t.Errorf("a nil summary prints something: %q %v %q", s.table("", ""), s.json(), s.csv())
	}
}

// TestFigureAcc: past maxKept samples the accumulator keeps every
// stride-th, evenly spaced, while peaks and counts cover every sample.
func TestFigureAcc(t *testing.T) {
	var a figureAcc
	a.reset()
	var why [nFigures]string
	const n = 3*maxKept + 5
	for k := range n {
		var v [nFigures]float64
		for f := range v {
			v[f] = math.NaN()
		}
		v[figUtil] = float64(k)
		a.add(&v, &why)
	}
	if a.stride != 4 || len(a.rows) != (n+3)/4 || a.count[figUtil] != n || a.peak[figUtil] != n-1 || a.seen != n {
		t.Fatalf("stride %d, %d rows, count %d, peak %g after %d samples", a.stride, len(a.rows), a.count[figUtil], a.peak[figUtil], n)
	}
	for i, r := range a.rows {
		if r[figUtil] != float64(i*a.stride) {
			t.Fatalf("row %d holds sample %g, want %d", i, r[figUtil], i*a.stride)
		}
	}
	if m := median(a.column(figUtil)); math.Abs(m-(n-1)/2.0) > 4 {
		t.Errorf("median %g of the kept rows, want about %g", m, (n-1)/2.0)
	}
	if c := a.column(figPower); len(c) != 0 || !math.IsNaN(median(c)) {
		t.Errorf("a figure never read: %v", c)
	}
}

func TestCudaToNVML(t *testing.T) {
	uuids := []string{"GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-bbbb-3333"}
	for _, c := range []struct {
		ordinal int
		visible string
		want    int
		err     string
	}{
		{0, "", 0, ""},
		{2, "", 2, ""},
		{3, "", 0, "NVML has 3 device(s)"},
		{0, "2,0", 2, ""},
		{1, "2,0", 0, ""},
		{1, "2, 1", 1, ""},
		{2, "2,0", 0, "makes 2 visible"},
		{1, "0,,2", 0, "makes 1 visible"},
		{0, "5", 0, "entry \"5\": NVML has 3"},
		{0, "GPU-aaaa", 0, ""},
		{0, "bbbb-3", 2, ""},
		{0, "GPU-bbbb", 0, "names more than one GPU"},
		{0, "GPU-cccc", 0, "no GPU's UUID begins with"},
		{0, "MIG-GPU-aaaa/1/0", 0, "MIG instance"},
	} {
		got, err := cudaToNVML(c.ordinal, c.visible, uuids)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("cudaToNVML(%d, %q) = %d, %v; want an error saying %q", c.ordinal, c.visible, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("cudaToNVML(%d, %q) = %d, %v; want %d", c.ordinal, c.visible, got, err, c.want)
		}
	}
}

// TestTelemetryOnlyOnDevices: host backends never open NVML, and a
// --telemetry-interval below the minimum is a usage error.
func TestTelemetryOnlyOnDevices(t *testing.T) {
	opened := 0
	old := openGPUSource
	openGPUSource = func([]int) (gpuSource, error) { opened++; return &fakeGPUs{}, nil }
	t.Cleanup(func() { openGPUSource = old })
	code, out, stderr := run(t, "collective", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--telemetry-interval", "10ms")
	if code != 0 || opened != 0 || strings.Contains(out+stderr, "telemetry") {
		t.Errorf("collective on inproc: status %d, NVML opened %d times:\n%s%s", code, opened, out, stderr)
	}
	for _, cmd := range []string{"run", "collective"} {
		code, _, stderr = run(t, cmd, "--telemetry-interval", "5ms")
		if code != 2 || !strings.Contains(stderr, "--telemetry-interval 5ms: want 0 (off) or at least 10ms") {
			t.Errorf("%s --telemetry-interval 5ms: status %d, %q", cmd, code, stderr)
		}
	}
}
