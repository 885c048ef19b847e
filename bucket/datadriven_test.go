package bucket

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

var update = flag.Bool("update", false, "rewrite testdata files with the actual output")

// ddCase is one command of a data-driven test file:
//
//	# comments and blank lines between cases are kept
//	command key=value key=value
//	input line
//	----
//	expected output (no blank lines)
//
// The case ends at the first blank line after "----".
type ddCase struct {
	pos   string // file:line of the command
	cmd   string
	args  map[string]string
	input []string
}

// runDataDriven runs every case of the file through run and compares its
// output with the expected block; with -update it rewrites the file.
func runDataDriven(t *testing.T, path string, run func(d *ddCase) string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out bytes.Buffer
	for i := 0; i < len(lines); {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			i++
			continue
		}
		d := &ddCase{pos: fmt.Sprintf("%s:%d", path, i+1), args: map[string]string{}}
		fields := strings.Fields(line)
		d.cmd = fields[0]
		for _, f := range fields[1:] {
			k, v, _ := strings.Cut(f, "=")
			d.args[k] = v
		}
		out.WriteString(line + "\n")
		i++
		for ; i < len(lines) && lines[i] != "----"; i++ {
			d.input = append(d.input, lines[i])
			out.WriteString(lines[i] + "\n")
		}
		if i == len(lines) {
			t.Fatalf("%s: missing ----", d.pos)
		}
		out.WriteString("----\n")
		i++
		var want []string
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			want = append(want, lines[i])
		}
		got := strings.TrimRight(run(d), "\n")
		out.WriteString(got + "\n")
		if !*update && got != strings.Join(want, "\n") {
			t.Errorf("%s: %s\n got:\n%s\nwant:\n%s", d.pos, line, got, strings.Join(want, "\n"))
		}
	}
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no data-driven files: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			runDataDriven(t, path, func(d *ddCase) string { return runCommand(t, d) })
		})
	}
}

func runCommand(t *testing.T, d *ddCase) string {
	tensors, err := parseTensors(d.input)
	if err != nil {
		t.Fatalf("%s: %v", d.pos, err)
	}
	switch d.cmd {
	case "assign", "encode":
		bs, err := Assign(tensors, ints(t, d, "limits"), ints(t, d, "order"))
		if err != nil {
			return "error: " + err.Error()
		}
		if d.cmd == "assign" {
			return formatLayout(bs)
		}
		enc := Encode(bs)
		back, err := Decode(tensors, enc)
		if err != nil {
			t.Errorf("%s: Decode(Encode(x)): %v", d.pos, err)
		} else if formatLayout(back) != formatLayout(bs) {
			t.Errorf("%s: Decode(Encode(x)) = \n%s\nwant\n%s", d.pos, formatLayout(back), formatLayout(bs))
		}
		return fmt.Sprint(enc)
	case "rebuild":
		bs, err := Rebuild(tensors, ints(t, d, "ready"), ints(t, d, "first")[0], ints(t, d, "cap")[0])
		if err != nil {
			return "error: " + err.Error()
		}
		return formatLayout(bs)
	case "decode":
		var enc []int64
		for _, v := range ints(t, d, "enc") {
			enc = append(enc, int64(v))
		}
		bs, err := Decode(tensors, enc)
		if err != nil {
			return "error: " + err.Error()
		}
		return formatLayout(bs)
	}
	t.Fatalf("%s: unknown command %q", d.pos, d.cmd)
	return ""
}

// parseTensors reads lines "DTYPE NUMEL [dev=N] [xCOUNT]"; the dtype is any
// name comm.ParseDType accepts, or "bad" for an invalid one.
func parseTensors(lines []string) ([]Tensor, error) {
	var ts []Tensor
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 {
			return nil, fmt.Errorf("tensor line %q: want DTYPE NUMEL [dev=N] [xCOUNT]", l)
		}
		var tn Tensor
		if f[0] != "bad" {
			dt, err := parseDType(f[0])
			if err != nil {
				return nil, err
			}
			tn.DType = dt
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, fmt.Errorf("tensor line %q: %v", l, err)
		}
		tn.Numel = n
		count := 1
		for _, opt := range f[2:] {
			switch {
			case strings.HasPrefix(opt, "dev="):
				tn.Device, err = strconv.Atoi(opt[4:])
			case strings.HasPrefix(opt, "x"):
				count, err = strconv.Atoi(opt[1:])
			default:
				err = fmt.Errorf("unknown option %q", opt)
			}
			if err != nil {
				return nil, fmt.Errorf("tensor line %q: %v", l, err)
			}
		}
		for range count {
			ts = append(ts, tn)
		}
	}
	return ts, nil
}

// ints parses a comma-separated argument; a missing argument is nil.
func ints(t *testing.T, d *ddCase, key string) []int {
	s, ok := d.args[key]
	if !ok {
		return nil
	}
	var out []int
	if s == "" {
		return []int{}
	}
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("%s: %s: %v", d.pos, key, err)
		}
		out = append(out, v)
	}
	return out
}

// formatLayout prints one line per bucket.
func formatLayout(bs []Bucket) string {
	var b strings.Builder
	w := bufio.NewWriter(&b)
	for k, bk := range bs {
		fmt.Fprintf(w, "%d: %s dev=%d limit=%d bytes=%d tensors=%v offsets=%v\n",
			k, bk.DType, bk.Device, bk.Limit, bk.Bytes, bk.Tensors, bk.Offsets)
	}
	w.Flush()
	return b.String()
}

func parseDType(s string) (dt comm.DType, err error) { return comm.ParseDType(s) }
