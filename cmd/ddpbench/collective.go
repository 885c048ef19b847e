package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/urfave/cli/v2"
)

func collectiveCommand() *cli.Command {
	return &cli.Command{
		Name:  "collective",
		Usage: "nccl-tests style sweep of one collective over message sizes",
		Description: "Columns and footer follow nccl-tests (all_reduce_perf and friends): size and count\n" +
			"of the larger buffer, out-of-place and in-place time per iteration (mean over ranks;\n" +
			"-a as nccl-tests), algbw = size/time, busbw = algbw x the collective's factor, #wrong =\n" +
			"elements that differ from the exact result (with -c 1). broadcast is in place in ddpgo's\n" +
			"contract: its out-of-place column times a copy into the result buffer followed by the\n" +
			"in-place call. sendrecv has no in-place form. -o/--op is the reduction, as nccl-tests'\n" +
			"-o; -o all runs the sweep once for each (sum, max, min, avg) in turn, which broadcast and\n" +
			"allgather, reducing nothing, run once. Ctrl-C ends the sweep after the rows printed so\n" +
			"far, with the footer marked interrupted.\n\n" + exitRule,
		Flags: []cli.Flag{
			stringFlag("collective", "allreduce", "the collective (nccl-tests' binary): allreduce, broadcast, reduce, allgather, reducescatter or sendrecv"),
			stringFlag("minbytes", "4K", "smallest size (K, M, G suffixes)", "b"),
			stringFlag("maxbytes", "256M", "largest size (K, M, G suffixes)", "e"),
			intFlag("stepfactor", 4, "size multiplier between rows", "f"),
			stringFlag("stepbytes", "", "size increment between rows instead of a factor (K, M, G suffixes)", "i"),
			stringFlag("datatype", "float", "element type: float, half, bfloat16, double, int32, int64, uint8", "d"),
			stringFlag("op", "sum", "reduction: sum, max, min, avg, or all of them in turn (nccl-tests' prod has no counterpart in ddpgo)", "o"),
			intFlag("root", 0, "root rank of broadcast and reduce", "r"),
			intFlag("iters", 20, "timed iterations per size", "n"),
			intFlag("warmup-iters", 5, "untimed iterations per size (nccl-tests' --warmup_iters; run's --warmup counts steps)", "w"),
			intFlag("check", 1, "1: verify every result and count wrong elements; 0: don't", "c"),
			intFlag("average", 1, "time reported from the ranks' times: 0 rank 0, 1 mean, 2 min, 3 max", "a"),
			intFlag("ranks", 2, "number of ranks"),
			stringFlag("backend", "inproc", backendUsage()),
			formatFlag("output: table (nccl-tests layout), json or csv"),
			telemetryFlag(),
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "deadline of each size's warmup, timed loop and check", EnvVars: envs("timeout")},
		},
		Action: collectiveAction,
	}
}

// collectiveOpts is the parsed command line of collective.
type collectiveOpts struct {
	cfg       bench.CollectiveConfig // cfg.RedOp is ops[0]
	ops       []comm.Op              // -o: one, or each in turn with -o all
	ranks     int
	backend   backend
	format    string
	telemetry time.Duration // --telemetry-interval
}

func parseCollective(c *cli.Context) (collectiveOpts, error) {
	var o collectiveOpts
	var err error
	if o.cfg.Op, err = bench.ParseCollective(c.String("collective")); err != nil {
		return o, usagef("--collective %q: want allreduce, broadcast, reduce, allgather, reducescatter or sendrecv", c.String("collective"))
	}
	if o.cfg.MinBytes, err = parseSize("-b/--minbytes", c.String("minbytes")); err != nil {
		return o, err
	}
	if o.cfg.MaxBytes, err = parseSize("-e/--maxbytes", c.String("maxbytes")); err != nil {
		return o, err
	}
	if o.cfg.MaxBytes < o.cfg.MinBytes {
		return o, usagef("-e/--maxbytes %d is smaller than -b/--minbytes %d", o.cfg.MaxBytes, o.cfg.MinBytes)
	}
	o.cfg.Factor = c.Int("stepfactor")
	if c.IsSet("stepfactor") && c.String("stepbytes") != "" {
		return o, usagef("-f/--stepfactor %d and -i/--stepbytes %q: give one of them", o.cfg.Factor, c.String("stepbytes"))
	}
	if s := c.String("stepbytes"); s != "" {
		if o.cfg.Step, err = parseSize("-i/--stepbytes", s); err != nil {
			return o, err
		}
		o.cfg.Factor = 1
	} else if o.cfg.Factor < 2 {
		return o, usagef("-f/--stepfactor %d: want >= 2 (or -i for a fixed increment)", o.cfg.Factor)
	}
	if o.cfg.DType, err = comm.ParseDType(c.String("datatype")); err != nil {
		return o, usagef("-d/--datatype %q: want float, half, bfloat16, double, int32, int64 or uint8", c.String("datatype"))
	}
	if o.ops, err = parseRedOps(c.String("op"), o.cfg.Op); err != nil {
		return o, err
	}
	o.cfg.RedOp = o.ops[0]
	o.cfg.Root = c.Int("root")
	o.cfg.Iters = c.Int("iters")
	o.cfg.Warmup = c.Int("warmup-iters")
	switch c.Int("check") {
	case 0:
	case 1:
		o.cfg.Check = true
	default:
		return o, usagef("-c/--check %d: want 0 or 1", c.Int("check"))
	}
	if o.cfg.Average, err = bench.ParseAverage(c.Int("average")); err != nil {
		return o, usagef("-a/--average %d: want 0 (rank 0), 1 (mean), 2 (min) or 3 (max)", c.Int("average"))
	}
	if o.cfg.Iters < 1 {
		return o, usagef("-n/--iters %d: want >= 1", o.cfg.Iters)
	}
	if o.cfg.Warmup < 0 {
		return o, usagef("-w/--warmup-iters %d: want >= 0", o.cfg.Warmup)
	}
	// Sizes and counts: the rows are kept for the footer, and every
	// count must fit the int32 that MPI and NCCL take.
	if k := o.cfg.NumSizes(); k > bench.MaxSizes {
		step := fmt.Sprintf("-f/--stepfactor %d", o.cfg.Factor)
		if o.cfg.Factor == 1 {
			step = fmt.Sprintf("-i/--stepbytes %d", o.cfg.Step)
		}
		return o, usagef("-b/--minbytes %d to -e/--maxbytes %d by %s: more than %d sizes", o.cfg.MinBytes, o.cfg.MaxBytes, step, bench.MaxSizes)
	}
	if count := o.cfg.MaxBytes / int64(o.cfg.DType.Size()); count > math.MaxInt32 {
		return o, usagef("-e/--maxbytes %d: %d elements of %s, more than a collective's count can hold (%d)",
			o.cfg.MaxBytes, count, o.cfg.DType, math.MaxInt32)
	}
	if o.backend, err = lookupBackend(c.String("backend")); err != nil {
		return o, err
	}
	if o.ranks, err = worldRanks(o.backend, c.Int("ranks"), c.IsSet("ranks")); err != nil {
		return o, err
	}
	o.cfg.Device = o.backend.DeviceMemory
	if o.cfg.Op.Rooted() && (o.cfg.Root < 0 || o.cfg.Root >= o.ranks) {
		return o, usagef("-r/--root %d: want 0..%d with %d ranks", o.cfg.Root, o.ranks-1, o.ranks)
	}
	if o.cfg.Op == bench.SendRecv && o.ranks < 2 {
		return o, usagef("--collective sendrecv needs --ranks >= 2")
	}
	// The largest size must move some data; smaller sizes are skipped
	// (nccl-tests prints them with no data).
	if need := minBytes(o.cfg.Op, o.cfg.DType, o.ranks); o.cfg.MaxBytes < need {
		return o, usagef("-e/--maxbytes %d: %s of %s with %d ranks needs at least %d bytes",
			o.cfg.MaxBytes, o.cfg.Op, o.cfg.DType, o.ranks, need)
	}
	if o.cfg.Timeout = c.Duration("timeout"); o.cfg.Timeout <= 0 {
		return o, usagef("--timeout %v: want a positive duration", o.cfg.Timeout)
	}
	if o.format, err = parseFormat(c.String("format")); err != nil {
		return o, err
	}
	if o.telemetry, err = parseTelemetryInterval(c); err != nil {
		return o, err
	}
	// Each rank holds a send and a receive buffer of the largest size.
	if err := checkMemory(2*o.cfg.MaxBytes*int64(o.ranks), fmt.Sprintf("-e/--maxbytes %d with --ranks %d (a send and a receive buffer per rank)",
		o.cfg.MaxBytes, o.ranks)); err != nil {
		return o, err
	}
	return o, nil
}

// allOps is nccl-tests' -o all, in its order, less prod.
var allOps = []comm.Op{comm.Sum, comm.Max, comm.Min, comm.Avg}

// parseRedOps parses -o/--op for collective op: the reduction, or with
// "all" every reduction in turn, as nccl-tests does; a collective that
// reduces nothing runs once (nccl-tests' broadcast and all_gather
// ignore -o; its sendrecv loops over it, printing the op). A collective's
// name, which --op took before it followed nccl-tests, is refused with
// the flag that takes it now.
func parseRedOps(s string, op bench.Collective) ([]comm.Op, error) {
	var ops []comm.Op
	switch s {
	case "all":
		ops = allOps
	case "prod":
		return nil, usagef("-o/--op prod: ddpgo's collectives have no product reduction; want sum, max, min, avg or all")
	default:
		r, err := comm.ParseOp(s)
		if err != nil {
			if _, cerr := bench.ParseCollective(s); cerr == nil {
				return nil, usagef("-o/--op %q names a collective: -o/--op is the reduction, as nccl-tests' -o (sum, max, min, avg, all); "+
					"the collective is --collective %s", s, s)
			}
			return nil, usagef("-o/--op %q: want sum, max, min, avg or all", s)
		}
		ops = []comm.Op{r}
	}
	if !op.Reduces() && op != bench.SendRecv {
		ops = ops[:1]
	}
	return ops, nil
}

// redOpName is -o as given: a reduction, or all.
func (o *collectiveOpts) redOpName() string {
	if len(o.ops) > 1 {
		return "all"
	}
	return o.cfg.RedOp.String()
}

// tests is the number of rows a whole sweep prints: a row per size per
// reduction.
func (o *collectiveOpts) tests() int { return len(o.cfg.Sizes()) * len(o.ops) }

// minBytes is the smallest size for which op moves any data: one element,
// or for all_gather and reduce_scatter one 16-byte-aligned slice per rank
// (nccl-tests rounds their per-rank count down to 16 bytes).
func minBytes(op bench.Collective, dt comm.DType, ranks int) int64 {
	if op == bench.AllGather || op == bench.ReduceScatter {
		return int64(max(16, dt.Size()) * ranks)
	}
	return int64(dt.Size())
}

func collectiveAction(c *cli.Context) error {
	if c.Args().Present() {
		return unexpectedArg(c, c.Args().First(), "collective takes flags only")
	}
	o, err := parseCollective(c)
	if err != nil {
		return err
	}
	g, err := startGroup(c.Context, o.backend, o.ranks, o.cfg.Timeout)
	if err != nil {
		return err
	}
	defer g.close()
	out, errOut := c.App.Writer, c.App.ErrWriter
	if g.quietRank() {
		out, errOut = io.Discard, io.Discard // rank 0 prints the group's table
	}
	w := newCollectiveWriter(out, o)
	w.comms = g.comms
	if g.launched {
		hosts, err := bench.Hosts(c.Context, g.comms[0], w.host, w.pid)
		if err != nil {
			return err
		}
		w.hosts = hosts
	}
	// Rank 0 writes the header; if it cannot, the ranks agree to stop
	// before the first timed collective (agree).
	if err := g.agree(c.Context, w.header(), o.cfg.Timeout, c.App.ErrWriter, rawArgs(c)); err != nil {
		return err
	}
	bar := newProgress(errOut, "collective", o.tests(), o.format == "table")
	defer bar.stop()
	// The GPUs are sampled over the sweep (each size's warmup and timed
	// iterations); each row gets the samples taken while its size ran.
	tel := groupTelemetry(g, o.backend, o.telemetry, errOut)
	defer tel.stop()
	tel.start()
	var werr error
	var rows []bench.CollectiveRow
	for _, op := range o.ops {
		cfg := o.cfg
		cfg.RedOp = op
		var opRows []bench.CollectiveRow
		opRows, err = bench.RunCollective(c.Context, g.comms, cfg, func(r bench.CollectiveRow) {
			seg := tel.cut()
			w.rowGPU = append(w.rowGPU, seg)
			bar.add(1)
			if werr == nil {
				bar.above(func() { werr = w.row(r) })
			}
		})
		rows = append(rows, opRows...)
		if err != nil {
			break
		}
	}
	tel.stop()
	w.sweepGPU = tel.summary()
	bar.stop()
	interrupted := err != nil && c.Context.Err() != nil
	if err != nil && !interrupted {
		return timeoutHint(err, o.cfg.Timeout)
	}
	if werr != nil {
		return werr
	}
	w.interrupted = interrupted
	if err := w.footer(rows); err != nil {
		return err
	}
	if interrupted {
		return interruptedError{msg: fmt.Sprintf("interrupted: %d of %d sizes measured", len(rows), o.tests()), err: err}
	}
	if wrong := bench.WrongTotal(rows); wrong > 0 {
		return fmt.Errorf("%w: %d wrong elements in %d of the %s sweep's tests", bench.ErrWrong, wrong, bench.WrongTests(rows), o.cfg.Op)
	}
	return nil
}

// collectiveWriter prints a sweep in one of the output formats, a row at a
// time so that long sweeps show progress.
type collectiveWriter struct {
	out    io.Writer
	o      collectiveOpts
	host   string // for the "Using devices" lines
	pid    int
	hosts  []bench.Host // every rank's, in a launched job
	comms  []comm.Communicator
	header func() error
	row    func(bench.CollectiveRow) error
	footer func([]bench.CollectiveRow) error
	// interrupted marks a sweep cut short: the footer says so.
	interrupted bool
	// GPU telemetry, nil where there is none: rowGPU[i] is row i's
	// (appended before the row is written), sweepGPU the sweep's.
	rowGPU   []*gpuSummary
	sweepGPU *gpuSummary
}

func newCollectiveWriter(out io.Writer, o collectiveOpts) *collectiveWriter {
	host, _ := os.Hostname()
	w := &collectiveWriter{out: out, o: o, host: host, pid: os.Getpid()}
	switch o.format {
	case "json":
		w.header = func() error { return nil }
		w.row = func(bench.CollectiveRow) error { return nil }
		w.footer = w.jsonFooter
	case "csv":
		w.header = w.csvHeader
		w.row = w.csvRow
		w.footer = func([]bench.CollectiveRow) error { return nil }
	default:
		w.header = w.tableHeader
		w.row = w.tableRow
		w.footer = w.tableFooter
	}
	return w
}

func (w *collectiveWriter) tableHeader() error {
	cfg, o := &w.o.cfg, w.o
	b := &strings.Builder{}
	validation := 0
	if cfg.Check {
		validation = 1
	}
	step := fmt.Sprintf("%d(factor)", cfg.Factor)
	if cfg.Factor == 1 {
		step = fmt.Sprintf("%d(bytes)", cfg.Step)
	}
	fmt.Fprintf(b, "# Collective test: %s, backend %s\n", ncclTestName(cfg.Op), o.backend.Name)
	if o.backend.library != "" {
		fmt.Fprintf(b, "# Library: %s; buffers in device memory\n", o.backend.library)
	}
	if o.backend.standIn != "" {
		fmt.Fprintf(b, "# %s\n", o.backend.standInBanner())
	}
	fmt.Fprintf(b, "# nThread 1 nRanks %d minBytes %d maxBytes %d step: %s warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0\n",
		o.ranks, cfg.MinBytes, cfg.MaxBytes, step, cfg.Warmup, cfg.Iters, validation)
	fmt.Fprintf(b, "#\n# Using devices\n")
	for r := range o.ranks {
		dev := fmt.Sprintf("%2d [cpu]", r)
		if o.backend.DeviceMemory {
			dev = w.device(r)
		}
		if w.hosts != nil {
			h := w.hosts[r]
			fmt.Fprintf(b, "#  Rank %2d Group  0 Pid %6d on %10s device %s %s process\n", r, h.PID, h.Name, dev, o.backend.Name)
			continue
		}
		fmt.Fprintf(b, "#  Rank %2d Group  0 Pid %6d on %10s device %s %s rank goroutine\n", r, w.pid, w.host, dev, o.backend.Name)
	}
	fmt.Fprintf(b, "#\n")
	if bench.EmulatedOutOfPlace(cfg.Op) {
		fmt.Fprintf(b, "# out-of-place = copy(send->recv) + in-place %s (the comm contract's %s is in place only)\n", cfg.Op.Kind(), cfg.Op.Kind())
	}
	if cfg.Op == bench.SendRecv {
		fmt.Fprintf(b, "# sendrecv: rank r sends to r+1 and receives from r-1; no in-place form (N/A)\n")
	}
	fmt.Fprintf(b, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "", "", "")
	fmt.Fprintf(b, "# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root")
	fmt.Fprintf(b, "  %7s  %6s  %6s %6s", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(b, "  %7s  %6s  %6s %6s\n", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(b, "# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "")
	fmt.Fprintf(b, "  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "")
	fmt.Fprintf(b, "  %7s  %6s  %6s  %5s\n", "(us)", "(GB/s)", "(GB/s)", "")
	_, err := io.WriteString(w.out, b.String())
	return err
}

// device describes rank r's device, its ordinal and its name, where this
// process runs rank r; a launched job's other ranks run on the device of
// their local rank, which this process does not know.
func (w *collectiveWriter) device(r int) string {
	for _, c := range w.comms {
		if c.Rank() == r {
			d := comm.DeviceOf(c)
			if d < len(w.o.backend.devices) {
				return fmt.Sprintf("%2d [%s]", d, w.o.backend.devices[d])
			}
			return fmt.Sprintf("%2d", d)
		}
	}
	return " ? [its local rank's]"
}

// ncclTestName returns the name of op's nccl-tests binary without
// "_perf" (sendrecv_perf times a send and a receive together).
func ncclTestName(op bench.Collective) string {
	if op == bench.SendRecv {
		return "sendrecv"
	}
	return op.Kind().String()
}

// formatRow renders one row exactly as nccl-tests does.
func formatRow(r bench.CollectiveRow) string {
	b := &strings.Builder{}
	fmt.Fprintf(b, "%12d  %12d  %8s  %6s  %6d", r.Bytes, r.Count, r.DType, r.RedOp, r.Root)
	for _, t := range []bench.Timing{r.OutOfPlace, r.InPlace} {
		if !t.Valid {
			fmt.Fprintf(b, "  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A")
			continue
		}
		wrong := "N/A"
		if t.Checked {
			wrong = fmt.Sprintf("%d", t.Wrong)
		}
		fmt.Fprintf(b, "  %7s  %6.2f  %6.2f  %5s", usecString(t.Time), t.AlgBW, t.BusBW, wrong)
	}
	b.WriteByte('\n')
	return b.String()
}

// usecString formats a time in microseconds with nccl-tests' precision:
// two decimals below 100 us, one below 10 ms, none above.
func usecString(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	switch {
	case us >= 10000:
		return fmt.Sprintf("%7.0f", us)
	case us >= 100:
		return fmt.Sprintf("%7.1f", us)
	}
	return fmt.Sprintf("%7.2f", us)
}

func (w *collectiveWriter) tableRow(r bench.CollectiveRow) error {
	_, err := io.WriteString(w.out, formatRow(r))
	return err
}

func (w *collectiveWriter) tableFooter(rows []bench.CollectiveRow) error {
	// nccl-tests counts the tests (a size in one placement) that had wrong
	// elements, not the elements; the rows' #wrong columns hold those.
	wrong := bench.WrongTests(rows)
	status := "OK"
	if wrong > 0 {
		status = "FAILED"
	}
	check := ""
	if !w.o.cfg.Check {
		check = "(check disabled)"
	}
	if w.interrupted {
		if _, err := fmt.Fprintf(w.out, "# INTERRUPTED after %d of %d sizes: the footer covers those\n", len(rows), w.o.tests()); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w.out, "# Out of bounds values : %d %s\n# Avg bus bandwidth    : %g %s\n#\n",
		wrong, status, roundTo(bench.AvgBusBW(rows), 5), check)
	if err == nil && w.sweepGPU != nil {
		_, err = fmt.Fprintf(w.out, "%s#\n", w.sweepGPU.table("# ", "over the sweep"))
	}
	if err == nil && w.o.backend.standIn != "" {
		_, err = fmt.Fprintf(w.out, "# %s\n", w.o.backend.standInBanner())
	}
	return err
}

// roundTo rounds v to sig significant digits, as %g with nccl-tests'
// default precision prints it.
func roundTo(v float64, sig int) float64 {
	var f float64
	fmt.Sscanf(fmt.Sprintf("%.*g", sig, v), "%g", &f)
	return f
}

// collectiveCSVHeader names collective's CSV columns; a row's telemetry
// columns hold the samples taken while its size ran.
var collectiveCSVHeader = slices.Concat([]string{"op", "size_bytes", "count", "type", "redop", "root",
	"oop_time_us", "oop_algbw_gbs", "oop_busbw_gbs", "oop_wrong",
	"ip_time_us", "ip_algbw_gbs", "ip_busbw_gbs", "ip_wrong", "ranks", "backend"}, telemetryCSVHeader(), []string{"library", "stand_in"})

// lastRowGPU is the telemetry of the row being written, or nil.
func (w *collectiveWriter) lastRowGPU() *gpuSummary {
	if len(w.rowGPU) == 0 {
		return nil
	}
	return w.rowGPU[len(w.rowGPU)-1]
}

func (w *collectiveWriter) csvHeader() error {
	return writeCSV(w.out, collectiveCSVHeader)
}

func (w *collectiveWriter) csvRow(r bench.CollectiveRow) error {
	rec := []string{w.o.cfg.Op.String(), fmt.Sprint(r.Bytes), fmt.Sprint(r.Count), r.DType.String(), r.RedOp, fmt.Sprint(r.Root)}
	for _, t := range []bench.Timing{r.OutOfPlace, r.InPlace} {
		if !t.Valid {
			rec = append(rec, "", "", "", "")
			continue
		}
		wrong := ""
		if t.Checked {
			wrong = fmt.Sprint(t.Wrong)
		}
		rec = append(rec, fmtFloat(float64(t.Time)/float64(time.Microsecond)), fmtFloat(t.AlgBW), fmtFloat(t.BusBW), wrong)
	}
	rec = append(rec, fmt.Sprint(w.o.ranks), w.o.backend.Name)
	rec = append(rec, w.lastRowGPU().csv()...)
	rec = append(rec, w.o.backend.library, w.o.backend.standIn)
	return writeCSV(w.out, rec)
}

// collectiveJSON is the json output of collective.
type collectiveJSON struct {
	Op               string          `json:"op"`
	Backend          string          `json:"backend"`
	Library          string          `json:"library,omitempty"`  // the library loaded (nccl)
	StandIn          string          `json:"stand_in,omitempty"` // not empty: the test stand-in, not NCCL, no GPU
	DeviceMemory     bool            `json:"device_memory,omitempty"`
	Ranks            int             `json:"ranks"`
	DType            string          `json:"dtype"`
	RedOp            string          `json:"redop"` // -o: one reduction, or "all" (each row names its own)
	Iters            int             `json:"iters"`
	Warmup           int             `json:"warmup"`
	Check            bool            `json:"check"`
	Average          int             `json:"average"` // nccl-tests' -a: 0 rank 0, 1 mean, 2 min, 3 max
	OutOfPlaceIsCopy bool            `json:"out_of_place_is_copy_plus_in_place"`
	Rows             []collectiveRow `json:"rows"`
	AvgBusBW         float64         `json:"avg_busbw_gbs"`
	Wrong            int64           `json:"wrong"`        // wrong elements, all rows
	FailedTests      int             `json:"failed_tests"` // placements with wrong elements ("Out of bounds values")
	Interrupted      bool            `json:"interrupted"`  // the rows stop at the size Ctrl-C cut short
	// GPUTelemetry is NVML's view of the ranks' GPUs over the sweep (a
	// device backend with NVML); absent otherwise.
	GPUTelemetry *telemetryJSON `json:"gpu_telemetry,omitempty"`
}

type collectiveRow struct {
	Bytes      int64       `json:"size_bytes"`
	Count      int         `json:"count"`
	RedOp      string      `json:"redop"` // "none" for a collective that reduces nothing, as nccl-tests prints it
	Root       int         `json:"root"`
	OutOfPlace *timingJSON `json:"out_of_place"`
	InPlace    *timingJSON `json:"in_place"`
	// GPUTelemetry holds the samples taken while this size ran, which a
	// size shorter than --telemetry-interval may have none of.
	GPUTelemetry *telemetryJSON `json:"gpu_telemetry,omitempty"`
}

type timingJSON struct {
	TimeUS float64 `json:"time_us"`
	AlgBW  float64 `json:"algbw_gbs"`
	BusBW  float64 `json:"busbw_gbs"`
	Wrong  *int64  `json:"wrong"` // null when not checked
}

func timingOut(t bench.Timing) *timingJSON {
	if !t.Valid {
		return nil
	}
	j := &timingJSON{TimeUS: float64(t.Time) / float64(time.Microsecond), AlgBW: t.AlgBW, BusBW: t.BusBW}
	if t.Checked {
		w := t.Wrong
		j.Wrong = &w
	}
	return j
}

func (w *collectiveWriter) jsonFooter(rows []bench.CollectiveRow) error {
	cfg := &w.o.cfg
	j := collectiveJSON{Op: cfg.Op.String(), Backend: w.o.backend.Name, Library: w.o.backend.library, StandIn: w.o.backend.standIn,
		DeviceMemory: cfg.Device, Ranks: w.o.ranks, DType: cfg.DType.String(),
		RedOp: w.o.redOpName(), Iters: cfg.Iters, Warmup: cfg.Warmup, Check: cfg.Check, Average: cfg.Average.NCCLTests(),
		OutOfPlaceIsCopy: bench.EmulatedOutOfPlace(cfg.Op), AvgBusBW: bench.AvgBusBW(rows), Wrong: bench.WrongTotal(rows), FailedTests: bench.WrongTests(rows),
		Interrupted: w.interrupted, Rows: []collectiveRow{}, GPUTelemetry: w.sweepGPU.json()}
	for i, r := range rows {
		row := collectiveRow{Bytes: r.Bytes, Count: r.Count, RedOp: r.RedOp, Root: r.Root, OutOfPlace: timingOut(r.OutOfPlace), InPlace: timingOut(r.InPlace)}
		if i < len(w.rowGPU) {
			row.GPUTelemetry = w.rowGPU[i].json()
		}
		j.Rows = append(j.Rows, row)
	}
	return writeJSON(w.out, j)
}
