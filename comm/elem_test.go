package comm

import (
	"math"
	"strings"
	"testing"
)

// TestElem: PutElem and Elem round-trip every dtype's exact values and
// round once to the dtype.
func TestElem(t *testing.T) {
	b := make([]byte, 8)
	for _, dt := range []DType{Float32, Float64, Float16, BFloat16, Int32, Int64, Uint8} {
		for _, x := range []float64{0, 1, 3, 200} {
			PutElem(dt, b, x)
			if got := Elem(dt, b); got != x {
				t.Errorf("%s: put %g, got %g", dt, x, got)
			}
		}
	}
	for _, tc := range []struct {
		dt   DType
		x    float64
		want float64
	}{
		{Float16, 1 + 1.0/2048, 1},            // a tie rounds to even
		{Float16, 1 + 3.0/2048, 1 + 2.0/1024}, // a tie rounds to even, upward
		{BFloat16, 257, 256},
		{Float16, 1e6, math.Inf(1)},
		{Int32, -2.7, -2},
	} {
		PutElem(tc.dt, b, tc.x)
		if got := Elem(tc.dt, b); got != tc.want {
			t.Errorf("%s: put %g, got %g, want %g", tc.dt, tc.x, got, tc.want)
		}
	}
	if !math.IsNaN(Elem(DType(200), b)) {
		t.Error("Elem of an invalid dtype is not NaN")
	}
}

// TestOpErrorBarrier: a barrier's error names no count or dtype, which it
// has none of; other operations' errors name both.
func TestOpErrorBarrier(t *testing.T) {
	b := (&OpError{Rank: 1, Seq: 3, Kind: KindBarrier, Err: ErrAborted}).Error()
	if b != "comm: rank 1: barrier #3: "+ErrAborted.Error() {
		t.Errorf("barrier: %q", b)
	}
	a := (&OpError{Rank: 0, Seq: 2, Kind: KindAllReduce, Count: 4, DType: Float32, Err: ErrAborted}).Error()
	if !strings.Contains(a, "all_reduce #2 (4 x float") {
		t.Errorf("all_reduce: %q", a)
	}
}
