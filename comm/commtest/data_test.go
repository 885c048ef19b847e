package commtest

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
)

// alloc returns a zeroed byte slice of n bytes, 8-byte aligned: Go memory,
// which only the pattern helpers see, never a collective.
func alloc(n int) []byte {
	w := make([]uint64, n/8+1)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

func TestFillAndCheck(t *testing.T) {
	for _, dt := range comm.DTypes {
		sz := dt.Size()
		v := values(dt, 3, false, 1)
		tab := table(dt, func(j int) float64 { return v[0][j] })
		for _, start := range []int{0, 5, period - 1, 3 * period} {
			count := 2*period + 17
			buf := alloc(count * sz)
			fill(buf, tab, sz, start, count)
			if msg := check(dt, buf, tab, start, count, 0); msg != "" {
				t.Fatalf("%s start %d: fill then check: %s", dt, start, msg)
			}
			if msg := check(dt, buf, tab, start+1, count, 0); msg == "" {
				t.Fatalf("%s start %d: check against a shifted pattern passed", dt, start)
			}
			// One changed element anywhere is reported with its index.
			i := count - 3
			buf[i*sz] ^= 0x40
			if msg := check(dt, buf, tab, start, count, 0); !strings.Contains(msg, fmt.Sprintf("element %d of %d", i, count)) {
				t.Fatalf("%s: changed element not reported: %q", dt, msg)
			}
		}
	}
}

func TestTolerance(t *testing.T) {
	tab := table(comm.Float16, func(j int) float64 { return 1.5 })
	buf := alloc(2 * period)
	fill(buf, tab, 2, 0, period)
	h := fp16.FromFloat32(1.5)
	*(*uint16)(ptr(buf[2*7:])) = h + 1 // one ulp up
	if msg := check(comm.Float16, buf, tab, 0, period, 0); msg == "" {
		t.Error("a one-ulp difference passed with tolerance 0")
	}
	if msg := check(comm.Float16, buf, tab, 0, period, 1); msg != "" {
		t.Errorf("a one-ulp difference failed with tolerance 1: %s", msg)
	}
	*(*uint16)(ptr(buf[2*7:])) = h + 2
	if msg := check(comm.Float16, buf, tab, 0, period, 1); msg == "" {
		t.Error("a two-ulp difference passed with tolerance 1")
	}
}

func TestCombine(t *testing.T) {
	v := [][]float64{{-7, 3}, {0, 4}}
	tests := []struct {
		dt   comm.DType
		op   comm.Op
		j    int
		want float64
	}{
		{comm.Int32, comm.Avg, 0, -3}, // truncation toward zero
		{comm.Float32, comm.Avg, 0, -3.5},
		{comm.Int64, comm.Sum, 1, 7},
		{comm.Float64, comm.Max, 0, 0},
		{comm.Float64, comm.Min, 1, 3},
	}
	for _, tt := range tests {
		if got := combine(tt.dt, tt.op, v, tt.j); got != tt.want {
			t.Errorf("combine(%s, %s, [%d]) = %v, want %v", tt.dt, tt.op, tt.j, got, tt.want)
		}
	}
}

// TestValuesExact checks that sums of the inputs are exact in every dtype,
// which is what lets the suite compare sums exactly.
func TestValuesExact(t *testing.T) {
	for _, dt := range comm.DTypes {
		for n := 1; n <= 4; n++ {
			v := values(dt, n, false, 9)
			b := alloc(dt.Size())
			for j := range period {
				x := combine(dt, comm.Sum, v, j)
				encode(dt, b, x)
				if got := decode(dt, b); got != x {
					t.Fatalf("%s, %d ranks: sum %v encodes as %v", dt, n, x, got)
				}
			}
		}
	}
}
