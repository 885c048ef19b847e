package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLoadEmbedded(t *testing.T) {
	ds, err := loadDigits("")
	if err != nil {
		t.Fatal(err)
	}
	if ds.len() != 1797 || len(ds.x) != 1797*Pixels {
		t.Fatalf("%d rows, %d pixels; want 1797 rows of %d", ds.len(), len(ds.x), Pixels)
	}
	var counts [Classes]int
	for _, y := range ds.y {
		counts[y]++
	}
	for c, n := range counts {
		if n < 170 || n > 190 {
			t.Errorf("label %d occurs %d times; the set is balanced (174..183)", c, n)
		}
	}
	if lo, hi := slices.Min(ds.x), slices.Max(ds.x); lo != 0 || hi != 1 {
		t.Errorf("pixels span [%v, %v], want [0, 1] after dividing by 16", lo, hi)
	}
}

func TestLoadFile(t *testing.T) {
	const rows = "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,7\n\n"
	dir := t.TempDir()
	plain := filepath.Join(dir, "d.csv")
	if err := os.WriteFile(plain, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	zw.Write([]byte(rows))
	zw.Close()
	zipped := filepath.Join(dir, "d.csv.gz")
	if err := os.WriteFile(zipped, zbuf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{plain, zipped} {
		ds, err := loadDigits(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if ds.len() != 1 || ds.y[0] != 7 || ds.x[16] != 1 || ds.x[8] != 0.5 {
			t.Fatalf("%s: parsed %v / %v", path, ds.y, ds.x[:17])
		}
	}
	if _, err := loadDigits(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	row := func(pixel, label string) string {
		f := make([]string, Pixels+1)
		for i := range f {
			f[i] = "0"
		}
		f[3], f[Pixels] = pixel, label
		return strings.Join(f, ",")
	}
	for _, tc := range []struct {
		name, in, msg string
	}{
		{"empty", "", "no rows"},
		{"short row", "1,2,3", "line 1 has 3 fields, want 65"},
		{"pixel too large", row("0", "1") + "\n" + row("17", "1"), "line 2 field 4: pixel 17 not in 0..16"},
		{"negative pixel", row("-1", "1"), "pixel -1"},
		{"not a number", row("x", "1"), "line 1 field 4"},
		{"label out of range", row("0", "10"), "label 10 not in 0..9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseDigits(strings.NewReader(tc.in))
			if !errors.Is(err, errFormat) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want errFormat mentioning %q", err, tc.msg)
			}
		})
	}
}

func TestSplitIsDeterministicAndDisjoint(t *testing.T) {
	ds, err := loadDigits("")
	if err != nil {
		t.Fatal(err)
	}
	a, b := ds.split(7, trainFraction)
	a2, b2 := ds.split(7, trainFraction)
	if a.len()+b.len() != ds.len() || a.len() != 1438 {
		t.Fatalf("split %d + %d of %d", a.len(), b.len(), ds.len())
	}
	if !slices.Equal(a.x, a2.x) || !slices.Equal(b.y, b2.y) {
		t.Fatal("the same seed gave different splits")
	}
	c, _ := ds.split(8, trainFraction)
	if slices.Equal(a.y, c.y) {
		t.Fatal("different seeds gave the same split")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*config)
		ok   bool
	}{
		{"default", func(*config) {}, true},
		{"zero ranks", func(c *config) { c.Ranks = 0 }, false},
		{"batch not a multiple", func(c *config) { c.Ranks, c.Batch = 3, 64 }, false},
		{"batch smaller than ranks", func(c *config) { c.Ranks, c.Batch = 8, 4 }, false},
		{"lr zero", func(c *config) { c.LR = 0 }, false},
		{"momentum one", func(c *config) { c.Momentum = 1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := defaultConfig()
			tc.edit(&c)
			err := c.validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errConfig)) {
				t.Fatalf("validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
