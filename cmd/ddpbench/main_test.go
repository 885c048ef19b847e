package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/models"
	"github.com/google/uuid"
	"github.com/urfave/cli/v2"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// run runs ddpbench with args and returns the exit status and output.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = runMain(append([]string{"ddpbench"}, args...), &o, &e)
	return code, o.String(), e.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestErrors checks that every bad command line fails with one line on
// stderr that says what is wrong, and the right exit status.
func TestErrors(t *testing.T) {
	badJSON := writeFile(t, "bad.json", `{"model":"x","params":[{"name":"w","shape":[4,0]}]}`)
	half := writeFile(t, "half.json", `{"model":"h","dtype":"float16","params":[{"name":"w","shape":[4]}]}`)
	syntax := writeFile(t, "syntax.json", "{\n\"model\": \"x\",\n\"params\": [,]}")
	huge := writeFile(t, "huge.json", "{\"model\":\"x\",\"params\":[\n{\"name\":\"a\",\"shape\":[1048576,1048576]},\n{\"name\":\"b\",\"shape\":[2]}]}")
	dir := t.TempDir()
	missingDir := filepath.Join(dir, "missing", "t.json")
	missingSVG := filepath.Join(dir, "missing", "t.svg")
	tests := []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"--bogus"}, 2, []string{"unknown flag --bogus (ddpbench run --help lists the flags)"}},
		// Flags before a command are run's (the default command), which
		// refuses the command after them rather than ignore them.
		{[]string{"--backend", "mpi", "collective", "-b", "4K", "-e", "16K"}, 2,
			[]string{"--backend before the command collective: a command's flags go after it (ddpbench collective --backend mpi -b 4K -e 16K)"}},
		{[]string{"--ranks", "3", "collective"}, 2, []string{"--ranks before the command collective", "(ddpbench collective --ranks 3)"}},
		{[]string{"--ranks=3", "--zero-grad", "sweep"}, 2, []string{"--ranks, --zero-grad before the command sweep", "(ddpbench sweep --ranks=3 --zero-grad)"}},
		{[]string{"--format", "json", "info"}, 2, []string{"--format before the command info"}},
		{[]string{"run", "--bogus"}, 2, []string{"unknown flag --bogus (ddpbench run --help lists the flags)"}},
		{[]string{"collective", "-x"}, 2, []string{"unknown flag -x (ddpbench collective --help lists the flags)"}},
		{[]string{"run", "--ranks"}, 2, []string{"--ranks needs a value (ddpbench run --help)"}},
		{[]string{"run", "--grad-as-bucket-view", "false"}, 2, []string{`unexpected argument "false"`, "--grad-as-bucket-view=false"}},
		{[]string{"run", "--zero-grad", "true"}, 2, []string{"--zero-grad=true"}},
		{[]string{"run", "--grad-as-bucket-view", "maybe"}, 2, []string{`unexpected argument "maybe" after --grad-as-bucket-view`, "--grad-as-bucket-view=true or --grad-as-bucket-view=false"}},
		{[]string{"run", "--grad-as-bucket-view=maybe"}, 2, []string{`--grad-as-bucket-view "maybe": not a valid boolean value`}},
		{[]string{"sweep", "--bucket-cap-mb", "5"}, 2, []string{"unknown flag --bucket-cap-mb (ddpbench sweep --help"}},
		{[]string{"run", "--max-in-flight", "-1"}, 2, []string{"--max-in-flight -1: want 0 (no bound) to 1048576"}},
		{[]string{"sweep", "--plot", "x.png"}, 2, []string{`--plot "x.png"`, "SVG", ".svg"}},
		{[]string{"run", "--stall-interval", "0s"}, 2, []string{"--stall-interval 0s: want a positive duration"}},
		{[]string{"run", "--steps", "2000000000000"}, 2, []string{"--steps 2000000000000: want 1..1000000000000"}},
		{[]string{"run", "--warmup", "2000000000000"}, 2, []string{"--warmup 2000000000000"}},
		{[]string{"run", "--trace-steps", "5000"}, 2, []string{"--trace-steps 5000: want 1..1000"}},
		{[]string{"run", "--compute", "spin", "--rate", "1e-9"}, 2, []string{"--rate: 25,557,032 parameters take", "want at most 24h0m0s"}},
		{[]string{"run", "--gflops", "1e-6", "--batch", "1000000"}, 2, []string{"--gflops 1e-06: 25,557,032 parameters take", "want at most 24h0m0s"}},
		{[]string{"run", "--compute-time", "48h"}, 2, []string{"--compute-time:", "want at most 24h0m0s"}},
		{[]string{"run", "--model", huge}, 2, []string{huge + ":3: params[1].shape", "more than 2^40"}},
		{[]string{"collective", "-b", "4", "-e", "1G", "-i", "4"}, 2, []string{"-b/--minbytes 4 to -e/--maxbytes 1073741824 by -i/--stepbytes 4: more than 65536 sizes"}},
		{[]string{"collective", "-b", "1G", "-e", "1G", "-f", "2", "-d", "uint8", "-e", "16G"}, 2, []string{"-e/--maxbytes 17179869184", "more than a collective's count can hold (2147483647)"}},
		{[]string{"collective", "--warmup", "3"}, 2, []string{"unknown flag --warmup (ddpbench collective --help"}},
		{[]string{"collective", "extra"}, 2, []string{`unexpected argument "extra"`}},
		{[]string{"sweep", "extra"}, 2, []string{`unexpected argument "extra"`}},
		{[]string{"run", "--ranks", "0"}, 2, []string{"--ranks 0"}},
		{[]string{"run", "--ranks", "two"}, 2, []string{`--ranks "two": not a valid value (ddpbench run --help)`}},
		{[]string{"collective", "-n", "x"}, 2, []string{`-n "x": not a valid value`}},
		{[]string{"run", "--bucket-cap-mb", "-1"}, 2, []string{"--bucket-cap-mb -1"}},
		{[]string{"run", "--first-bucket-mb", "0"}, 2, []string{"--first-bucket-mb 0"}},
		{[]string{"run", "--compression", "fp8"}, 2, []string{`--compression "fp8"`}},
		{[]string{"run", "--shard", "layers"}, 2, []string{`--shard "layers": want none, elements or params`}},
		{[]string{"run", "--shard", "params", "--compression", "powersgd"}, 2, []string{"--shard params with --compression powersgd"}},
		{[]string{"run", "--powersgd-rank", "4"}, 2, []string{"--powersgd-rank needs --compression powersgd"}},
		{[]string{"run", "--compression", "powersgd", "--powersgd-rank", "0"}, 2, []string{"--powersgd-rank 0"}},
		{[]string{"run", "--compression", "powersgd", "--powersgd-min-compression-rate", "-1"}, 2, []string{"--powersgd-min-compression-rate -1"}},
		{[]string{"run", "--compute", "warp"}, 2, []string{`--compute "warp"`}},
		{[]string{"run", "--compute", "sleep", "--rate", "1e9", "--gflops", "10"}, 2, []string{"takes one of --rate, --gflops or --compute-time (got --rate, --gflops)"}},
		{[]string{"run", "--compute", "spin", "--rate", "-3"}, 2, []string{"--rate -3"}},
		{[]string{"run", "--compute", "spin", "--gflops", "10", "--batch", "0"}, 2, []string{"--batch 0"}},
		{[]string{"run", "--compute", "none", "--rate", "1e9"}, 2, []string{"--rate needs --compute sleep or spin"}},
		{[]string{"run", "--compute", "none", "--compute-time", "1s"}, 2, []string{"--compute-time needs --compute sleep or spin"}},
		{[]string{"run", "--format", "xml"}, 2, []string{`--format "xml"`}},
		{[]string{"run", "--steps", "0"}, 2, []string{"--steps 0"}},
		{[]string{"run", "--warmup", "-1"}, 2, []string{"--warmup -1"}},
		{[]string{"run", "--trace-steps", "0"}, 2, []string{"--trace-steps 0"}},
		{[]string{"run", "--backend", "mpi"}, 2, []string{"--backend mpi", "not built", "built: inproc"}},
		{[]string{"run", "--backend", "gloo"}, 2, []string{`--backend "gloo"`}},
		// A manifest is input: invalid, it stops the run before it starts.
		{[]string{"run", "--model", "vgg16"}, 2, []string{"unknown model", "vgg16", "resnet50, bert-base, gpt2-small"}},
		{[]string{"run", "--model", badJSON}, 2, []string{badJSON + ":1: params[0].shape[1]"}},
		{[]string{"run", "--model", syntax}, 2, []string{syntax + ":3:", "invalid character"}},
		{[]string{"run", "--model", half}, 2, []string{half, `dtype "float16"`, "float32 gradients only"}},
		{[]string{"sweep", "--model", badJSON}, 2, []string{badJSON + ":1: params[0].shape[1]"}},
		{[]string{"run", "extra"}, 2, []string{`unexpected argument "extra"`}},
		{[]string{"sweep", "--caps", "1,a"}, 2, []string{`"a" is not a size`}},
		{[]string{"sweep", "--caps", "5,2"}, 2, []string{"caps must increase"}},
		{[]string{"collective", "-b", "0"}, 2, []string{`-b/--minbytes "0"`}},
		{[]string{"collective", "-b", "4X"}, 2, []string{`-b/--minbytes "4X"`}},
		{[]string{"collective", "-b", "1M", "-e", "4K"}, 2, []string{"smaller than -b/--minbytes"}},
		{[]string{"collective", "-f", "1"}, 2, []string{"-f/--stepfactor 1"}},
		{[]string{"collective", "-f", "3", "-i", "8"}, 2, []string{"-f/--stepfactor 3", `-i/--stepbytes "8"`, "one of them"}},
		{[]string{"collective", "-b", "1", "-e", "3"}, 2, []string{"-e/--maxbytes 3", "allreduce of float with 2 ranks needs at least 4 bytes"}},
		{[]string{"collective", "--collective", "allgather", "--ranks", "3", "-b", "4", "-e", "40"}, 2, []string{"-e/--maxbytes 40", "at least 48 bytes"}},
		{[]string{"collective", "-d", "int8"}, 2, []string{`-d/--datatype "int8"`}},
		{[]string{"collective", "-o", "prod"}, 2, []string{"-o/--op prod: ddpgo's collectives have no product reduction"}},
		{[]string{"collective", "--op", "mulsum"}, 2, []string{`-o/--op "mulsum": want sum, max, min, avg or all`}},
		{[]string{"collective", "--op", "allgather"}, 2, []string{`-o/--op "allgather" names a collective`, "the collective is --collective allgather"}},
		{[]string{"collective", "--redop", "sum"}, 2, []string{"unknown flag --redop"}},
		{[]string{"collective", "-c", "2"}, 2, []string{"-c/--check 2"}},
		{[]string{"collective", "-n", "0"}, 2, []string{"-n/--iters 0"}},
		{[]string{"collective", "-a", "4"}, 2, []string{"-a/--average 4"}},
		{[]string{"collective", "--collective", "gather"}, 2, []string{`--collective "gather"`}},
		{[]string{"collective", "--collective", "broadcast", "-r", "2"}, 2, []string{"-r/--root 2"}},
		{[]string{"collective", "--collective", "sendrecv", "--ranks", "1"}, 2, []string{"--collective sendrecv needs --ranks >= 2"}},
		{[]string{"nosuch"}, 2, []string{`unknown command "nosuch" (commands: run, sweep, collective, info; ddpbench --help)`}},
		// Output paths are checked before the benchmark runs.
		{[]string{"run", "--trace", missingDir}, 2, []string{fmt.Sprintf("--trace %q", missingDir), "no such file or directory"}},
		{[]string{"run", "--trace", dir}, 2, []string{fmt.Sprintf("--trace %q: is a directory", dir)}},
		{[]string{"sweep", "--plot", missingSVG}, 2, []string{fmt.Sprintf("--plot %q", missingSVG), "no such file or directory"}},
		{[]string{"sweep", "--plot", missingDir}, 2, []string{fmt.Sprintf("--plot %q", missingDir), "must end in .svg"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := run(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit status %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "ddpbench: ") {
				t.Errorf("stderr %q: want one line starting with ddpbench:", stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
		})
	}
}

// TestEnvVarNames checks that every flag of every command can be set
// through DDPBENCH_<NAME>.
func TestEnvVarNames(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	check := func(where string, flags []cli.Flag) {
		for _, f := range flags {
			name := f.Names()[0]
			ev, ok := f.(interface{ GetEnvVars() []string })
			if !ok || !slices.Equal(ev.GetEnvVars(), []string{envName(name)}) {
				t.Errorf("%s --%s: env vars %v, want [%s]", where, name, ev.GetEnvVars(), envName(name))
			}
		}
	}
	check("ddpbench", app.Flags)
	for _, c := range app.Commands {
		check(c.Name, c.Flags)
	}
	if got := envName("bucket-cap-mb"); got != "DDPBENCH_BUCKET_CAP_MB" {
		t.Errorf("envName(bucket-cap-mb) = %s", got)
	}
}

// TestEnvVars checks that the variables take effect and that the command
// line wins over them.
func TestEnvVars(t *testing.T) {
	t.Run("invalid value from the environment", func(t *testing.T) {
		t.Setenv("DDPBENCH_RANKS", "0")
		code, _, stderr := run(t, "run")
		if code != 2 || stderr != "ddpbench: --ranks 0: want 1..1024 (from DDPBENCH_RANKS)\n" {
			t.Errorf("status %d, stderr %q", code, stderr)
		}
		// On the command line, the flag is named alone.
		code, _, stderr = run(t, "run", "--ranks=0")
		if code != 2 || stderr != "ddpbench: --ranks 0: want 1..1024\n" {
			t.Errorf("status %d, stderr %q", code, stderr)
		}
		t.Setenv("DDPBENCH_RANKS", "")
		t.Setenv("DDPBENCH_MODEL", "nosuch")
		code, _, stderr = run(t, "run")
		if code != 2 || !strings.HasPrefix(stderr, `ddpbench: --model: models: unknown model "nosuch"`) || !strings.HasSuffix(stderr, "(from DDPBENCH_MODEL)\n") {
			t.Errorf("status %d, stderr %q", code, stderr)
		}
		t.Setenv("DDPBENCH_MODEL", "")
		t.Setenv("DDPBENCH_MINBYTES", "4X")
		for _, args := range [][]string{{"collective"}, {"collective", "-b", "4X"}, {"collective", "--minbytes", "4X"}} {
			_, _, stderr = run(t, args...)
			if got := strings.Contains(stderr, "(from DDPBENCH_MINBYTES)"); got != (len(args) == 1) {
				t.Errorf("%v: stderr %q", args, stderr)
			}
		}
	})
	t.Run("unparsable value from the environment", func(t *testing.T) {
		t.Setenv("DDPBENCH_STEPS", "many")
		code, _, stderr := run(t, "run")
		if code == 0 || !strings.Contains(stderr, "DDPBENCH_STEPS") {
			t.Errorf("status %d, stderr %q", code, stderr)
		}
	})
	t.Run("value used", func(t *testing.T) {
		t.Setenv("DDPBENCH_FORMAT", "csv")
		t.Setenv("DDPBENCH_MAXBYTES", "4K")
		code, stdout, stderr := run(t, "collective", "-b", "1K", "-n", "1", "-w", "0")
		if code != 0 {
			t.Fatalf("status %d, stderr %q", code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if !strings.HasPrefix(lines[0], "op,size_bytes") || len(lines) != 1+2 {
			t.Errorf("want a CSV header and rows for 1K and 4K, got %q", stdout)
		}
	})
	t.Run("command line wins", func(t *testing.T) {
		t.Setenv("DDPBENCH_FORMAT", "xml")
		code, stdout, stderr := run(t, "collective", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--format", "json")
		if code != 0 || !json.Valid([]byte(stdout)) {
			t.Errorf("status %d, stderr %q, stdout %q", code, stderr, stdout)
		}
	})
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"8", 8}, {"4K", 4096}, {"4k", 4096}, {"4KB", 4096}, {"4KiB", 4096}, {"256M", 256 << 20}, {"1G", 1 << 30}, {" 2M ", 2 << 20},
		{"0", 0}, {"-4K", 0}, {"K", 0}, {"4T", 0}, {"1.5M", 0}, {"", 0},
	}
	for _, tt := range tests {
		got, err := parseSize("-b", tt.in)
		if tt.want == 0 {
			if err == nil {
				t.Errorf("parseSize(%q) = %d, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestGroupDigits(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 25557032: "25,557,032", -1234: "-1,234"} {
		if got := groupDigits(in); got != want {
			t.Errorf("groupDigits(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestRenderBar(t *testing.T) {
	tests := []struct {
		done, total int
		want        string
	}{
		{0, 10, "run [>         ] 0/10 2.5s"},
		{5, 10, "run [=====>    ] 5/10 2.5s"},
		{10, 10, "run [==========] 10/10 2.5s"},
		{12, 10, "run [==========] 10/10 2.5s"},
	}
	for _, tt := range tests {
		if got := renderBar("run", tt.done, tt.total, 2500e6, 10); got != tt.want {
			t.Errorf("renderBar(%d/%d) = %q, want %q", tt.done, tt.total, got, tt.want)
		}
	}
}

// TestProgressSilent checks that the bar writes nothing to a writer that
// is not a terminal.
func TestProgressSilent(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, "x", 3, true)
	p.add(3)
	p.stop()
	p.stop()
	if b.Len() != 0 {
		t.Errorf("progress wrote %q to a buffer", b.String())
	}
}

// tinyModel is a manifest small enough for runs in tests.
const tinyModel = `{"model":"tiny","source":"test","params":[
 {"name":"a.weight","shape":[64,32]},{"name":"a.bias","shape":[64]},
 {"name":"b.weight","shape":[1000,300]},{"name":"b.bias","shape":[1000]}]}`

func TestRunOutputs(t *testing.T) {
	model := writeFile(t, "tiny.json", tinyModel)
	common := []string{"--model", model, "--steps", "3", "--warmup", "1", "--bucket-cap-mb", "0.5", "--first-bucket-mb", "0.01"}
	t.Run("csv", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--format", "csv"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 2 || !slices.Equal(recs[0], runCSVHeader) || len(recs[1]) != len(runCSVHeader) {
			t.Fatalf("csv shape: %q", recs)
		}
		row := map[string]string{}
		for i, k := range recs[0] {
			row[k] = recs[1][i]
		}
		if row["model"] != "tiny" || row["ranks"] != "2" || row["grad_bytes"] != "1212448" || row["bytes_per_step"] != "1212448" {
			t.Errorf("csv row %v", row)
		}
		if _, err := uuid.Parse(row["run_id"]); err != nil {
			t.Errorf("run_id %q: %v", row["run_id"], err)
		}
	})
	t.Run("json", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--format", "json", "--compression", "fp16", "--zero-grad"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		var j runJSON
		dec := json.NewDecoder(strings.NewReader(stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil {
			t.Fatal(err)
		}
		if j.Model != "tiny" || j.Tensors != 4 || j.Parameters != 303112 || j.Compression != "fp16" || j.Steps != 3 {
			t.Errorf("json %+v", j)
		}
		if !j.ZeroGrad {
			t.Error("--zero-grad is not in the json output")
		}
		if _, err := uuid.Parse(j.RunID); err != nil {
			t.Errorf("run_id %q: %v", j.RunID, err)
		}
		if j.BytesPerStep != j.GradBytes/2 {
			t.Errorf("fp16 bytes per step %d, want half of %d", j.BytesPerStep, j.GradBytes)
		}
		var sum int64
		for _, b := range j.Buckets {
			sum += b
		}
		if sum != j.GradBytes || len(j.Buckets) < 2 {
			t.Errorf("buckets %v do not add up to %d", j.Buckets, j.GradBytes)
		}
		if j.Hosts != 1 || len(j.RankHosts) != 2 || j.RankHosts[1].Rank != 1 || j.RankHosts[1].PID != os.Getpid() || j.Transport != nil {
			t.Errorf("hosts %d, rank hosts %+v, transport %+v; want both ranks in this process, no transport", j.Hosts, j.RankHosts, j.Transport)
		}
	})
	t.Run("shard", func(t *testing.T) {
		// The sharded step against the all-reduce step: the same bytes,
		// the all-gathers' time inside the communication's.
		var runs [2]runJSON
		for i, shard := range []string{"none", "elements"} {
			code, stdout, stderr := run(t, append([]string{"run", "--format", "json", "--shard", shard}, common...)...)
			if code != 0 {
				t.Fatalf("--shard %s: status %d: %s", shard, code, stderr)
			}
			dec := json.NewDecoder(strings.NewReader(stdout))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&runs[i]); err != nil {
				t.Fatal(err)
			}
		}
		plain, sharded := runs[0], runs[1]
		if plain.Shard != "none" || plain.GatherMS != nil {
			t.Errorf("--shard none: shard %q, gather %v", plain.Shard, plain.GatherMS)
		}
		if sharded.Shard != "elements" || sharded.GatherMS == nil || !(sharded.GatherMS.Median > 0) || sharded.CommMS.Median < sharded.GatherMS.Median {
			t.Errorf("--shard elements: shard %q, gather %+v, communication %+v", sharded.Shard, sharded.GatherMS, sharded.CommMS)
		}
		if sharded.BytesPerStep != plain.BytesPerStep {
			t.Errorf("bytes per step: %d sharded, %d not", sharded.BytesPerStep, plain.BytesPerStep)
		}
		code, stdout, stderr := run(t, append([]string{"run", "--shard", "params"}, common...)...)
		if code != 0 || !strings.Contains(stdout, "sharded step (--shard params)") || !strings.Contains(stdout, "of it all-gather (ms)") {
			t.Errorf("table with --shard params: status %d, %s\n%s", code, stdout, stderr)
		}
		code, stdout, stderr = run(t, append([]string{"run", "--format", "csv", "--shard", "params"}, common...)...)
		recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
		if code != 0 || err != nil || len(recs) != 2 {
			t.Fatalf("csv with --shard params: status %d, %v: %s", code, err, stderr)
		}
		row := map[string]string{}
		for i, k := range recs[0] {
			row[k] = recs[1][i]
		}
		if row["shard"] != "params" || row["gather_ms_median"] == "" || row["gather_ms_median"] == "0" {
			t.Errorf("csv with --shard params: %v", row)
		}
	})
	t.Run("table", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		host, _ := os.Hostname()
		if !strings.Contains(stdout, fmt.Sprintf("\nrank       pid  host\n   0  %8d  %s\n   1  %8d  %s\n", os.Getpid(), host, os.Getpid(), host)) {
			t.Errorf("no rank table naming this process for both ranks:\n%s", stdout)
		}
	})
	t.Run("powersgd", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--format", "json", "--compression", "powersgd", "--powersgd-rank", "2",
			"--powersgd-warm-start=false", "--powersgd-seed", "3"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		var j runJSON
		if err := json.Unmarshal([]byte(stdout), &j); err != nil {
			t.Fatal(err)
		}
		// The check of every step's average passed (a gradient is its
		// two ends, a matrix of rank two), and only the Ps, Qs and
		// vectors went on the wire.
		if j.Compression != "powersgd" || j.BytesPerStep <= 0 || 10*j.BytesPerStep > j.GradBytes {
			t.Errorf("powersgd: compression %q, %d bytes per step of %d", j.Compression, j.BytesPerStep, j.GradBytes)
		}
		// At rank 1 the check reads back the vectors only.
		if code, _, stderr := run(t, append([]string{"run", "--compression", "powersgd", "--powersgd-rank", "1"}, common...)...); code != 0 {
			t.Errorf("rank 1: status %d: %s", code, stderr)
		}
		code, stdout, stderr = run(t, append([]string{"run", "--compression", "powersgd", "--powersgd-rank", "2"}, common...)...)
		if code != 0 || !strings.Contains(stdout, "compression powersgd (rank 2, from step 0, min rate 2, error feedback true, warm start true)") {
			t.Errorf("status %d, table does not name PowerSGD's options:\n%s%s", code, stdout, stderr)
		}
	})
	t.Run("table", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--compute", "sleep", "--compute-time", "2ms"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		for _, w := range []string{"tiny: 4 tensors, 303,112 parameters", "step time (ms)", "overlap ratio", "busbw (GB/s)",
			"backward: simulated by sleeping", "2.00 ms per step", "from the --compute-time", "overlap saves", "buckets", "allocations per step"} {
			if !strings.Contains(stdout, w) {
				t.Errorf("table lacks %q:\n%s", w, stdout)
			}
		}
		// Rows that carry no information are not printed: Begin is
		// O(1), and there are no overflows without compression.
		for _, w := range []string{"with Begin", "overflows", "INTERRUPTED", "sample"} {
			if strings.Contains(stdout, w) {
				t.Errorf("table has %q:\n%s", w, stdout)
			}
		}
	})
	t.Run("table defaults and compression", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--compression", "bf16"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		for _, w := range []string{"from the default --compute-time 20ms", "20.00 ms per step", "bf16 overflows"} {
			if !strings.Contains(stdout, w) {
				t.Errorf("table lacks %q:\n%s", w, stdout)
			}
		}
		// Compression in shared memory saves nothing: run says so.
		if !strings.Contains(stderr, "note: --compression bf16 with --backend inproc: the ranks share memory") {
			t.Errorf("stderr %q: no note on compression in shared memory", stderr)
		}
	})
	t.Run("table compute none", func(t *testing.T) {
		code, stdout, stderr := run(t, append([]string{"run", "--compute", "none"}, common...)...)
		if code != 0 || stderr != "" {
			t.Fatalf("status %d: %s", code, stderr)
		}
		if !strings.Contains(stdout, "nothing can overlap") || strings.Contains(stdout, "overlap saves") {
			t.Errorf("compute none does not say why overlap cannot show:\n%s", stdout)
		}
	})
	t.Run("trace", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "trace.json")
		code, _, stderr := run(t, append([]string{"run", "--trace", path, "--trace-steps", "2"}, common...)...)
		if code != 0 {
			t.Fatalf("status %d: %s", code, stderr)
		}
		checkTrace(t, path, 2, 2)
	})
}

func TestSweepOutputs(t *testing.T) {
	model := writeFile(t, "tiny.json", tinyModel)
	plot := filepath.Join(t.TempDir(), "sweep.svg")
	code, stdout, stderr := run(t, "sweep", "--model", model, "--steps", "2", "--warmup", "1", "--caps", "0.25,0.5,2", "--plot", plot)
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "best bucket cap: ") || strings.Count(stdout, "\n") < 7 {
		t.Errorf("sweep table:\n%s", stdout)
	}
	if !strings.Contains(stdout, "\n     0.25 ") {
		t.Errorf("sweep table lacks the 0.25 MiB row:\n%s", stdout)
	}
	svg, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	checkXML(t, svg)
	code, stdout, stderr = run(t, "sweep", "--model", model, "--steps", "2", "--warmup", "0", "--caps", "0.25,2", "--format", "json")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var j sweepJSON
	if err := json.Unmarshal([]byte(stdout), &j); err != nil || len(j.Runs) != 2 || (j.BestBucketCap != 0.25 && j.BestBucketCap != 2) {
		t.Errorf("sweep json %+v, %v", j, err)
	}
}

func TestInfo(t *testing.T) {
	code, stdout, stderr := run(t, "info")
	if code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	for _, w := range []string{"Go:", "GOMAXPROCS", "fp16 kernels:", "inproc   built", "mpi      not built", "nccl     built", "usable", "GPUs:"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("info lacks %q:\n%s", w, stdout)
		}
	}
	var b bytes.Buffer
	writeInfo(&b, "table", collectInfo(gpuInfo{Err: "no NVIDIA driver found (libnvidia-ml.so.1 not loadable: x)"}))
	if !strings.Contains(b.String(), "GPUs:         no NVIDIA driver found (libnvidia-ml.so.1 not loadable: x)") {
		t.Errorf("info without a driver:\n%s", b.String())
	}
	b.Reset()
	writeInfo(&b, "table", collectInfo(gpuInfo{Driver: "550.90.07", Devices: []string{"0: NVIDIA H100 80GB HBM3, 81559 MiB"}}))
	if !strings.Contains(b.String(), "GPUs:         1 (NVIDIA driver 550.90.07)\n  0: NVIDIA H100") {
		t.Errorf("info with a driver:\n%s", b.String())
	}

	code, stdout, stderr = run(t, "info", "--format", "json")
	var j infoData
	if err := json.Unmarshal([]byte(stdout), &j); code != 0 || err != nil {
		t.Fatalf("info json: status %d, %v, stderr %q", code, err, stderr)
	}
	if j.GoVersion == "" || len(j.Backends) != len(backends) || !j.Backends[0].Built || j.Backends[1].Built || j.GPUs.Devices == nil {
		t.Errorf("info json: %+v", j)
	}
	code, stdout, _ = run(t, "info", "--format", "csv")
	recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if code != 0 || err != nil || len(recs) < 10 || recs[0][0] != "key" || recs[1][0] != "go_version" {
		t.Errorf("info csv: status %d, %v, %q", code, err, recs)
	}
	for _, args := range [][]string{{"info", "extra"}, {"info", "--format", "xml"}, {"info", "--bogus"}} {
		if code, stdout, stderr := run(t, args...); code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: status %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

func TestProbeGPUs(t *testing.T) {
	g := probeGPUs()
	if g.Err == "" && g.Driver == "" {
		t.Errorf("probeGPUs: neither an error nor a driver: %+v", g)
	}
	if g.Err != "" && !strings.HasPrefix(g.Err, "no NVIDIA driver found") && !strings.Contains(g.Err, "nvmlDeviceGetCount") {
		t.Errorf("probeGPUs error %q", g.Err)
	}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"8", "4K", "256M", "1G", "4KiB", "-1", "K", "99999999999999999999G"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseSize("-b", s)
		if err != nil {
			if v != 0 {
				t.Fatalf("parseSize(%q) = %d with error %v", s, v, err)
			}
			return
		}
		if v <= 0 || v > 1<<50 {
			t.Fatalf("parseSize(%q) = %d, outside (0, 2^50]", s, v)
		}
		// A size printed back in bytes parses to itself.
		if w, err := parseSize("-b", fmt.Sprint(v)); err != nil || w != v {
			t.Fatalf("round trip of %d: %d, %v", v, w, err)
		}
	})
}

// TestMemoryCheck checks that a run or sweep that would need more memory
// than the machine has fails at once, naming the flags, instead of
// meeting the OOM killer.
func TestMemoryCheck(t *testing.T) {
	defer func(f func() (int64, bool)) { availableMemory = f }(availableMemory)
	availableMemory = func() (int64, bool) { return 1 << 30, true }
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--ranks", "16"}, []string{"--ranks 16 with --model resnet50", "97.49 MiB", "1.52 GiB", "more than the 1.00 GiB available"}},
		{[]string{"run", "--ranks", "8", "--compression", "fp16", "--grad-as-bucket-view=false"}, []string{"--ranks 8", "1.90 GiB"}},
		{[]string{"sweep", "--ranks", "16"}, []string{"--ranks 16"}},
		{[]string{"collective", "-e", "256M", "--ranks", "4"}, []string{"-e/--maxbytes 268435456 with --ranks 4", "2.00 GiB"}},
	}
	for _, tt := range tests {
		code, stdout, stderr := run(t, tt.args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q: want 2, nothing, one line", tt.args, code, stdout, stderr)
		}
		for _, w := range tt.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr %q does not contain %q", tt.args, stderr, w)
			}
		}
	}
	if got := runMemory(100, 3, true, "none", false); got != 300 {
		t.Errorf("runMemory = %d, want 300", got)
	}
	if got := runMemory(100, 3, true, "powersgd", true); got != 675 {
		t.Errorf("runMemory with PowerSGD's errors = %d, want 675", got)
	}
	if avail, ok := memAvailable(); ok && avail <= 0 {
		t.Errorf("memAvailable = %d, true", avail)
	}
}

// TestProgressAbove checks that output printed above a drawn bar comes
// after the bar is erased, and that nothing is erased when no bar is
// drawn.
func TestProgressAbove(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, label: "x", total: 3}
	p.draw()
	p.above(func() { b.WriteString("row\n") })
	p.above(func() { b.WriteString("row2\n") })
	want := "\r" + renderBar("x", 0, 3, 0, 30)
	if got := b.String(); !strings.HasPrefix(got, "\rx [") || !strings.HasSuffix(got, "\r\033[Krow\nrow2\n") || strings.Count(got, "\033[K") != 1 {
		t.Errorf("output %q; want the bar (%q), one erase, then the rows", got, want)
	}
}

// TestProgressDrawAllocs checks that redrawing the bar allocates nothing:
// it runs during the measured steps, whose allocations are reported.
func TestProgressDrawAllocs(t *testing.T) {
	p := &progress{w: io.Discard, label: "run", total: 1000, start: time.Now()}
	p.draw()
	if a := testing.AllocsPerRun(100, func() { p.add(1); p.draw() }); a != 0 {
		t.Errorf("draw allocates %v times, want 0", a)
	}
}

// TestTimeoutNamed checks that a collective cut short by --timeout says
// so, on a backend whose all-reduce always misses its deadline.
func TestTimeoutNamed(t *testing.T) {
	saved := backends
	defer func() { backends = saved }()
	backends = append([]backend{{Backend: launch.Backend{Name: "late"}, open: func(n int) ([]comm.Communicator, error) {
		g, err := launch.Open(context.Background(), "inproc", launch.Options{Ranks: n})
		for i := range g {
			g[i] = lateComm{g[i]}
		}
		return g, err
	}}}, saved...)
	code, _, stderr := run(t, "collective", "--backend", "late", "--timeout", "3s", "-b", "4K", "-e", "4K")
	if code != 1 || !strings.HasPrefix(stderr, "ddpbench: --timeout 3s exceeded: ") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("status %d, stderr %q", code, stderr)
	}
	if err := timeoutHint(fmt.Errorf("x: %w", comm.ErrTimeout), time.Second); !strings.HasPrefix(err.Error(), "--timeout 1s exceeded: x: ") {
		t.Errorf("timeoutHint(ErrTimeout) = %v", err)
	}
	if err := timeoutHint(errors.New("other"), time.Second); err.Error() != "other" {
		t.Errorf("timeoutHint changed an unrelated error: %v", err)
	}
}

// lateComm is a communicator whose all-reduce never completes in time.
type lateComm struct{ comm.Communicator }

func (c lateComm) AllReduce(_, _ comm.Buffer, _ comm.Op) comm.Work {
	return comm.NewWork(late{}, 0)
}

type late struct{}

func (late) WaitOp(context.Context, uint64) error {
	return fmt.Errorf("waiting: %w", context.DeadlineExceeded)
}
func (late) TestOp(uint64) (bool, error) { return true, context.DeadlineExceeded }

// TestInterrupted checks that a cancelled run stops with status 130 and
// one line, from the parse of its flags to its collectives.
func TestInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"collective", "-b", "4K", "-e", "4K"}, "ddpbench: interrupted: 0 of 1 sizes measured\n"},
		{[]string{"run", "--steps", "1", "--warmup", "0", "--model", writeFile(t, "m.json", `{"model":"m","params":[{"name":"w","shape":[4]}]}`)},
			"ddpbench: interrupted before the first of 1 measured steps completed: nothing to report\n"},
	} {
		var o, e bytes.Buffer
		code := runMainContext(ctx, append([]string{"ddpbench"}, tt.args...), &o, &e)
		if code != 130 || e.String() != tt.want {
			t.Errorf("%v: status %d, stderr %q, want 130 and %q", tt.args, code, e.String(), tt.want)
		}
	}
}

// interruptAt makes the next command interrupt itself once the progress
// labelled label reaches done, as Ctrl-C would, and returns the context to
// run it under.
func interruptAt(t *testing.T, label string, done int64) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	onProgress = func(l string, d int64) {
		if l == label && d == done {
			cancel()
		}
	}
	t.Cleanup(func() { onProgress = nil; cancel() })
	return ctx
}

// TestInterruptedKeepsResults checks that Ctrl-C in the middle of a run,
// a sweep or a collective sweep prints what was measured, marked
// interrupted, writes the trace and plot collected so far, and exits 130.
func TestInterruptedKeepsResults(t *testing.T) {
	model := writeFile(t, "tiny.json", tinyModel)
	dir := t.TempDir()
	t.Run("run", func(t *testing.T) {
		tr := filepath.Join(dir, "t.json")
		// Rank 0's progress counts warmup and measured steps: 2 + 3.
		ctx := interruptAt(t, "run", 5)
		var o, e bytes.Buffer
		code := runMainContext(ctx, []string{"ddpbench", "run", "--model", model, "--steps", "1000", "--warmup", "2",
			"--compute", "none", "--trace", tr, "--trace-steps", "2"}, &o, &e)
		out, errs := o.String(), e.String()
		if code != 130 || !strings.HasPrefix(out, "INTERRUPTED after ") || !strings.Contains(out, " of 1000 measured steps") ||
			!strings.Contains(out, "step time (ms)") {
			t.Errorf("status %d, stdout:\n%s", code, out)
		}
		if !strings.HasPrefix(errs, "ddpbench: interrupted: the results above cover the ") || !strings.HasSuffix(errs, tr+" holds 2 of them\n") {
			t.Errorf("stderr %q", errs)
		}
		checkTrace(t, tr, 2, 2)
	})
	t.Run("run json", func(t *testing.T) {
		ctx := interruptAt(t, "run", 4)
		var o, e bytes.Buffer
		code := runMainContext(ctx, []string{"ddpbench", "run", "--model", model, "--steps", "1000", "--warmup", "0",
			"--compute", "none", "--format", "json"}, &o, &e)
		var j runJSON
		if err := json.Unmarshal(o.Bytes(), &j); code != 130 || err != nil || !j.Interrupted || j.StepsRequested != 1000 || j.Steps < 3 || j.Steps > 5 {
			t.Errorf("status %d, %v, json %+v", code, err, j)
		}
	})
	t.Run("sweep", func(t *testing.T) {
		plot := filepath.Join(dir, "p.svg")
		// The second cap's third step: one cap in full, one in part.
		ctx := interruptAt(t, "sweep", 5+3)
		var o, e bytes.Buffer
		code := runMainContext(ctx, []string{"ddpbench", "sweep", "--model", model, "--steps", "4", "--warmup", "1",
			"--compute", "none", "--caps", "0.25,0.5,2", "--plot", plot}, &o, &e)
		out := o.String()
		if code != 130 || !strings.Contains(out, "INTERRUPTED: the last row (0.5 MiB) covers ") || !strings.Contains(out, "best bucket cap: 0.25 MiB") {
			t.Errorf("status %d, stdout:\n%s", code, out)
		}
		if e.String() == "" || !strings.HasPrefix(e.String(), "ddpbench: interrupted: 1 of 3 bucket caps measured in full; 0.5 MiB over ") {
			t.Errorf("stderr %q", e.String())
		}
		svg, err := os.ReadFile(plot)
		if err != nil {
			t.Fatal(err)
		}
		checkXML(t, svg)
		if !strings.Contains(string(svg), "interrupted") || strings.Count(string(svg), "<circle") != 2 {
			t.Errorf("plot of an interrupted sweep: want 2 points and the mark")
		}
	})
	t.Run("collective", func(t *testing.T) {
		ctx := interruptAt(t, "collective", 2)
		var o, e bytes.Buffer
		code := runMainContext(ctx, []string{"ddpbench", "collective", "-b", "1K", "-e", "64K", "-n", "1", "-w", "0"}, &o, &e)
		if code != 130 || !strings.Contains(o.String(), "# INTERRUPTED after 2 of 4 sizes") || !strings.Contains(o.String(), "# Out of bounds values : 0 OK") {
			t.Errorf("status %d, stdout:\n%s", code, o.String())
		}
		if e.String() != "ddpbench: interrupted: 2 of 4 sizes measured\n" {
			t.Errorf("stderr %q", e.String())
		}
	})
}

// TestInterruptSpin checks that Ctrl-C ends a spinning backward at once,
// not when its hour-long step would end.
func TestInterruptSpin(t *testing.T) {
	model := writeFile(t, "tiny.json", tinyModel)
	// Ctrl-C as the spinning backward starts.
	ctx, cancel := context.WithCancel(context.Background())
	onBackward = cancel
	t.Cleanup(func() { onBackward = nil; cancel() })
	var o, e bytes.Buffer
	code := runMainContext(ctx, []string{"ddpbench", "run", "--model", model, "--compute", "spin", "--compute-time", "1h",
		"--steps", "1", "--warmup", "0"}, &o, &e)
	if code != 130 || !strings.HasSuffix(e.String(), "ddpbench: interrupted before the first of 1 measured steps completed: nothing to report\n") {
		t.Errorf("status %d, stderr %q", code, e.String())
	}
}

// TestLongRunMemory checks that memory does not grow with --steps: a run
// asked for a billion steps (56 GB of per-step records, once) and
// interrupted after a few allocates what a short run does.
func TestLongRunMemory(t *testing.T) {
	model := writeFile(t, "tiny.json", tinyModel)
	var m0, m1 runtime.MemStats
	ctx := interruptAt(t, "run", 50)
	runtime.GC()
	runtime.ReadMemStats(&m0)
	var o, e bytes.Buffer
	code := runMainContext(ctx, []string{"ddpbench", "run", "--model", model, "--steps", "1000000000", "--warmup", "0",
		"--compute", "none"}, &o, &e)
	runtime.ReadMemStats(&m1)
	if code != 130 || !strings.Contains(o.String(), " of 1000000000 measured steps") {
		t.Fatalf("status %d, stdout %q, stderr %q", code, o.String(), e.String())
	}
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 16<<20 {
		t.Errorf("a run of 10^9 steps allocated %d bytes in its first 50: want a fixed few MiB", got)
	}
}

// TestExitRule checks that --help states the exit status rule and that
// each class of failure gets its status.
func TestExitRule(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"sweep", "--help"}, {"collective", "--help"}} {
		code, stdout, _ := run(t, args...)
		if code != 0 || !strings.Contains(stdout, "Exit status: 0 the benchmark ran") || !strings.Contains(stdout, "130 interrupted") {
			t.Errorf("%v: status %d, help lacks the exit rule:\n%s", args, code, stdout)
		}
	}
	code, stdout, _ := run(t, "sweep", "--help")
	if code != 0 || strings.Contains(stdout, "--bucket-cap-mb") {
		t.Errorf("sweep --help lists --bucket-cap-mb, which sweep sets itself:\n%s", stdout)
	}
}

// TestSweepNoise checks that sweep names the caps whose p10-p90 range
// overlaps the best one's instead of declaring a winner the data cannot
// separate, and says nothing when the ranges are apart.
func TestSweepNoise(t *testing.T) {
	m, err := models.Load("resnet50")
	if err != nil {
		t.Fatal(err)
	}
	rec := func(capMB, med, p10, p90 float64) runRecord {
		return runRecord{o: runOpts{model: m, modelName: "resnet50", ranks: 2, backend: backends[0], bucketCapMB: capMB, firstMB: 1,
			compression: "none", steps: 20, warmup: 5, compute: bench.ComputeNone},
			res: &bench.Result{Steps: 20, Sampled: 20, StepTime: bench.Dist{Median: med / 1e3, P10: p10 / 1e3, P90: p90 / 1e3}}}
	}
	recs := []runRecord{rec(1, 22, 21, 23), rec(5, 20.5, 20, 21.5), rec(25, 21, 20.8, 22), rec(100, 30, 29, 31)}
	if b := best(recs); b != 1 {
		t.Fatalf("best %d, want 1 (5 MiB)", b)
	}
	if got := withinNoise(recs, 1); !slices.Equal(got, []float64{1, 25}) {
		t.Errorf("within noise of 5 MiB: %v, want [1 25]", got)
	}
	var b bytes.Buffer
	if err := writeSweepTable(&b, recs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "best bucket cap: 5 MiB (median step 20.50 ms, p10-p90 20.00-21.50)\n  within noise of it: 1, 25 MiB") {
		t.Errorf("table:\n%s", b.String())
	}
	b.Reset()
	if err := writeSweep(&b, "json", recs); err != nil {
		t.Fatal(err)
	}
	var j sweepJSON
	if err := json.Unmarshal(b.Bytes(), &j); err != nil || j.BestBucketCap != 5 || !slices.Equal(j.WithinNoise, []float64{1, 25}) {
		t.Errorf("json %+v, %v", j, err)
	}
	apart := []runRecord{rec(1, 30, 29, 31), rec(5, 20, 19, 21)}
	b.Reset()
	writeSweepTable(&b, apart)
	if strings.Contains(b.String(), "within noise") {
		t.Errorf("ranges apart, yet:\n%s", b.String())
	}
}

func TestAllInterfaces(t *testing.T) {
	for addr, want := range map[string]bool{":9100": true, "0.0.0.0:9100": true, "[::]:9100": true,
		"127.0.0.1:9100": false, "localhost:9100": false, "[::1]:9100": false, "10.1.2.3:9100": false, "bad": false} {
		if got := allInterfaces(addr); got != want {
			t.Errorf("allInterfaces(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestWarmupVariables checks that run's warmup (steps) and collective's
// (iterations) are different flags with different variables.
func TestWarmupVariables(t *testing.T) {
	t.Setenv("DDPBENCH_WARMUP_ITERS", "-1")
	code, _, stderr := run(t, "collective", "-b", "1K", "-e", "1K")
	if code != 2 || stderr != "ddpbench: -w/--warmup-iters -1: want >= 0 (from DDPBENCH_WARMUP_ITERS)\n" {
		t.Errorf("status %d, stderr %q", code, stderr)
	}
	t.Setenv("DDPBENCH_WARMUP_ITERS", "")
	os.Unsetenv("DDPBENCH_WARMUP_ITERS")
	t.Setenv("DDPBENCH_WARMUP", "-1")
	if code, _, stderr := run(t, "collective", "-b", "1K", "-e", "1K", "-n", "1", "--format", "csv"); code != 0 {
		t.Errorf("DDPBENCH_WARMUP, run's variable, stopped collective: status %d, %q", code, stderr)
	}
	if code, _, stderr := run(t, "run"); code != 2 || !strings.Contains(stderr, "--warmup -1") {
		t.Errorf("run with DDPBENCH_WARMUP=-1: status %d, %q", code, stderr)
	}
}

// TestStallReported: a step whose all-reduce never completes is reported
// as a stall on standard error every --stall-interval, by every rank,
// until --timeout fails the run.
func TestStallReported(t *testing.T) {
	saved := backends
	defer func() { backends = saved }()
	backends = append([]backend{{Backend: launch.Backend{Name: "stuck"}, open: func(n int) ([]comm.Communicator, error) {
		g, err := launch.Open(context.Background(), "inproc", launch.Options{Ranks: n})
		for i := range g {
			g[i] = commtest.Stuck(g[i])
		}
		return g, err
	}}}, saved...)
	model := writeFile(t, "tiny.json", `{"model":"tiny","params":[{"name":"w","shape":[64]},{"name":"b","shape":[8]}]}`)
	code, _, stderr := run(t, "run", "--backend", "stuck", "--model", model, "--steps", "1", "--warmup", "0",
		"--compute", "none", "--timeout", "1500ms", "--stall-interval", "300ms")
	if code != 1 || !strings.Contains(stderr, "--timeout 1.5s exceeded") {
		t.Errorf("status %d; want 1 and the timeout named; stderr:\n%s", code, stderr)
	}
	for rank := range 2 {
		if n := strings.Count(stderr, fmt.Sprintf("ddpbench: stall: comm: rank %d has waited", rank)); n < 2 {
			t.Errorf("rank %d reported %d stalls in 1.5 s at a 300 ms interval; stderr:\n%s", rank, n, stderr)
		}
	}
}

// TestVersion checks --version: the version the go command recorded and
// the toolchain, no number of ddpbench's own.
func TestVersion(t *testing.T) {
	for _, flag := range []string{"--version", "-v"} {
		code, stdout, stderr := run(t, flag)
		if code != 0 || !strings.HasPrefix(stdout, "ddpbench version ") || !strings.Contains(stdout, runtime.Version()) || stderr != "" {
			t.Errorf("%s: status %d, stdout %q, stderr %q; want the version and %s", flag, code, stdout, stderr, runtime.Version())
		}
	}
}

// TestRootHelp checks that the root's --help lists no flag under GLOBAL
// OPTIONS but --help and --version: a flag written before a command
// belongs to run, the command ddpbench runs without one.
func TestRootHelp(t *testing.T) {
	code, stdout, _ := run(t, "--help")
	_, global, ok := strings.Cut(stdout, "GLOBAL OPTIONS:")
	if code != 0 || !ok {
		t.Fatalf("status %d, no GLOBAL OPTIONS:\n%s", code, stdout)
	}
	var flags []string
	for _, line := range strings.Split(global, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "--") {
			flags = append(flags, strings.TrimSuffix(f[0], ","))
		}
	}
	if !slices.Equal(flags, []string{"--help", "--version"}) {
		t.Errorf("global options %q, want [--help --version]:\n%s", flags, stdout)
	}
	// Run's flags still work without the command.
	model := writeFile(t, "tiny.json", tinyModel)
	code, stdout, stderr := run(t, "--ranks", "3", "--model", model, "--steps", "1", "--warmup", "0", "--compute", "none", "--format", "json")
	var j runJSON
	if err := json.Unmarshal([]byte(stdout), &j); code != 0 || err != nil || j.Ranks != 3 {
		t.Errorf("ddpbench --ranks 3: status %d, ranks %d, %v, stderr %q", code, j.Ranks, err, stderr)
	}
}

// TestInProcessUnderLauncher checks that a launcher's job of several
// processes with the in-process backend is refused on every rank, naming
// the launcher and the backend to use; Slurm's variables alone, which a
// batch script sees, are not.
func TestInProcessUnderLauncher(t *testing.T) {
	for _, env := range [][]string{
		{"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2"},
		{"PMI_RANK", "0", "PMI_SIZE", "3"},
		{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "29500"},
	} {
		t.Run(env[0], func(t *testing.T) {
			model := writeFile(t, "tiny.json", tinyModel)
			for i := 0; i < len(env); i += 2 {
				t.Setenv(env[i], env[i+1])
			}
			for _, args := range [][]string{{"collective", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"},
				{"run", "--model", model, "--steps", "1", "--warmup", "0", "--compute", "none"},
				{"sweep", "--backend", "inproc", "--model", model, "--caps", "1", "--steps", "1", "--warmup", "0", "--compute", "none"}} {
				code, stdout, stderr := run(t, args...)
				if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 ||
					!strings.Contains(stderr, "--backend inproc runs every rank in this process, but ") ||
					!strings.Contains(stderr, "each would run a job of its own; use --backend mpi") {
					t.Errorf("%v: status %d, stdout %q, stderr %q; want 2 and the reason", args, code, stdout, stderr)
				}
			}
		})
	}
	t.Run("slurm", func(t *testing.T) {
		t.Setenv("SLURM_PROCID", "0")
		t.Setenv("SLURM_NTASKS", "4")
		code, _, stderr := run(t, "collective", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")
		if code != 0 {
			t.Errorf("inside a Slurm allocation: status %d, stderr %q; want the run", code, stderr)
		}
	})
}
