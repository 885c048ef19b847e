package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/comm"
)

// TestFormatRowMatchesNCCLTests checks a row against a line printed by
// nccl-tests' all_reduce_perf for the same numbers.
func TestFormatRowMatchesNCCLTests(t *testing.T) {
	const nccl = "           8             2     float     sum      -1    135.8    0.00    0.00      0    123.5    0.00    0.00      0\n"
	r := bench.CollectiveRow{Bytes: 8, Count: 2, DType: comm.Float32, RedOp: "sum", Root: -1,
		OutOfPlace: bench.Timing{Valid: true, Checked: true, Time: 135800 * time.Nanosecond, AlgBW: 8 / 135.8e-6 / 1e9, BusBW: 8 / 135.8e-6 / 1e9},
		InPlace:    bench.Timing{Valid: true, Checked: true, Time: 123500 * time.Nanosecond, AlgBW: 8 / 123.5e-6 / 1e9, BusBW: 8 / 123.5e-6 / 1e9}}
	if got := formatRow(r); got != nccl {
		t.Errorf("row\n%q\nnccl-tests\n%q", got, nccl)
	}
	const big = "  2147483648     536870912     float     sum      -1    12646  169.81  318.40      0    12641  169.88  318.52      0\n"
	r = bench.CollectiveRow{Bytes: 2147483648, Count: 536870912, DType: comm.Float32, RedOp: "sum", Root: -1,
		OutOfPlace: bench.Timing{Valid: true, Checked: true, Time: 12646 * time.Microsecond, AlgBW: 169.81, BusBW: 318.40},
		InPlace:    bench.Timing{Valid: true, Checked: true, Time: 12641 * time.Microsecond, AlgBW: 169.88, BusBW: 318.52}}
	if got := formatRow(r); got != big {
		t.Errorf("row\n%q\nnccl-tests\n%q", got, big)
	}
}

func TestUsecString(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1980 * time.Nanosecond:    "   1.98",
		99990 * time.Nanosecond:   "  99.99",
		114700 * time.Nanosecond:  "  114.7",
		9999900 * time.Nanosecond: " 9999.9",
		110464 * time.Microsecond: " 110464",
	} {
		if got := usecString(d); got != want {
			t.Errorf("usecString(%v) = %q, want %q", d, got, want)
		}
	}
}

// sampleRows are fixed results covering the cases of the table: a rooted
// collective, unchecked, failed check, and a placement that does not exist.
func sampleRows() []bench.CollectiveRow {
	ok := func(us, alg, bus float64, wrong int64) bench.Timing {
		return bench.Timing{Valid: true, Checked: true, Time: time.Duration(us * 1e3), AlgBW: alg, BusBW: bus, Wrong: wrong}
	}
	return []bench.CollectiveRow{
		{Bytes: 4096, Count: 1024, DType: comm.Float32, RedOp: "sum", Root: -1, OutOfPlace: ok(2.0, 2.05, 2.05, 0), InPlace: ok(1.98, 2.07, 2.07, 0)},
		{Bytes: 65536, Count: 16384, DType: comm.Float32, RedOp: "sum", Root: -1, OutOfPlace: ok(10.04, 6.53, 6.53, 0), InPlace: ok(6.32, 10.38, 10.38, 3)},
		{Bytes: 268435456, Count: 67108864, DType: comm.Float32, RedOp: "sum", Root: -1, OutOfPlace: ok(110464, 2.43, 2.43, 0), InPlace: ok(77448, 3.47, 3.47, 0)},
		{Bytes: 1024, Count: 512, DType: comm.Float16, RedOp: "none", Root: 1, OutOfPlace: bench.Timing{Valid: true, Time: 3500, AlgBW: 0.29, BusBW: 0.29}},
	}
}

func TestCollectiveTableGolden(t *testing.T) {
	var b bytes.Buffer
	o := collectiveOpts{cfg: bench.CollectiveConfig{Op: bench.AllReduce, DType: comm.Float32, RedOp: comm.Sum,
		MinBytes: 4096, MaxBytes: 268435456, Factor: 4, Iters: 20, Warmup: 5, Check: true}, ranks: 2, backend: backends[0], format: "table"}
	w := newCollectiveWriter(&b, o)
	w.host, w.pid = "host", 4242
	rows := sampleRows()
	if err := w.header(); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if err := w.row(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.footer(rows); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	golden(t, "collective_table.golden", b.Bytes())
	// Every table line is as wide as nccl-tests' (116 columns), except the
	// header lines that describe the run.
	for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
		if !strings.HasPrefix(line, "#") && len(line) != 116 {
			t.Errorf("row is %d wide: %q", len(line), line)
		}
	}
	if !strings.Contains(got, "# Out of bounds values : 1 FAILED\n") || !strings.Contains(got, "# Avg bus bandwidth    : ") {
		t.Errorf("footer:\n%s", got)
	}
}

func TestAvgBusBW(t *testing.T) {
	// The mean over the seven valid timings of sampleRows.
	want := (2.05 + 2.07 + 6.53 + 10.38 + 2.43 + 3.47 + 0.29) / 7
	if got := bench.AvgBusBW(sampleRows()); got < want-1e-9 || got > want+1e-9 {
		t.Errorf("AvgBusBW = %g, want %g", got, want)
	}
}

func TestCollectiveCSVAndJSON(t *testing.T) {
	code, stdout, stderr := run(t, "collective", "--collective", "allgather", "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "--format", "csv")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+3 || !slices.Equal(recs[0], collectiveCSVHeader) {
		t.Fatalf("csv: %q", recs)
	}
	for _, r := range recs[1:] {
		if len(r) != len(collectiveCSVHeader) || r[0] != "allgather" || r[9] != "0" || r[13] != "0" {
			t.Errorf("csv row %q", r)
		}
	}

	code, stdout, stderr = run(t, "collective", "--collective", "sendrecv", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--format", "json")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var j collectiveJSON
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		t.Fatal(err)
	}
	if j.Op != "sendrecv" || j.Ranks != 2 || len(j.Rows) != 2 || j.Wrong != 0 {
		t.Fatalf("json %+v", j)
	}
	for _, r := range j.Rows {
		if r.OutOfPlace == nil || r.InPlace != nil || r.OutOfPlace.Wrong == nil || *r.OutOfPlace.Wrong != 0 {
			t.Errorf("sendrecv row %+v: want an out-of-place timing only, checked", r)
		}
	}
}

func TestCollectiveTableRun(t *testing.T) {
	code, stdout, stderr := run(t, "collective", "-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "--ranks", "3", "-d", "half")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "# Out of bounds values : 0 OK") || strings.Count(stdout, "    half     sum") != 3 {
		t.Errorf("table:\n%s", stdout)
	}
}

// TestNCCLTestName checks the header names each collective as nccl-tests'
// binary is named.
func TestNCCLTestName(t *testing.T) {
	want := map[bench.Collective]string{bench.AllReduce: "all_reduce", bench.Broadcast: "broadcast", bench.Reduce: "reduce",
		bench.AllGather: "all_gather", bench.ReduceScatter: "reduce_scatter", bench.SendRecv: "sendrecv"}
	for _, op := range bench.Collectives {
		if got := ncclTestName(op); got != want[op] {
			t.Errorf("%s: %q, want %q", op, got, want[op])
		}
	}
}

// TestCollectiveAllOps checks -o all: as nccl-tests', each reduction in
// turn (less prod, which ddpgo has not), every row naming its own; a
// collective that reduces nothing runs once.
func TestCollectiveAllOps(t *testing.T) {
	code, stdout, stderr := run(t, "collective", "-o", "all", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--format", "json")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var j collectiveJSON
	if err := json.Unmarshal([]byte(stdout), &j); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range j.Rows {
		got = append(got, fmt.Sprintf("%s %d", r.RedOp, r.Bytes))
	}
	want := []string{"sum 1024", "sum 4096", "max 1024", "max 4096", "min 1024", "min 4096", "avg 1024", "avg 4096"}
	if j.RedOp != "all" || j.Wrong != 0 || !slices.Equal(got, want) {
		t.Errorf("-o all: redop %q, wrong %d, rows %q; want all, 0, %q", j.RedOp, j.Wrong, got, want)
	}

	code, stdout, stderr = run(t, "collective", "--collective", "allgather", "-o", "all", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1")
	if code != 0 || strings.Count(stdout, "    float    none") != 2 || strings.Contains(stdout, "    sum ") {
		t.Errorf("allgather -o all: status %d, want its two sizes once, redop none:\n%s%s", code, stdout, stderr)
	}
}
