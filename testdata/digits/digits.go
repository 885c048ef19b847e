// Package digits embeds the digits data set of this directory (see its
// README.md), so that the examples of both modules train on one copy.
package digits

import _ "embed"

// CSVGz is digits.csv.gz: gzipped CSV rows of 64 pixels in 0..16 and a
// label in 0..9. It must not be modified.
//
//go:embed digits.csv.gz
var CSVGz []byte
