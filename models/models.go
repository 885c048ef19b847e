package models

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ddpgo/ddpgo/comm"
)

// Sentinel errors, tested with errors.Is.
var (
	// ErrUnknownModel: the name is neither a built-in manifest nor a
	// readable file.
	ErrUnknownModel = errors.New("models: unknown model")
	// ErrInvalid: a manifest does not parse or fails validation. The
	// wrapping error names the file and the field.
	ErrInvalid = errors.New("models: invalid manifest")
)

// Param is one trainable parameter: its name and shape.
type Param struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

// Numel returns the number of elements of p (the product of its shape;
// 1 for a scalar with an empty shape).
func (p Param) Numel() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// Manifest is a model's parameter list in registration order.
type Manifest struct {
	Model  string     `json:"model"`
	Source string     `json:"source"`
	DType  string     `json:"dtype"`
	Order  string     `json:"order,omitempty"`
	Params []Param    `json:"params"`
	Elem   comm.DType `json:"-"` // DType parsed; Float32 when "dtype" is absent
	File   string     `json:"-"` // the file or built-in name it came from
}

// Numel returns the total number of parameter elements.
func (m *Manifest) Numel() int64 {
	var n int64
	for _, p := range m.Params {
		n += int64(p.Numel())
	}
	return n
}

// Bytes returns the total gradient size in bytes.
func (m *Manifest) Bytes() int64 { return m.Numel() * int64(m.Elem.Size()) }

//go:embed manifests/*.json
var builtin embed.FS

// builtinFiles maps each built-in name (and accepted aliases) to its file.
var builtinFiles = map[string]string{
	"resnet50":   "resnet50.json",
	"resnet-50":  "resnet50.json",
	"bert-base":  "bert-base.json",
	"bert_base":  "bert-base.json",
	"gpt2-small": "gpt2-small.json",
	"gpt2":       "gpt2-small.json",
}

// Names returns the canonical names of the built-in manifests.
func Names() []string { return []string{"resnet50", "bert-base", "gpt2-small"} }

// Builtin returns the built-in manifest called name.
func Builtin(name string) (*Manifest, error) {
	f, ok := builtinFiles[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("%w %q (built in: %s)", ErrUnknownModel, name, strings.Join(Names(), ", "))
	}
	data, err := builtin.ReadFile("manifests/" + f)
	if err != nil {
		return nil, err
	}
	return Parse(name, data)
}

// MaxFileSize bounds a manifest file: 64 MiB, room for a million
// parameters with long names.
const MaxFileSize = 64 << 20

// Load returns the built-in manifest called nameOrPath, or else parses
// the file at that path, which must be a regular file of at most
// MaxFileSize bytes: a device such as /dev/zero would be read forever and
// a FIFO would block.
func Load(nameOrPath string) (*Manifest, error) {
	if _, ok := builtinFiles[strings.ToLower(nameOrPath)]; ok {
		return Builtin(nameOrPath)
	}
	data, err := readManifest(nameOrPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w %q: not built in (%s) and no such file",
				ErrUnknownModel, nameOrPath, strings.Join(Names(), ", "))
		}
		return nil, err
	}
	return Parse(nameOrPath, data)
}

// readManifest reads the manifest file at path, refusing what is not a
// regular file (checked before opening it, since opening a FIFO blocks,
// and again on the open file) and more than MaxFileSize bytes.
func readManifest(path string) ([]byte, error) {
	notRegular := func(fi os.FileInfo) error {
		kind := "not a regular file"
		switch m := fi.Mode(); {
		case m.IsDir():
			kind = "a directory"
		case m&os.ModeDevice != 0:
			kind = "a device"
		case m&os.ModeNamedPipe != 0:
			kind = "a named pipe (FIFO)"
		case m&os.ModeSocket != 0:
			kind = "a socket"
		}
		return fmt.Errorf("%w: %s is %s, not a regular file: a manifest is a JSON file", ErrInvalid, path, kind)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(fi)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(fi)
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("%w: %s holds %d bytes, more than a manifest may (%d)", ErrInvalid, path, fi.Size(), MaxFileSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%w: %s holds more than the %d bytes a manifest may", ErrInvalid, path, MaxFileSize)
	}
	return data, nil
}

// Parse decodes and validates a manifest. file names the source in
// errors. Unknown fields are errors, so that a misspelt key is not
// silently ignored.
func Parse(file string, data []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, decodeError(file, data, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: %s: trailing data after the manifest object", ErrInvalid, file)
	}
	m.File = file
	if err := m.validate(data); err != nil {
		return nil, err
	}
	return &m, nil
}

// MaxNumel bounds the elements of one parameter and of a whole manifest:
// 2^40, 4 TiB of float32 gradients per rank, beyond any memory a rank can
// map, and far enough below 2^63 that no sum or byte count of them can
// overflow.
const MaxNumel = 1 << 40

// validate checks m, which was decoded from data; an error about a
// parameter names the line where that parameter starts.
func (m *Manifest) validate(data []byte) error {
	var offsets []int64 // of each params element, computed on the first error
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s: %s", ErrInvalid, m.File, field, fmt.Sprintf(format, args...))
	}
	badParam := func(i int, field, format string, args ...any) error {
		if offsets == nil {
			offsets = paramOffsets(data)
		}
		where := m.File
		if i < len(offsets) {
			line, _ := position(data, offsets[i])
			where = fmt.Sprintf("%s:%d", m.File, line)
		}
		return fmt.Errorf("%w: %s: params[%d]%s: %s", ErrInvalid, where, i, field, fmt.Sprintf(format, args...))
	}
	if m.Model == "" {
		return bad("model", "missing or empty")
	}
	m.Elem = comm.Float32
	if m.DType != "" {
		dt, err := comm.ParseDType(m.DType)
		if err != nil || !dt.IsFloat() {
			return bad("dtype", "%q is not a floating-point type (float32, float16, bfloat16, float64)", m.DType)
		}
		m.Elem = dt
	}
	if len(m.Params) == 0 {
		return bad("params", "missing or empty")
	}
	seen := make(map[string]int, len(m.Params))
	var total int64
	for i, p := range m.Params {
		if p.Name == "" {
			return badParam(i, ".name", "missing or empty")
		}
		if j, dup := seen[p.Name]; dup {
			return badParam(i, ".name", "%q already used by params[%d]", p.Name, j)
		}
		seen[p.Name] = i
		if p.Shape == nil {
			return badParam(i, ".shape", "missing (parameter %q)", p.Name)
		}
		n := int64(1)
		for k, d := range p.Shape {
			if d <= 0 {
				return badParam(i, fmt.Sprintf(".shape[%d]", k), "%q has a dimension of size %d; every size must be at least 1", p.Name, d)
			}
			// Compared by division, so that no product wraps around
			// before it is compared ([2^40, 2^40] would be 0 mod 2^64).
			if int64(d) > MaxNumel/n {
				return badParam(i, ".shape", "%v of %q has more than 2^40 elements", p.Shape, p.Name)
			}
			n *= int64(d)
		}
		if total += n; total > MaxNumel {
			return badParam(i, ".shape", "%v of %q brings the model to %d elements, more than 2^40 (4 TiB of float32 gradients)",
				p.Shape, p.Name, total)
		}
	}
	return nil
}

// paramOffsets returns the byte offset at which each element of the
// top-level "params" array of data starts, or as many as it finds. data
// has already decoded, so it is well-formed JSON.
func paramOffsets(data []byte) []int64 {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var offs []int64
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return offs
		}
		if key != "params" {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return offs
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return offs
		}
		offs = offs[:0] // a repeated key: the last one is the one decoded
		for dec.More() {
			// The element starts after the previous token, a comma and
			// any white space.
			off := dec.InputOffset()
			for off < int64(len(data)) && strings.IndexByte(" \t\r\n,", data[off]) >= 0 {
				off++
			}
			offs = append(offs, off)
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return offs
			}
		}
		if _, err := dec.Token(); err != nil {
			return offs
		}
	}
	return offs
}

// decodeError turns a json error into one that names the file, the field
// (when json knows it) and the line and column.
func decodeError(file string, data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := position(data, syn.Offset)
		return fmt.Errorf("%w: %s:%d:%d: %v", ErrInvalid, file, line, col, syn)
	case errors.As(err, &typ):
		line, col := position(data, typ.Offset)
		field := typ.Field
		if field == "" {
			field = "(top level)"
		}
		return fmt.Errorf("%w: %s:%d:%d: field %s: got JSON %s, want %s", ErrInvalid, file, line, col, field, typ.Value, typ.Type)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%w: %s: empty file", ErrInvalid, file)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: %s: truncated JSON", ErrInvalid, file)
	}
	// Unknown fields come back as `json: unknown field "x"`, without an
	// offset: point at the first key of that name.
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if name, ok := strings.CutPrefix(msg, "unknown field "); ok {
		if off := keyOffset(data, name); off >= 0 {
			line, col := position(data, int64(off))
			return fmt.Errorf("%w: %s:%d:%d: %s", ErrInvalid, file, line, col, msg)
		}
	}
	return fmt.Errorf("%w: %s: %v", ErrInvalid, file, msg)
}

// keyOffset returns the offset of the first object key spelt quoted (a
// JSON string literal, quotes included) in data, or -1.
func keyOffset(data []byte, quoted string) int {
	for from := 0; ; {
		i := bytes.Index(data[from:], []byte(quoted))
		if i < 0 {
			return -1
		}
		i += from
		rest := bytes.TrimLeft(data[i+len(quoted):], " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			return i
		}
		from = i + 1
	}
}

// position converts a byte offset into a 1-based line and column.
func position(data []byte, off int64) (line, col int) {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line = 1 + bytes.Count(before, []byte("\n"))
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}
