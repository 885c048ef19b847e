package main

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// writeCSV writes one CSV record.
func writeCSV(w io.Writer, rec []string) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(rec); err != nil {
		return err
	}
	cw.Flush()
	return cw.Error()
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// fmtFloat formats a float for CSV: the shortest exact decimal, at most
// 6 significant digits.
func fmtFloat(v float64) string {
	return strconv.FormatFloat(roundTo(v, 6), 'g', -1, 64)
}

// checkOutputPath reports, before a run starts, whether a file could be
// written at path for flag: a missing or read-only directory or a path
// that is a directory is a usage error now, not after minutes of
// benchmarking. It leaves nothing behind.
func checkOutputPath(flag, path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return usagef("%s %q: is a directory", flag, path)
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	if err != nil {
		return usagef("%s %q: directory %q: %v", flag, path, dir, unwrapPathError(err))
	}
	if !fi.IsDir() {
		return usagef("%s %q: %q is not a directory", flag, path, dir)
	}
	f, err := os.CreateTemp(dir, ".ddpbench-*")
	if err != nil {
		return usagef("%s %q: cannot create files in %q: %v", flag, path, dir, unwrapPathError(err))
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return nil
}

// unwrapPathError drops the operation and path that the message already
// names.
func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
