package models

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBuiltinTotals(t *testing.T) {
	tests := []struct {
		name    string
		tensors int
		numel   int64
		first   string
		last    string
	}{
		{"resnet50", 161, 25_557_032, "conv1.weight", "fc.bias"},
		{"bert-base", 199, 109_482_240, "embeddings.word_embeddings.weight", ""},
		{"gpt2-small", 148, 124_439_808, "wte.weight", "ln_f.bias"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Builtin(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Params) != tt.tensors || m.Numel() != tt.numel {
				t.Errorf("%s: %d tensors, %d parameters; want %d, %d", tt.name, len(m.Params), m.Numel(), tt.tensors, tt.numel)
			}
			if m.Source == "" {
				t.Errorf("%s: empty source", tt.name)
			}
			if m.Params[0].Name != tt.first {
				t.Errorf("first param %q, want %q", m.Params[0].Name, tt.first)
			}
			if tt.last != "" && m.Params[len(m.Params)-1].Name != tt.last {
				t.Errorf("last param %q, want %q", m.Params[len(m.Params)-1].Name, tt.last)
			}
			if m.Bytes() != 4*tt.numel {
				t.Errorf("Bytes %d, want %d", m.Bytes(), 4*tt.numel)
			}
		})
	}
}

func TestGPT2Layout(t *testing.T) {
	m, err := Builtin("gpt2-small")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int{
		"wte.weight":              {50257, 768},
		"wpe.weight":              {1024, 768},
		"h.0.attn.c_attn.weight":  {768, 2304},
		"h.11.mlp.c_proj.weight":  {3072, 768},
		"h.5.mlp.c_fc.bias":       {3072},
		"h.11.ln_2.bias":          {768},
		"ln_f.weight":             {768},
		"h.3.attn.c_proj.weight":  {768, 768},
		"h.7.attn.c_attn.bias":    {2304},
		"h.0.ln_1.weight":         {768},
		"h.10.mlp.c_proj.bias":    {768},
		"h.9.attn.c_proj.bias":    {768},
		"h.2.mlp.c_fc.weight":     {768, 3072},
		"h.4.ln_2.weight":         {768},
		"h.1.ln_1.bias":           {768},
		"h.6.attn.c_attn.weight":  {768, 2304},
		"h.8.mlp.c_fc.bias":       {3072},
		"h.11.attn.c_attn.weight": {768, 2304},
	}
	got := map[string][]int{}
	for _, p := range m.Params {
		got[p.Name] = p.Shape
	}
	for name, shape := range want {
		if g := got[name]; len(g) != len(shape) || (len(g) > 0 && (g[0] != shape[0] || g[len(g)-1] != shape[len(shape)-1])) {
			t.Errorf("%s: shape %v, want %v", name, g, shape)
		}
	}
	if _, tied := got["lm_head.weight"]; tied {
		t.Error("lm_head.weight listed, but it is tied to wte")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "tiny.json")
	if err := os.WriteFile(good, []byte(`{"model":"tiny","params":[{"name":"w","shape":[2,3]},{"name":"b","shape":[3]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if m.Numel() != 9 || m.File != good {
		t.Errorf("Numel %d File %q", m.Numel(), m.File)
	}
	if _, err := Load("RESNET50"); err != nil {
		t.Errorf("built-in names are case-insensitive: %v", err)
	}
	_, err = Load(filepath.Join(dir, "missing.json"))
	if !errors.Is(err, ErrUnknownModel) {
		t.Errorf("missing file: %v, want ErrUnknownModel", err)
	}
	_, err = Builtin("vgg16")
	if !errors.Is(err, ErrUnknownModel) || !strings.Contains(err.Error(), "resnet50") {
		t.Errorf("unknown built-in: %v", err)
	}
}

// TestParseErrors checks that every rejected manifest names the file and
// the field at fault.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, json string
		want       []string // substrings of the error
	}{
		{"empty", ``, []string{"m.json", "empty file"}},
		{"syntax", "{\n \"model\": \"x\",\n \"params\": [}\n", []string{"m.json:3:", "invalid character"}},
		{"truncated", `{"model":"x","params":[`, []string{"m.json", "truncated"}},
		{"shape type", "{\"model\":\"x\",\"params\":[{\"name\":\"w\",\"shape\":[\"a\"]}]}", []string{"m.json:1:", "params.shape", "string"}},
		{"name type", `{"model":"x","params":[{"name":3,"shape":[1]}]}`, []string{"m.json", "params.name", "number"}},
		{"unknown field", `{"model":"x","parms":[]}`, []string{"m.json:1:14:", `unknown field "parms"`}},
		{"unknown nested field", "{\"model\":\"shap\",\n\"params\":[{\"name\":\"shap\",\n  \"shap\" : [1]}]}", []string{"m.json:3:3:", `unknown field "shap"`}},
		{"no model", `{"params":[{"name":"w","shape":[1]}]}`, []string{"m.json", "model: missing"}},
		{"no params", `{"model":"x"}`, []string{"m.json", "params: missing"}},
		{"bad dtype", `{"model":"x","dtype":"int8","params":[{"name":"w","shape":[1]}]}`, []string{"m.json", "dtype", "int8"}},
		{"no name", `{"model":"x","params":[{"shape":[1]}]}`, []string{"m.json", "params[0].name"}},
		{"dup name", `{"model":"x","params":[{"name":"w","shape":[1]},{"name":"w","shape":[2]}]}`, []string{"m.json", "params[1].name", "params[0]"}},
		{"no shape", `{"model":"x","params":[{"name":"w","shape":[1]},{"name":"v"}]}`, []string{"m.json", "params[1].shape", `"v"`}},
		{"zero dim", `{"model":"x","params":[{"name":"w","shape":[4,0]}]}`, []string{"m.json", "params[0].shape[1]", `"w" has a dimension of size 0;`}},
		{"negative dim", `{"model":"x","params":[{"name":"w","shape":[-4]}]}`, []string{"m.json", "params[0].shape[0]", "size -4"}},
		{"huge", `{"model":"x","params":[{"name":"w","shape":[1048576,1048576,2]}]}`, []string{"m.json", "params[0].shape", "2^40"}},
		{"wrapping dims", `{"model":"x","params":[{"name":"w","shape":[1099511627776,1099511627776]}]}`, []string{"m.json:1", "params[0].shape", "2^40"}},
		{"wrapping dims 3", `{"model":"x","params":[{"name":"w","shape":[4294967296,4294967296,4294967296]}]}`, []string{"params[0].shape", "2^40"}},
		{"dim beyond int64", `{"model":"x","params":[{"name":"w","shape":[9223372036854775808]}]}`, []string{"m.json:1:", "params.shape", "number 9223372036854775808"}},
		{"model total", "{\"model\":\"x\",\"params\":[\n{\"name\":\"a\",\"shape\":[1099511627776]},\n  {\"name\":\"b\",\"shape\":[1]}]}",
			[]string{"m.json:3: params[1].shape", `"b"`, "1099511627777 elements", "more than 2^40"}},
		{"line of a param", "{\"model\":\"x\",\n \"params\": [\n  {\"name\":\"w\",\"shape\":[1]},\n\n  {\"name\":\"v\",\"shape\":[2, 0]}\n]}",
			[]string{"m.json:5: params[1].shape[1]", "size 0"}},
		{"line after a skipped key", "{\"source\": \"s\",\n\n\"model\":\"x\",\"params\":\n[{\"name\":\"\",\"shape\":[1]}]}",
			[]string{"m.json:4: params[0].name", "missing"}},
		{"trailing", `{"model":"x","params":[{"name":"w","shape":[1]}]} {}`, []string{"m.json", "trailing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("m.json", []byte(tt.json))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v does not wrap ErrInvalid", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"resnet50.json", "gpt2-small.json"} {
		data, err := builtin.ReadFile("manifests/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"model":"x","params":[{"name":"w","shape":[2,3]}]}`))
	f.Add([]byte(`{"model":"x","params":[{"name":"w","shape":[0]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse("f.json", data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "f.json") {
				t.Fatalf("error %q lacks ErrInvalid or the file name", err)
			}
			return
		}
		if len(m.Params) == 0 || m.Model == "" || m.Numel() <= 0 {
			t.Fatalf("accepted an invalid manifest: %+v", m)
		}
		for _, p := range m.Params {
			if p.Numel() <= 0 {
				t.Fatalf("accepted param %q with shape %v", p.Name, p.Shape)
			}
		}
	})
}

func ExampleBuiltin() {
	m, err := Builtin("resnet50")
	if err != nil {
		panic(err)
	}
	fmt.Println(m.Model, len(m.Params), m.Numel())
	// Output: resnet50 161 25557032
}

// TestLoadRefusesNonManifests: Load refuses what is not a regular file (a
// device it would read forever, a FIFO that would block it) and a file
// over MaxFileSize, at once, naming the path.
func TestLoadRefusesNonManifests(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxFileSize + 1); err != nil { // sparse: no disk
		t.Fatal(err)
	}
	f.Close()
	cases := map[string]string{"large": big}
	if _, err := os.Stat("/dev/zero"); err == nil {
		cases["device"] = "/dev/zero"
	}
	if fifo := filepath.Join(dir, "fifo"); mkfifo(fifo) == nil {
		cases["fifo"] = fifo
	}
	for name, path := range cases {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, err := Load(path); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Load(%s): %v, want ErrInvalid naming it", path, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Load(%s) still reading after 10 s", path)
			}
		})
	}
}
