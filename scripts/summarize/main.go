// Command summarize reads the results directory that scripts/compare.sh
// fills (the peers' CSV files, Go benchmark output, ddpbench JSON) and
// prints the README's results table: each ddpgo figure beside its baseline
// measured in the same run, with the ratio and the goal.
//
// Usage: go run ./scripts/summarize DIR
package main

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: summarize RESULTS_DIR")
		os.Exit(2)
	}
	s := &summary{dir: os.Args[1]}
	exists := func(f string) bool { _, err := os.Stat(filepath.Join(s.dir, f)); return err == nil }
	// compare.sh's PARTS=allreduce leaves out the in-process rows and the
	// step's other rows; the goals of the all-reduce need neither.
	if exists("memcpy_bw.csv") {
		s.print(os.Stdout)
	}
	if exists("mpi_resnet50.json") {
		fmt.Println()
		s.printMPI(os.Stdout)
	}
	if exists("go_inproc_loaded.txt") {
		fmt.Println()
		s.printGoals(os.Stdout)
	}
	if exists("go_inproc_ab_new.txt") {
		fmt.Println()
		s.printBaseline(os.Stdout)
	}
	if len(s.missing) > 0 {
		fmt.Fprintf(os.Stderr, "summarize: could not read: %s\n", strings.Join(s.missing, "; "))
		os.Exit(1)
	}
}

type summary struct {
	dir     string
	missing []string
}

func (s *summary) fail(what string, err error) float64 {
	s.missing = append(s.missing, fmt.Sprintf("%s: %v", what, err))
	return 0
}

// csvRow returns the first row of file whose columns match every
// key=value in where (nil if none) and the file's column indexes.
func (s *summary) csvRow(file string, where map[string]string) ([]string, map[string]int, error) {
	f, err := os.Open(filepath.Join(s.dir, file))
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	cr := csv.NewReader(f)
	cr.FieldsPerRecord = -1 // the peers do not quote commas inside names
	rows, err := cr.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, nil, fmt.Errorf("not a CSV file with a header: %v", err)
	}
	idx := map[string]int{}
	for i, h := range rows[0] {
		idx[h] = i
	}
next:
	for _, r := range rows[1:] {
		for k, v := range where {
			i, ok := idx[k]
			if !ok || i >= len(r) || r[i] != v {
				continue next
			}
		}
		return r, idx, nil
	}
	return nil, idx, nil
}

// csvHas reports whether file has a row matching where (quietly: an
// older result directory lacks some rows).
func (s *summary) csvHas(file string, where map[string]string) bool {
	r, _, err := s.csvRow(file, where)
	return err == nil && r != nil
}

// oursBest is ddpgo's value of col in the sweep's rows of one launch
// (suffix: the round, mode, bytes), the better of its plain launch and,
// where the run has one, its launch with glibc's thresholds raised, as
// Open MPI's figure is the better of its vader and vader_tuned rows. The
// rows are the backend as ddp uses it, on its shared memory ("shared"
// labels), or, in results from before it had any, "blocking" ones.
func (s *summary) oursBest(col, suffix, mode, bytes string) float64 {
	const sweep = "mpi_sweep.csv"
	kind := "blocking"
	if s.csvHas(sweep, map[string]string{"label": "shared" + suffix, "mode": mode, "bytes": bytes}) {
		kind = "shared"
	}
	v := s.csvValue(sweep, col, map[string]string{"label": kind + suffix, "mode": mode, "bytes": bytes})
	tuned := map[string]string{"label": kind + "_tuned" + suffix, "mode": mode, "bytes": bytes}
	if s.csvHas(sweep, tuned) {
		t := s.csvValue(sweep, col, tuned)
		if col == "median_us" {
			v = min(v, t)
		} else {
			v = max(v, t)
		}
	}
	return v
}

// csvValue returns column col of the first row of file whose columns
// match every key=value in where.
func (s *summary) csvValue(file, col string, where map[string]string) float64 {
	r, idx, err := s.csvRow(file, where)
	if err != nil {
		return s.fail(file, err)
	}
	i, ok := idx[col]
	if !ok {
		return s.fail(file, fmt.Errorf("no column %q", col))
	}
	if r == nil {
		return s.fail(file, fmt.Errorf("no row with %v", where))
	}
	if i >= len(r) {
		return s.fail(file, fmt.Errorf("row %v has no column %q", where, col))
	}
	v, err := strconv.ParseFloat(r[i], 64)
	if err != nil {
		return s.fail(file, err)
	}
	return v
}

// benchMedian returns the median of metric unit over the lines of a Go
// benchmark output file whose name matches re.
func (s *summary) benchMedian(file, name, unit string) float64 {
	f, err := os.Open(filepath.Join(s.dir, file))
	if err != nil {
		return s.fail(file, err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^Benchmark` + name + `(-\d+)?\s`)
	var vals []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !re.MatchString(line) {
			continue
		}
		fs := strings.Fields(line)
		for i := 3; i < len(fs); i += 2 {
			if fs[i] == unit {
				if v, err := strconv.ParseFloat(fs[i-1], 64); err == nil {
					vals = append(vals, v)
				}
			}
		}
	}
	if len(vals) == 0 {
		return s.fail(file, fmt.Errorf("no %s lines with %s", name, unit))
	}
	return median(vals)
}

// jsonValue returns the number at path (keys and array indices joined by
// dots) in the JSON file.
func (s *summary) jsonValue(file, path string) float64 {
	v, err := s.jsonLookup(file, path)
	if err != nil {
		return s.fail(file, err)
	}
	x, ok := v.(float64)
	if !ok {
		return s.fail(file, fmt.Errorf("%s is not a number", path))
	}
	return x
}

// jsonHas reports whether path names a value in the JSON file.
func (s *summary) jsonHas(file, path string) bool {
	v, err := s.jsonLookup(file, path)
	return err == nil && v != nil
}

func (s *summary) jsonLookup(file, path string) (any, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, file))
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(x) {
				return nil, fmt.Errorf("no %s", path)
			}
			v = x[i]
		case map[string]any:
			v = x[k]
		default:
			return nil, fmt.Errorf("no %s", path)
		}
	}
	return v, nil
}

// footer returns the number after "Avg bus bandwidth" and after "Out of
// bounds values" in ddpbench collective's output.
func (s *summary) footer(file string) (busbw, wrong float64) {
	b, err := os.ReadFile(filepath.Join(s.dir, file))
	if err != nil {
		s.fail(file, err)
		return 0, -1
	}
	wrong = -1
	for _, line := range strings.Split(string(b), "\n") {
		if _, rest, ok := strings.Cut(line, "Avg bus bandwidth"); ok {
			busbw, _ = strconv.ParseFloat(strings.TrimSpace(strings.TrimLeft(rest, " :")), 64)
		}
		if _, rest, ok := strings.Cut(line, "Out of bounds values"); ok {
			f := strings.Fields(strings.TrimLeft(rest, " :"))
			if len(f) > 0 {
				wrong, _ = strconv.ParseFloat(f[0], 64)
			}
		}
	}
	return busbw, wrong
}

// fp16Impl returns the fp16 implementation the package chooses at run
// time on this machine: the best one benchmarked, in the order of
// preference of its dispatch.
func (s *summary) fp16Impl() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "go_fp16.txt"))
	if err != nil {
		s.fail("go_fp16.txt", err)
		return ""
	}
	for _, impl := range []string{"avx512", "avx2+f16c", "purego"} {
		if strings.Contains(string(b), "BenchmarkFloat32ToHalf/"+impl+"-") {
			return impl
		}
	}
	s.fail("go_fp16.txt", fmt.Errorf("no Float32ToHalf benchmark"))
	return ""
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1fx", a/b)
}

func (s *summary) print(w io.Writer) {
	const mpi, gloo, memcpy, np, ddp = "mpi_allreduce.csv", "gloo_allreduce.csv", "memcpy_bw.csv", "fp16_convert.csv", "ddp_step.csv"
	// Open MPI's figure is the better of its vader and vader_tuned rows.
	vader := func(bytes, col string) float64 {
		a := s.csvValue(mpi, col, map[string]string{"label": "vader", "mode": "inplace", "bytes": bytes})
		b := s.csvValue(mpi, col, map[string]string{"label": "vader_tuned", "mode": "inplace", "bytes": bytes})
		if col == "median_us" {
			return min(a, b)
		}
		return max(a, b)
	}
	glooAt := func(bytes, col string) float64 {
		return s.csvValue(gloo, col, map[string]string{"dtype": "float32", "bytes": bytes})
	}
	const mib64 = "67108864"

	impl := s.fp16Impl()
	toHalf := s.benchMedian("go_fp16.txt", `Float32ToHalf/`+regexp.QuoteMeta(impl), "GB/s")
	toFloat := s.benchMedian("go_fp16.txt", `HalfToFloat32/`+regexp.QuoteMeta(impl), "GB/s")
	cp := s.benchMedian("go_fp16.txt", `Copy`, "GB/s")
	npTo := s.csvValue(np, "GBps_median", map[string]string{"lib": "numpy", "op": "f32->f16 alloc (astype)"})
	npFrom := s.csvValue(np, "GBps_median", map[string]string{"lib": "numpy", "op": "f16->f32 alloc (astype)"})

	getput := s.benchMedian("go_allocator.txt", `GetPut/25MiB`, "ns/op")
	mmap := s.benchMedian("go_allocator.txt", `Mmap/25MiB`, "ns/op")
	mmapTouch := s.benchMedian("go_allocator.txt", `MmapTouch/25MiB`, "ns/op")

	ar4k := s.benchMedian("go_inproc.txt", `AllReduce/float32/2ranks/4KiB`, "us/op")
	ar64 := s.benchMedian("go_inproc.txt", `AllReduce/float32/2ranks/64MiB`, "busbw-GB/s")
	mpi4k, mpi64 := vader("4096", "median_us"), vader(mib64, "busbw_GBps")
	gloo4k, gloo64 := glooAt("4096", "median_us"), glooAt(mib64, "busbw_GBps")
	addInplace := s.csvValue(memcpy, "copy_GBps_median", map[string]string{"kernel": "add_inplace", "threads": "2"})
	copy1 := s.csvValue(memcpy, "copy_GBps_median", map[string]string{"kernel": "memcpy_glibc", "threads": "1"})

	ptA := s.csvValue(ddp, "median_ms", map[string]string{"config": "a"})
	ptD := s.csvValue(ddp, "median_ms", map[string]string{"config": "d"})
	ptE := s.csvValue(ddp, "median_ms", map[string]string{"config": "e"})
	step := s.jsonValue("ddpbench_resnet50.json", "step_ms.median")
	stepAllocs := s.jsonValue("ddpbench_resnet50.json", "allocs_per_step")
	stepFP16 := s.jsonValue("ddpbench_resnet50_fp16.json", "step_ms.median")
	sleepStep := s.jsonValue("ddpbench_resnet50_sleep.json", "step_ms.median")
	sleepCompute := s.jsonValue("ddpbench_resnet50_sleep.json", "compute_ms.median")
	sleepComm := s.jsonValue("ddpbench_resnet50_sleep.json", "comm_ms.median")
	collBW, collWrong := s.footer("ddpbench_collective.txt")

	fmt.Fprintln(w, "| measurement | ddpgo | baseline (same run) | ratio | goal |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	fmt.Fprintf(w, "| float32->fp16, 64 MiB (%s) | %.1f GB/s | numpy astype %.2f GB/s; Go copy %.1f GB/s | %s; %s of copy | >= 10 GB/s, >= 5x numpy, >= 0.8x copy |\n",
		impl, toHalf, npTo, cp, ratio(toHalf, npTo), ratio(toHalf, cp))
	fmt.Fprintf(w, "| fp16->float32, 64 MiB (%s) | %.1f GB/s | numpy astype %.2f GB/s; Go copy %.1f GB/s | %s; %s of copy | >= 10 GB/s, >= 5x numpy, >= 0.8x copy |\n",
		impl, toFloat, npFrom, cp, ratio(toFloat, npFrom), ratio(toFloat, cp))
	fmt.Fprintf(w, "| CommPool Get+Put, 25 MiB | %.0f ns | mmap+munmap %.0f ns; mmap+first touch+munmap %.0f ns | %s; %s | >= 100x |\n",
		getput, mmap, mmapTouch, ratio(mmap, getput), ratio(mmapTouch, getput))
	fmt.Fprintf(w, "| all_reduce float32 4 KiB, 2 ranks | %.2f us | Open MPI shm (better of vader, vader_tuned) %.2f us; gloo %.0f us | %s; %s | <= 3 us |\n",
		ar4k, mpi4k, gloo4k, ratio(mpi4k, ar4k), ratio(gloo4k, ar4k))
	fmt.Fprintf(w, "| all_reduce float32 64 MiB busbw, 2 ranks | %.1f GB/s | Open MPI shm (better of vader, vader_tuned) %.2f GB/s; gloo %.2f GB/s; roofline a+=b 2 threads %.1f GB/s | %s; %s | >= 8 GB/s, >= 3x MPI |\n",
		ar64, mpi64, gloo64, addInplace, ratio(ar64, mpi64), ratio(ar64, gloo64))
	// PyTorch's rows are processes over sockets, ddpgo's here goroutines
	// sharing memory: quoted, not divided (the processes table compares
	// processes with processes).
	fmt.Fprintf(w, "| DDP step, ResNet-50, 2 in-process ranks (goroutines), 25 MiB buckets | %.1f ms, %.1f allocs/step | PyTorch DDP, 2 processes over gloo: %.1f ms with DDP, %.1f ms without | not like for like (shared memory against sockets): see the processes table | <= 25 ms |\n",
		step, stepAllocs, ptA, ptE)
	fmt.Fprintf(w, "| same, fp16 compression | %.1f ms | PyTorch fp16_compress_hook: %.1f ms with DDP | same caveat | - |\n",
		stepFP16, ptD)
	fmt.Fprintf(w, "| DDP step with 10 ms of backward (sleep) | %.1f ms = %.2f x max(compute %.1f, comm %.1f) | - | - | <= 1.15x |\n",
		sleepStep, sleepStep/max(sleepCompute, sleepComm), sleepCompute, sleepComm)
	fmt.Fprintf(w, "| ddpbench collective -b 4K -e 256M -f 4 | avg busbw %.2f GB/s, %v wrong | memcpy 1 thread %.1f GB/s | - | #wrong 0 |\n",
		collBW, collWrong, copy1)
}

// printMPI prints the process-against-process table: ddpgo over Open MPI
// (2 processes under mpirun) beside PyTorch's processes and Open MPI's own
// C benchmark, from the same run.
func (s *summary) printMPI(w io.Writer) {
	const ddp, coll, sweep, inter = "ddp_step.csv", "mpi_collective.csv", "mpi_sweep.csv", "mpi_interleaved.csv"
	// The rounds the run made (compare.sh's ROUNDS).
	rounds := 0
	for s.csvHas(inter, map[string]string{"label": fmt.Sprintf("vader_r%d", rounds+1), "mode": "inplace", "bytes": "4096"}) {
		rounds++
	}
	rounds = max(rounds, 1)
	// The interleaved rounds: per round, Open MPI's figure is the better of
	// its vader and vader_tuned rows; the table gives each side's median
	// over the rounds.
	peer := func(bytes, mode string) (us, busbw float64) {
		var uss, bws []float64
		for r := 1; r <= rounds; r++ {
			var u, b float64
			for _, label := range []string{"vader", "vader_tuned"} {
				where := map[string]string{"label": fmt.Sprintf("%s_r%d", label, r), "mode": mode, "bytes": bytes}
				lu, lb := s.csvValue(inter, "median_us", where), s.csvValue(inter, "busbw_GBps", where)
				if u == 0 || lu < u {
					u = lu
				}
				b = max(b, lb)
			}
			uss, bws = append(uss, u), append(bws, b)
		}
		return median(uss), median(bws)
	}
	ours := func(bytes, mode string) (us, busbw float64) {
		var uss, bws []float64
		for r := 1; r <= rounds; r++ {
			suffix := fmt.Sprintf("_r%d", r)
			uss = append(uss, s.oursBest("median_us", suffix, mode, bytes))
			bws = append(bws, s.oursBest("busbw_GBps", suffix, mode, bytes))
		}
		return median(uss), median(bws)
	}
	// ddpbench collective's mean of a loop (nccl-tests' definition),
	// reported beside them.
	loop := func(bytes, col string) float64 {
		return s.csvValue(coll, col, map[string]string{"size_bytes": bytes})
	}
	ptD := s.csvValue(ddp, "median_ms", map[string]string{"config": "d"})
	ptF := s.csvValue(ddp, "median_ms", map[string]string{"config": "f"})
	step := s.jsonValue("mpi_resnet50.json", "step_ms.median")
	stepHow := "one launch each"
	if s.jsonHas("mpi_resnet50_r1.json", "step_ms.median") {
		// Launch for launch: the median over the rounds of each side.
		var ours, theirs []float64
		for r := 1; r <= rounds; r++ {
			ours = append(ours, s.jsonValue(fmt.Sprintf("mpi_resnet50_r%d.json", r), "step_ms.median"))
			theirs = append(theirs, s.csvValue(fmt.Sprintf("ddp_step_f_r%d.csv", r), "median_ms", map[string]string{"config": "f"}))
		}
		step, ptF = median(ours), median(theirs)
		stepHow = fmt.Sprintf("median of %d interleaved launches each", rounds)
	}
	allocs := s.jsonValue("mpi_resnet50.json", "allocs_per_step")
	fp16 := s.jsonValue("mpi_resnet50_fp16.json", "step_ms.median")
	sleepStep := s.jsonValue("mpi_resnet50_sleep.json", "step_ms.median")
	sleepCompute := s.jsonValue("mpi_resnet50_sleep.json", "compute_ms.median")
	sleepComm := s.jsonValue("mpi_resnet50_sleep.json", "comm_ms.median")

	fmt.Fprintln(w, "| measurement | ddpgo over MPI, 2 processes | peer (same run) | ratio | goal |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	fmt.Fprintf(w, "| DDP step, ResNet-50, 25 MiB buckets, --compute none (%s) | %.1f ms, %.1f allocs/step | one gloo all-reduce of the same gradients, 2 PyTorch processes (row f): %.1f ms | %.2fx | <= 0.25x |\n",
		stepHow, step, allocs, ptF, step/ptF)
	// Not "(d) minus (e)": two separate noisy runs of a 200 ms backward on
	// busy cores; row (d) is quoted whole, its backward included.
	fmt.Fprintf(w, "| same, fp16 compression | %.1f ms | PyTorch DDP with fp16_compress_hook (row d, its backward included): %.1f ms | - | - |\n",
		fp16, ptD)
	fmt.Fprintf(w, "| DDP step with 30 ms of backward (sleep), 25 MiB buckets | %.1f ms = %.2f x max(compute %.1f, comm %.1f) | - | - | <= 1.15x |\n",
		sleepStep, sleepStep/max(sleepCompute, sleepComm), sleepCompute, sleepComm)
	// The sweep's best cap for the same backward.
	const sw = "mpi_resnet50_sleep_sweep.json"
	best := -1
	bestStep := 0.0
	for i := 0; ; i++ {
		if !s.jsonHas(sw, fmt.Sprintf("runs.%d", i)) {
			break
		}
		if st := s.jsonValue(sw, fmt.Sprintf("runs.%d.step_ms.median", i)); best < 0 || st < bestStep {
			best, bestStep = i, st
		}
	}
	if best >= 0 {
		r := fmt.Sprintf("runs.%d.", best)
		cmp, cm := s.jsonValue(sw, r+"compute_ms.median"), s.jsonValue(sw, r+"comm_ms.median")
		fmt.Fprintf(w, "| same, the cap the sweep finds best (of 5, 10, 25 MiB) | %.0f MiB: %.1f ms = %.2f x max(compute %.1f, comm %.1f) | - | - | <= 1.15x |\n",
			s.jsonValue(sw, r+"bucket_cap_mb"), bestStep, bestStep/max(cmp, cm), cmp, cm)
	}
	for _, sz := range mpiSizes {
		oopUS, oopBW := peer(sz.bytes, "outofplace")
		ipUS, ipBW := peer(sz.bytes, "inplace")
		oUS, oBW := ours(sz.bytes, "outofplace")
		iUS, iBW := ours(sz.bytes, "inplace")
		if sz.bytes == "4096" {
			fmt.Fprintf(w, "| all_reduce float32 %s, time (out of place / in place), median of %d interleaved rounds, each side the better of its two launches (plain, glibc thresholds raised) | %.2f / %.2f us | Open MPI's C loop, better of vader and vader_tuned: %.2f / %.2f us | %+.2f / %+.2f us | within 1 us |\n",
				sz.name, rounds, oUS, iUS, oopUS, ipUS, oUS-oopUS, iUS-ipUS)
			continue
		}
		fmt.Fprintf(w, "| all_reduce float32 %s, busbw (out of place / in place), same rounds | %.2f / %.2f GB/s | Open MPI, better of vader and vader_tuned: %.2f / %.2f GB/s | %.2fx / %.2fx | >= 0.95x |\n",
			sz.name, oBW, iBW, oopBW, ipBW, oBW/oopBW, iBW/ipBW)
	}
	if s.csvHas(sweep, map[string]string{"label": "shared_r1", "mode": "inplace", "bytes": "4096"}) {
		// The same backend on memory of the caller's own: MPI_Allreduce.
		other := func(bytes, col string) float64 {
			var v []float64
			for r := 1; r <= rounds; r++ {
				v = append(v, s.csvValue(sweep, col, map[string]string{"label": fmt.Sprintf("blocking_r%d", r), "mode": "inplace", "bytes": bytes}))
			}
			return median(v)
		}
		fmt.Fprintf(w, "| the same all-reduce on other memory (DDPGO_MPI_SHM=0: MPI_Allreduce), in place, one launch a round | 4 KiB %.2f us; 64 KiB %.2f, 1 MiB %.2f, 64 MiB %.2f GB/s | - | - | - |\n",
			other("4096", "median_us"), other("65536", "busbw_GBps"), other("1048576", "busbw_GBps"), other("67108864", "busbw_GBps"))
	}
	fmt.Fprintf(w, "| ddpbench collective, nccl-tests' mean of a loop of -n calls, slowest rank (-a 3), out of place / in place | 4 KiB %.1f / %.1f us; 1 MiB %.2f / %.2f GB/s; 64 MiB %.2f / %.2f GB/s | - | - | - |\n",
		loop("4096", "oop_time_us"), loop("4096", "ip_time_us"), loop("1048576", "oop_busbw_gbs"), loop("1048576", "ip_busbw_gbs"),
		loop("67108864", "oop_busbw_gbs"), loop("67108864", "ip_busbw_gbs"))
	s.printMPIRanks(w)
}

// mpiSizes are the all-reduce sizes of the interleaved rounds.
var mpiSizes = []struct{ bytes, name string }{{"4096", "4 KiB"}, {"65536", "64 KiB"}, {"1048576", "1 MiB"},
	{"4194304", "4 MiB"}, {"16777216", "16 MiB"}, {"67108864", "64 MiB"}, {"268435456", "256 MiB"}}

// printMPIRanks prints the one interleaved round with 3 and with 4
// processes: ddpgo's all-reduce beside Open MPI's loop, in place.
func (s *summary) printMPIRanks(w io.Writer) {
	const sweep, inter = "mpi_sweep.csv", "mpi_interleaved.csv"
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| all_reduce float32, in place, one interleaved round | 3 processes: ddpgo / Open MPI | 4 processes: ddpgo / Open MPI |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, sz := range mpiSizes {
		col, unit := "busbw_GBps", "GB/s busbw"
		if sz.bytes == "4096" {
			col, unit = "median_us", "us"
		}
		cell := func(np int) string {
			ours := s.oursBest(col, fmt.Sprintf("_np%d", np), "inplace", sz.bytes)
			var peer float64
			for _, l := range []string{"vader", "vader_tuned"} {
				v := s.csvValue(inter, col, map[string]string{"label": fmt.Sprintf("%s_np%d", l, np), "mode": "inplace", "bytes": sz.bytes})
				if peer == 0 || (col == "median_us" && v < peer) || (col != "median_us" && v > peer) {
					peer = v
				}
			}
			return fmt.Sprintf("%.2f / %.2f %s", ours, peer, unit)
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", sz.name, cell(3), cell(4))
	}
}

// rounds is the number of interleaved rounds the run made (compare.sh's
// ROUNDS), at least 1.
func (s *summary) rounds() int {
	n := 0
	for s.csvHas("mpi_interleaved.csv", map[string]string{"label": fmt.Sprintf("vader_r%d", n+1), "mode": "inplace", "bytes": "4096"}) {
		n++
	}
	return max(n, 1)
}

// peerBest is Open MPI's value of col in the rows labelled vader+suffix
// and vader_tuned+suffix, the better of the two.
func (s *summary) peerBest(col, suffix, mode, bytes string) float64 {
	v := 0.0
	for _, l := range []string{"vader", "vader_tuned"} {
		x := s.csvValue("mpi_interleaved.csv", col, map[string]string{"label": l + suffix, "mode": mode, "bytes": bytes})
		if v == 0 || (col == "median_us" && x < v) || (col != "median_us" && x > v) {
			v = x
		}
	}
	return v
}

// overRounds is the median over the rounds of f's value for the suffix
// of each round (format: one %d, the round; without one, the suffix of
// all).
func overRounds(rounds int, format string, f func(suffix string) float64) float64 {
	var v []float64
	for r := 1; r <= rounds; r++ {
		suffix := format
		if strings.Contains(format, "%d") {
			suffix = fmt.Sprintf(format, r)
		}
		v = append(v, f(suffix))
	}
	return median(v)
}

// printGoals prints the all-reduce's goals (docs/lab/small-messages.md), each
// a ratio of two figures of this run, and whether it is met.
func (s *summary) printGoals(w io.Writer) {
	rounds := s.rounds()
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	fmt.Fprintln(w, "| goal | ddpgo | Open MPI, better of vader and vader_tuned (same run) | ratio | goal | |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	time := func(what, format, mode string, goal float64) {
		n := rounds
		if !strings.Contains(format, "%d") {
			n = 1 // one round, its suffix format itself
		}
		o := overRounds(n, format, func(suf string) float64 { return s.oursBest("median_us", suf, mode, "4096") })
		p := overRounds(n, format, func(suf string) float64 { return s.peerBest("median_us", suf, mode, "4096") })
		fmt.Fprintf(w, "| %s | %.2f us | %.2f us | %.2fx | <= %.1fx | %s |\n", what, o, p, o/p, goal, met(o/p <= goal))
	}
	for _, mode := range []string{"outofplace", "inplace"} {
		name := map[string]string{"outofplace": "out of place", "inplace": "in place"}[mode]
		time(fmt.Sprintf("4 KiB, 2 processes, %s (median of %d rounds)", name, rounds), "_r%d", mode, 0.5)
	}
	for _, np := range []int{3, 4} {
		for _, mode := range []string{"outofplace", "inplace"} {
			name := map[string]string{"outofplace": "out of place", "inplace": "in place"}[mode]
			time(fmt.Sprintf("4 KiB, %d processes on the same cores, %s (one round)", np, name), fmt.Sprintf("_np%d", np), mode, 0.5)
		}
	}
	// Under load: the inproc backend's goroutines, and the processes.
	inproc := s.benchMedian("go_inproc_loaded.txt", `AllReduce/float32/2ranks/4KiB`, "us/op")
	peerLoaded := overRounds(rounds, "_loaded_r%d", func(suf string) float64 { return s.peerBest("median_us", suf, "inplace", "4096") })
	fmt.Fprintf(w, "| 4 KiB with two CPU-bound processes beside, in process (inproc, 2 goroutines; Open MPI in place) | %.2f us | %.2f us | %.2fx | <= 1.5x | %s |\n",
		inproc, peerLoaded, inproc/peerLoaded, met(inproc/peerLoaded <= 1.5))
	for _, mode := range []string{"outofplace", "inplace"} {
		name := map[string]string{"outofplace": "out of place", "inplace": "in place"}[mode]
		time(fmt.Sprintf("4 KiB with two CPU-bound processes beside, 2 processes, %s", name), "_loaded_r%d", mode, 0.5)
	}
	// Out of place against in place, and against Open MPI, from 64 KiB.
	for _, sz := range mpiSizes[1:] {
		bw := func(mode string) float64 {
			return overRounds(rounds, "_r%d", func(suf string) float64 { return s.oursBest("busbw_GBps", suf, mode, sz.bytes) })
		}
		peer := func(mode string) float64 {
			return overRounds(rounds, "_r%d", func(suf string) float64 { return s.peerBest("busbw_GBps", suf, mode, sz.bytes) })
		}
		oop, ip := bw("outofplace"), bw("inplace")
		poop, pip := peer("outofplace"), peer("inplace")
		fmt.Fprintf(w, "| %s busbw, 2 processes: out of place against in place | %.2f / %.2f GB/s | - | %.2fx | >= 0.9x | %s |\n",
			sz.name, oop, ip, oop/ip, met(oop/ip >= 0.9))
		fmt.Fprintf(w, "| %s busbw, 2 processes, against Open MPI (out of place / in place) | %.2f / %.2f GB/s | %.2f / %.2f GB/s | %.2fx / %.2fx | >= 2.2x | %s |\n",
			sz.name, oop, ip, poop, pip, oop/poop, ip/pip, met(oop/poop >= 2.2 && ip/pip >= 2.2))
	}
	if s.jsonHas("mpi_resnet50_r1.json", "step_ms.median") {
		step := overRounds(rounds, "mpi_resnet50_r%d.json", func(f string) float64 { return s.jsonValue(f, "step_ms.median") })
		gloo := overRounds(rounds, "ddp_step_f_r%d.csv", func(f string) float64 {
			return s.csvValue(f, "median_ms", map[string]string{"config": "f"})
		})
		fmt.Fprintf(w, "| ResNet-50 step over MPI, 2 processes, --compute none, against gloo's flat all-reduce (row f; median of %d launches each) | %.1f ms | gloo: %.1f ms | %.2fx | <= 0.2x | %s |\n",
			rounds, step, gloo, step/gloo, met(step/gloo <= 0.2))
	}
}

// printBaseline prints the before and after of a change (compare.sh's
// BASELINE): this tree's figures and the baseline revision's, from the
// same interleaved rounds, each the median over the rounds, with the
// ratio of after to before.
func (s *summary) printBaseline(w io.Writer) {
	rounds := s.rounds()
	fmt.Fprintln(w, "| before and after (BASELINE), median of the interleaved rounds | this tree | baseline | after/before | goal |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	row := func(what, unit string, after, before float64, lowerBetter bool) {
		r := after / before
		goal := "<= 1.10x"
		if !lowerBetter {
			goal = ">= 0.91x" // within 10% in time is 1/1.1 in bandwidth
		}
		fmt.Fprintf(w, "| %s | %.2f %s | %.2f %s | %.2fx | %s |\n", what, after, unit, before, unit, r, goal)
	}
	row("in process (inproc), 4 KiB, 2 ranks in place, slower rank's median", "us",
		s.benchMedian("go_inproc_ab_new.txt", `AllReducePerRank/float32/2ranks/4KiB`, "median-us"),
		s.benchMedian("go_inproc_ab_base.txt", `AllReducePerRank/float32/2ranks/4KiB`, "median-us"), true)
	row("in process (inproc), 64 MiB, 2 ranks in place", "ms",
		s.benchMedian("go_inproc_ab_new.txt", `AllReduce/float32/2ranks/64MiB`, "ns/op")/1e6,
		s.benchMedian("go_inproc_ab_base.txt", `AllReduce/float32/2ranks/64MiB`, "ns/op")/1e6, true)
	if !s.csvHas("mpi_sweep.csv", map[string]string{"label": "shared_base_r1", "mode": "inplace", "bytes": "4096"}) {
		return
	}
	for _, mode := range []string{"outofplace", "inplace"} {
		name := map[string]string{"outofplace": "out of place", "inplace": "in place"}[mode]
		at := func(suffix, col, bytes string) float64 {
			return overRounds(rounds, suffix, func(suf string) float64 { return s.oursBest(col, suf, mode, bytes) })
		}
		row("over MPI, 4 KiB, 2 processes, "+name, "us", at("_r%d", "median_us", "4096"), at("_base_r%d", "median_us", "4096"), true)
		row("over MPI, 64 MiB busbw, 2 processes, "+name, "GB/s", at("_r%d", "busbw_GBps", "67108864"), at("_base_r%d", "busbw_GBps", "67108864"), false)
	}
	if s.jsonHas("mpi_resnet50_base_r1.json", "step_ms.median") {
		row("ResNet-50 step over MPI, 2 processes, --compute none", "ms",
			overRounds(rounds, "mpi_resnet50_r%d.json", func(f string) float64 { return s.jsonValue(f, "step_ms.median") }),
			overRounds(rounds, "mpi_resnet50_base_r%d.json", func(f string) float64 { return s.jsonValue(f, "step_ms.median") }), true)
	}
}
