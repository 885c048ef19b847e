package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/urfave/cli/v2"
)

// GPU telemetry. While a run's measured steps, or a collective sweep, run
// on a device backend (nccl), one goroutine reads each of this process's
// ranks' GPUs through NVML every --telemetry-interval: utilisation,
// memory used, power, and PCIe and NVLink throughput. The outputs show
// each figure's median over the samples and its peak, with the rank that
// reached it. The goroutine only reads counters the driver keeps anyway,
// on an OS thread of its own while in NVML, so the timed loops never wait
// for it. Without NVML the outputs are as they were, and standard error
// says once why there is no telemetry.

// The figures of a sample, in their order in every output.
const (
	figUtil     = iota // percent of the last sample period a kernel ran
	figMem             // bytes of device memory in use
	figPower           // watts drawn
	figPCIeTx          // bytes per second
	figPCIeRx          //
	figNVLinkTx        // bytes per second, data over every NVLink
	figNVLinkRx        //
	nFigures
)

// figures describes each figure: its JSON and CSV key, its label and
// unit, and the factor from its stored value (bytes, bytes/s) to the unit
// shown in the table.
var figures = [nFigures]struct {
	key, label string
	table      float64 // stored value x table = value shown in the table
	json       float64 // stored value x json = value in JSON and CSV
	prec       int
}{
	figUtil:     {"gpu_util_pct", "GPU utilisation (%)", 1, 1, 1},
	figMem:      {"memory_used_bytes", "memory used (GiB)", 1.0 / (1 << 30), 1, 2},
	figPower:    {"power_w", "power (W)", 1, 1, 1},
	figPCIeTx:   {"pcie_tx_gbs", "PCIe TX (GB/s)", 1e-9, 1e-9, 2},
	figPCIeRx:   {"pcie_rx_gbs", "PCIe RX (GB/s)", 1e-9, 1e-9, 2},
	figNVLinkTx: {"nvlink_tx_gbs", "NVLink TX (GB/s)", 1e-9, 1e-9, 2},
	figNVLinkRx: {"nvlink_rx_gbs", "NVLink RX (GB/s)", 1e-9, 1e-9, 2},
}

// gpuRaw is one reading of one GPU, as a gpuSource returns it: vals[f]
// is NaN where figure f could not be read, and why[f] says why. NVLink's
// figures are left for the sampler, which makes rates of the cumulative
// byte counters nvTx and nvRx (NaN where not read) between readings at
// nvAt microseconds.
type gpuRaw struct {
	vals       [nFigures]float64
	why        [nFigures]string
	nvTx, nvRx float64
	nvAt       int64
}

// gpuSource reads the GPUs of the ranks sampled, by their index in the
// list it was opened with. read is called from one goroutine at a time.
type gpuSource interface {
	read(i int) gpuRaw
	close()
}

// openGPUSource opens NVML for the CUDA device ordinals of the ranks
// sampled; it is openNVML where ddpbench is built with cgo on Linux. The
// error says why there is no telemetry.
var openGPUSource = openNVML

// telemetryFlag is --telemetry-interval, shared by run and collective.
func telemetryFlag() cli.Flag {
	return &cli.DurationFlag{Name: "telemetry-interval", Value: defaultTelemetryInterval,
		Usage: "how often each rank's GPU is read through NVML (utilisation, memory, power, PCIe and NVLink throughput) " +
			"during the timed region, on a device backend (nccl); 0 turns the sampling off",
		EnvVars: envs("telemetry-interval")}
}

// defaultTelemetryInterval is short enough for a few samples in a short
// run and long enough that reading every GPU costs nothing measurable:
// NVML's utilisation itself averages over 1/6 s to 1 s.
const defaultTelemetryInterval = 100 * time.Millisecond

// minTelemetryInterval bounds how often NVML is asked: a read of all
// figures of one GPU takes some hundreds of microseconds.
const minTelemetryInterval = 10 * time.Millisecond

// parseTelemetryInterval validates --telemetry-interval.
func parseTelemetryInterval(c *cli.Context) (time.Duration, error) {
	d := c.Duration("telemetry-interval")
	if d != 0 && d < minTelemetryInterval {
		return 0, usagef("--telemetry-interval %v: want 0 (off) or at least %v", d, minTelemetryInterval)
	}
	return d, nil
}

// groupTelemetry returns the sampler of the GPUs of g's ranks for a
// device backend, or nil: on other backends, with interval 0, where NVML
// cannot be had (said on note), and on a launched job's quiet ranks,
// whose figures rank 0 does not print.
func groupTelemetry(g *group, b backend, interval time.Duration, note io.Writer) *telemetry {
	if !b.DeviceMemory || g.quietRank() {
		return nil
	}
	var ranks, ordinals []int
	for _, c := range g.comms {
		ranks = append(ranks, c.Rank())
		ordinals = append(ordinals, comm.DeviceOf(c))
	}
	return startTelemetry(note, interval, ranks, ordinals)
}

// startTelemetry opens the GPUs of ranks (rank numbers) on the CUDA
// devices ordinals and returns a sampler not yet started, or nil after
// writing on note why there is none. It returns nil without a word when
// interval is 0.
func startTelemetry(note io.Writer, interval time.Duration, ranks, ordinals []int) *telemetry {
	if interval == 0 || len(ranks) == 0 {
		return nil
	}
	src, err := openGPUSource(ordinals)
	if err != nil {
		fmt.Fprintf(note, "ddpbench: note: no GPU telemetry: %v\n", err)
		return nil
	}
	return newTelemetry(src, interval, ranks)
}

// telemetry samples a gpuSource from its own goroutine between start and
// stop. A cut ends a segment (a collective's size) and returns its
// summary; the whole summary covers every sample.
type telemetry struct {
	src      gpuSource
	interval time.Duration
	ranks    []int

	mu      sync.Mutex
	whole   []figureAcc // per rank
	segment []figureAcc // per rank, since the last cut
	last    []gpuRaw    // per rank, the previous reading (NVLink rates)

	stopc   chan struct{}
	done    chan struct{}
	once    sync.Once // start
	started bool      // under mu
	stopped bool      // under mu
}

func newTelemetry(src gpuSource, interval time.Duration, ranks []int) *telemetry {
	t := &telemetry{src: src, interval: interval, ranks: ranks,
		whole: make([]figureAcc, len(ranks)), segment: make([]figureAcc, len(ranks)), last: make([]gpuRaw, len(ranks)),
		stopc: make(chan struct{}), done: make(chan struct{})}
	for i := range ranks {
		t.whole[i].reset()
		t.segment[i].reset()
		t.last[i].nvAt = -1
	}
	return t
}

// start takes the first sample now and then one every interval, until
// stop. It does nothing on a nil telemetry or after the first call.
func (t *telemetry) start() {
	if t == nil {
		return
	}
	t.once.Do(t.run)
}

func (t *telemetry) run() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.started = true
	go func() {
		defer close(t.done)
		tick := time.NewTicker(t.interval)
		defer tick.Stop()
		for {
			t.sample()
			select {
			case <-t.stopc:
				return
			case <-tick.C:
			}
		}
	}()
}

// stop ends the sampling, waits for the goroutine and closes the source.
// It may be called more than once, and on a telemetry never started.
func (t *telemetry) stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	t.stopped = true
	started := t.started
	t.mu.Unlock()
	if started {
		close(t.stopc)
		<-t.done
	}
	t.src.close()
}

// sample reads every rank's GPU once. The readings are taken outside the
// lock and added under one hold of it, so a cut falls between sampling
// rounds, never inside one: every segment holds whole rounds, and the
// segments' samples add up to the whole's.
func (t *telemetry) sample() {
	raws := make([]gpuRaw, len(t.ranks))
	for i := range t.ranks {
		raws[i] = t.src.read(i)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.ranks {
		raw := raws[i]
		v := raw.vals
		prev := t.last[i]
		// NVLink throughput: bytes moved since the previous reading over the
		// time between the driver's two time stamps. The first reading, and
		// one whose counters did not move forward, give none.
		v[figNVLinkTx], v[figNVLinkRx] = math.NaN(), math.NaN()
		if prev.nvAt >= 0 && raw.nvAt > prev.nvAt {
			dt := float64(raw.nvAt-prev.nvAt) / 1e6
			if d := raw.nvTx - prev.nvTx; d >= 0 {
				v[figNVLinkTx] = d / dt
			}
			if d := raw.nvRx - prev.nvRx; d >= 0 {
				v[figNVLinkRx] = d / dt
			}
		}
		if math.IsNaN(raw.nvTx) || math.IsNaN(raw.nvRx) {
			raw.nvAt = -1
		}
		t.last[i] = raw
		t.whole[i].add(&v, &raw.why)
		t.segment[i].add(&v, &raw.why)
	}
}

// cut returns the summary of the samples since the previous cut (or the
// start) and begins a new segment; nil on a nil telemetry.
func (t *telemetry) cut() *gpuSummary {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.summaryOf(t.segment)
	for i := range t.segment {
		t.segment[i].reset()
	}
	return s
}

// summary returns the summary of every sample so far; nil on a nil
// telemetry.
func (t *telemetry) summary() *gpuSummary {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.summaryOf(t.whole)
}

// gpuSummary is the telemetry of some sampling rounds: each figure over
// every rank sampled, and each rank's own.
type gpuSummary struct {
	interval time.Duration
	ranks    []int
	samples  int                  // readings of each rank's GPU
	all      [nFigures]figureStat // every rank's samples together
	perRank  [][nFigures]figureStat
}

// figureStat is one figure's median and peak, the rank of the peak, and
// why it is missing where no sample had it.
type figureStat struct {
	ok           bool
	median, peak float64
	peakRank     int
	why          string
}

func (t *telemetry) summaryOf(accs []figureAcc) *gpuSummary {
	s := &gpuSummary{interval: t.interval, ranks: t.ranks, perRank: make([][nFigures]figureStat, len(accs))}
	for f := range nFigures {
		var pooled []float64
		best := figureStat{}
		var why []string
		for i := range accs {
			a := &accs[i]
			s.samples = max(s.samples, a.seen)
			col := a.column(f)
			pooled = append(pooled, col...)
			st := figureStat{why: a.why[f]}
			if a.count[f] > 0 {
				st = figureStat{ok: true, median: median(col), peak: a.peak[f], peakRank: t.ranks[i]}
				if !best.ok || st.peak > best.peak {
					best.ok, best.peak, best.peakRank = true, st.peak, t.ranks[i]
				}
			} else if a.why[f] != "" && !slices.Contains(why, a.why[f]) {
				why = append(why, a.why[f])
			}
			s.perRank[i][f] = st
		}
		if best.ok {
			best.median = median(pooled)
		} else {
			best.why = strings.Join(why, "; ")
		}
		s.all[f] = best
	}
	return s
}

// maxKept bounds the samples kept per rank for the medians: a run of any
// length holds at most this many, evenly spaced in time. Peaks cover
// every sample.
const maxKept = 4096

// figureAcc accumulates one rank's samples: every stride-th row (stride
// doubles, and every other kept row goes, each time maxKept is reached),
// each figure's peak and count over all, and why a figure was missing.
type figureAcc struct {
	rows   [][nFigures]float64
	stride int
	seen   int
	peak   [nFigures]float64
	count  [nFigures]int
	why    [nFigures]string
}

func (a *figureAcc) reset() {
	*a = figureAcc{rows: a.rows[:0], stride: 1}
}

func (a *figureAcc) add(v *[nFigures]float64, why *[nFigures]string) {
	for f, x := range v {
		if math.IsNaN(x) {
			if why[f] != "" {
				a.why[f] = why[f]
			}
			continue
		}
		if a.count[f] == 0 || x > a.peak[f] {
			a.peak[f] = x
		}
		a.count[f]++
	}
	if a.seen%a.stride == 0 {
		if len(a.rows) == maxKept {
			// Keep rows 0, 2, 4...: samples 0, 2*stride, 4*stride...; this
			// sample, number maxKept*stride, is one of those.
			for i := range maxKept / 2 {
				a.rows[i] = a.rows[2*i]
			}
			a.rows = a.rows[:maxKept/2]
			a.stride *= 2
		}
		a.rows = append(a.rows, *v)
	}
	a.seen++
}

// column returns figure f of the kept rows that have it.
func (a *figureAcc) column(f int) []float64 {
	var col []float64
	for i := range a.rows {
		if x := a.rows[i][f]; !math.IsNaN(x) {
			col = append(col, x)
		}
	}
	return col
}

// median is the median of v (the mean of the two middle values of an
// even count); v is reordered.
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// table renders the summary as lines of the run table, each after
// prefix ("# " in collective's).
func (s *gpuSummary) table(prefix, region string) string {
	if s == nil {
		return ""
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "%sGPU telemetry (NVML, every %v %s; %s, %d samples each)\n", prefix, s.interval, region, s.ranksPhrase(), s.samples)
	fmt.Fprintf(b, "%s%-24s %10s %10s\n", prefix, "", "median", "peak")
	for f := range nFigures {
		st, fig := s.all[f], figures[f]
		if !st.ok {
			why := st.why
			if why == "" {
				why = "no sample"
			}
			fmt.Fprintf(b, "%s%-24s %10s  (%s)\n", prefix, fig.label, "n/a", why)
			continue
		}
		fmt.Fprintf(b, "%s%-24s %10.*f %10.*f (rank %d)", prefix, fig.label, fig.prec, st.median*fig.table, fig.prec, st.peak*fig.table, st.peakRank)
		for i, r := range s.ranks {
			if pr := s.perRank[i][f]; !pr.ok {
				why := pr.why
				if why == "" {
					why = "no sample"
				}
				fmt.Fprintf(b, "; rank %d: %s", r, why)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ranksPhrase names the ranks sampled.
func (s *gpuSummary) ranksPhrase() string {
	if len(s.ranks) == 1 {
		return fmt.Sprintf("rank %d", s.ranks[0])
	}
	return fmt.Sprintf("%d ranks", len(s.ranks))
}

// telemetryJSON is a gpuSummary in the JSON outputs. Figures are in the
// units their keys name; a figure no sample had is null.
type telemetryJSON struct {
	IntervalMS float64                `json:"interval_ms"`
	Samples    int                    `json:"samples"` // readings of each rank's GPU
	Ranks      []int                  `json:"ranks"`   // the ranks sampled: every rank of this process
	Figures    map[string]*figureJSON `json:"figures"`
	PerRank    []rankTelemetryJSON    `json:"per_rank"`
}

type figureJSON struct {
	Median   float64 `json:"median"`
	Peak     float64 `json:"peak"`
	PeakRank int     `json:"peak_rank"`
}

type rankTelemetryJSON struct {
	Rank    int                    `json:"rank"`
	Figures map[string]*figureJSON `json:"figures"`
}

func (s *gpuSummary) json() *telemetryJSON {
	if s == nil {
		return nil
	}
	figs := func(st *[nFigures]figureStat) map[string]*figureJSON {
		m := make(map[string]*figureJSON, nFigures)
		for f := range nFigures {
			m[figures[f].key] = nil
			if st[f].ok {
				m[figures[f].key] = &figureJSON{Median: st[f].median * figures[f].json, Peak: st[f].peak * figures[f].json, PeakRank: st[f].peakRank}
			}
		}
		return m
	}
	j := &telemetryJSON{IntervalMS: float64(s.interval) / float64(time.Millisecond), Samples: s.samples, Ranks: s.ranks, Figures: figs(&s.all)}
	for i, r := range s.ranks {
		j.PerRank = append(j.PerRank, rankTelemetryJSON{Rank: r, Figures: figs(&s.perRank[i])})
	}
	return j
}

// telemetryCSVHeader names the CSV columns of a summary: each figure's
// median and peak.
func telemetryCSVHeader() []string {
	var h []string
	for f := range nFigures {
		h = append(h, figures[f].key+"_median", figures[f].key+"_peak")
	}
	return h
}

// csv returns the summary's CSV columns, empty where there is no figure
// (or no summary).
func (s *gpuSummary) csv() []string {
	rec := make([]string, 2*nFigures)
	if s == nil {
		return rec
	}
	for f := range nFigures {
		if st := s.all[f]; st.ok {
			rec[2*f], rec[2*f+1] = fmtFloat(st.median*figures[f].json), fmtFloat(st.peak*figures[f].json)
		}
	}
	return rec
}

// cudaToNVML returns the NVML index of the GPU that CUDA calls device
// ordinal, given CUDA_VISIBLE_DEVICES (visible; "" when unset) and the
// UUIDs of NVML's devices by index. CUDA numbers the visible devices in
// the variable's order, each an NVML index or a prefix of a GPU's UUID,
// and ignores it from the first entry it cannot read on. Unset, ordinal
// n is taken to be NVML's device n: CUDA orders devices fastest first
// and NVML by PCI bus, which agree on machines of one GPU model, and
// always under CUDA_DEVICE_ORDER=PCI_BUS_ID.
func cudaToNVML(ordinal int, visible string, uuids []string) (int, error) {
	if visible == "" { // unset (set and empty, it hides every device)
		if ordinal >= len(uuids) {
			return 0, fmt.Errorf("CUDA device %d: NVML has %d device(s)", ordinal, len(uuids))
		}
		return ordinal, nil
	}
	var list []string
	for _, e := range strings.Split(visible, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			break
		}
		list = append(list, e)
	}
	if ordinal >= len(list) {
		return 0, fmt.Errorf("CUDA device %d: CUDA_VISIBLE_DEVICES=%q makes %d visible", ordinal, visible, len(list))
	}
	e := list[ordinal]
	if n, err := strconv.Atoi(e); err == nil {
		if n < 0 || n >= len(uuids) {
			return 0, fmt.Errorf("CUDA device %d is CUDA_VISIBLE_DEVICES entry %q: NVML has %d device(s)", ordinal, e, len(uuids))
		}
		return n, nil
	}
	if strings.HasPrefix(e, "MIG-") {
		return 0, fmt.Errorf("CUDA device %d is the MIG instance %s: NVML's figures here are whole GPUs'", ordinal, e)
	}
	found := -1
	for i, u := range uuids {
		if strings.HasPrefix(u, e) || strings.HasPrefix(u, "GPU-"+e) {
			if found >= 0 {
				return 0, fmt.Errorf("CUDA device %d: CUDA_VISIBLE_DEVICES entry %q names more than one GPU", ordinal, e)
			}
			found = i
		}
	}
	if found < 0 {
		return 0, fmt.Errorf("CUDA device %d: no GPU's UUID begins with CUDA_VISIBLE_DEVICES entry %q", ordinal, e)
	}
	return found, nil
}
