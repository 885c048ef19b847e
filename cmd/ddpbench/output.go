package main

import (
	"encoding/csv"
	"encoding/json"
	"io"
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
