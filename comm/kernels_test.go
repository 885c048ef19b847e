package comm

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/fp16"
)

func TestAnyNonfinite(t *testing.T) {
	for _, exp := range []uint16{0x7c00, 0x7f80} {
		for n := 0; n <= 13; n++ {
			for pos := -1; pos < n; pos++ {
				for _, v := range []uint16{exp, exp | 1, exp | 0x8000, exp ^ 0x0400 | 0x3ff} {
					s := make([]uint16, n)
					for i := range s {
						s[i] = uint16(0x3c00 + i) // finite, exponent not all ones
					}
					want := false
					if pos >= 0 {
						s[pos] = v
						want = v&exp == exp
					}
					if got := anyNonfinite(s, exp); got != want {
						t.Fatalf("exp %#x n %d pos %d value %#x: got %v, want %v", exp, n, pos, v, got, want)
					}
				}
			}
		}
	}
}

func FuzzAnyNonfinite(f *testing.F) {
	f.Add([]byte{0, 0x7c, 1, 2, 3, 4, 5, 6, 7, 8}, false)
	f.Add([]byte{0x80, 0x7f, 0, 0}, true)
	f.Fuzz(func(t *testing.T, data []byte, bf bool) {
		exp := uint16(0x7c00)
		if bf {
			exp = 0x7f80
		}
		s := make([]uint16, len(data)/2)
		want := false
		for i := range s {
			s[i] = uint16(data[2*i]) | uint16(data[2*i+1])<<8
			want = want || s[i]&exp == exp
		}
		if got := anyNonfinite(s, exp); got != want {
			t.Fatalf("%x: got %v, want %v", s, got, want)
		}
	})
}

// TestHostKernels checks each host kernel against a scalar reference over
// lengths that exercise the SIMD kernels' tails.
func TestHostKernels(t *testing.T) {
	k := HostKernels()
	if k.Location() != Host {
		t.Fatalf("host kernels report %v", k.Location())
	}
	for _, n := range []int{0, 1, 7, 8, 9, 33, 1000} {
		a := make([]float32, n)
		b := make([]float32, n)
		for i := range a {
			a[i] = float32(i) + 0.5
			b[i] = float32(2*i) - 3.25
		}
		dst := append([]float32(nil), a...)
		k.Add(Float32s(dst), Float32s(b))
		for i := range dst {
			if dst[i] != a[i]+b[i] {
				t.Fatalf("n %d: Add[%d] = %v, want %v", n, i, dst[i], a[i]+b[i])
			}
		}
		k.Scale(Float32s(dst), 0.25)
		for i := range dst {
			if want := (a[i] + b[i]) * 0.25; dst[i] != want {
				t.Fatalf("n %d: Scale[%d] = %v, want %v", n, i, dst[i], want)
			}
		}
		k.Copy(Float32s(dst), Float32s(b))
		k.Zero(Float32s(a))
		for i := range dst {
			if dst[i] != b[i] || a[i] != 0 {
				t.Fatalf("n %d: Copy/Zero[%d] = %v, %v", n, i, dst[i], a[i])
			}
		}
		h := make([]uint16, n)
		for _, dt := range []DType{Float16, BFloat16} {
			k.Compress(HostBuffer(ptr16(h), n, dt), Float32s(b), 0.5)
			back := make([]float32, n)
			k.Decompress(Float32s(back), HostBuffer(ptr16(h), n, dt))
			for i := range h {
				var want uint16
				var w float32
				if dt == Float16 {
					want = fp16.FromFloat32(b[i] * 0.5)
					w = fp16.ToFloat32(want)
				} else {
					want = fp16.BFloat16FromFloat32(b[i] * 0.5)
					w = fp16.BFloat16ToFloat32Scalar(want)
				}
				if h[i] != want || back[i] != w {
					t.Fatalf("n %d %s: element %d: %#x -> %v, want %#x -> %v", n, dt, i, h[i], back[i], want, w)
				}
			}
		}
		raw := make([]byte, 4*n)
		k.Download(raw, Float32s(b))
		k.Upload(Float32s(dst), raw)
		for i := range dst {
			if dst[i] != b[i] {
				t.Fatalf("n %d: Download/Upload[%d] = %v, want %v", n, i, dst[i], b[i])
			}
		}
	}
	if err := k.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestHostOverflows(t *testing.T) {
	k := HostKernels()
	in := []float32{1, 2, float32(math.Inf(1)), 4, float32(math.NaN()), 6, 7, 8, 9}
	wire := make([]uint16, len(in))
	for i := range wire {
		wire[i] = 0x3c00 // 1.0
	}
	if got := k.Overflows(HostBuffer(ptr16(wire), len(in), Float16), Float32s(in)); got != 0 {
		t.Fatalf("no non-finite element: %d overflows", got)
	}
	wire[1] = 0x7c00 // +Inf from a finite input: counts
	wire[2] = 0x7c00 // +Inf from +Inf: does not
	wire[4] = 0x7e00 // NaN from NaN: does not
	wire[8] = 0xfe00 // NaN from a finite input: counts
	if got := k.Overflows(HostBuffer(ptr16(wire), len(in), Float16), Float32s(in)); got != 2 {
		t.Fatalf("got %d overflows, want 2", got)
	}
}

func TestKernelsMismatchPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Copy of 3 into 4 elements did not panic")
		}
	}()
	HostKernels().Copy(Float32s(make([]float32, 4)), Float32s(make([]float32, 3)))
}

func ptr16(s []uint16) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(s)) }

// TestHostKernelsDTypes checks Add and Scale on every floating-point
// dtype: float64 exactly, half precision against the correctly rounded
// result of the exact operation (for Add) and the rounding of the float32
// product (for Scale), over lengths that cross the kernels' chunks.
func TestHostKernelsDTypes(t *testing.T) {
	k := HostKernels()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 9, halfChunk - 1, halfChunk, 2*halfChunk + 3} {
		a, b := make([]float64, n), make([]float64, n)
		for i := range a {
			a[i], b[i] = rng.NormFloat64()*1e3, rng.NormFloat64()
		}
		d := append([]float64(nil), a...)
		k.Add(Float64s(d), Float64s(b))
		k.Scale(Float64s(d), 0.1)
		for i := range d {
			if want := (a[i] + b[i]) * float64(float32(0.1)); d[i] != want {
				t.Fatalf("n %d: float64 Add+Scale[%d] = %v, want %v", n, i, d[i], want)
			}
		}
		for _, dt := range []DType{Float16, BFloat16} {
			x, y := make([]uint16, n), make([]uint16, n)
			for i := range x {
				x[i], y[i] = uint16(rng.Uint32()), uint16(rng.Uint32())
			}
			sum := append([]uint16(nil), x...)
			k.Add(HostBuffer(ptr16(sum), n, dt), HostBuffer(ptr16(y), n, dt))
			scaled := append([]uint16(nil), x...)
			k.Scale(HostBuffer(ptr16(scaled), n, dt), 0.3)
			for i := range x {
				if want := roundHalf(dt, float64(toF32(dt, x[i]))+float64(toF32(dt, y[i]))); !sameHalf(dt, sum[i], want) {
					t.Fatalf("n %d %s: Add %#x + %#x = %#x, want %#x", n, dt, x[i], y[i], sum[i], want)
				}
				if want := fromF32(dt, toF32(dt, x[i])*0.3); !sameHalf(dt, scaled[i], want) {
					t.Fatalf("n %d %s: Scale %#x = %#x, want %#x", n, dt, x[i], scaled[i], want)
				}
			}
		}
	}
	// Many runs: an allocation by another goroutine of the test process
	// (the runtime's, a finished test's) must not count as the kernels'.
	if allocs := testing.AllocsPerRun(1000, func() {
		h := HostBuffer(ptr16(make16), len(make16), Float16)
		k.Add(h, h)
		k.Scale(h, 0.5)
	}); allocs != 0 {
		t.Errorf("half Add and Scale: %v allocations", allocs)
	}
}

var make16 = make([]uint16, 3*halfChunk)

func toF32(dt DType, h uint16) float32 {
	if dt == Float16 {
		return fp16.ToFloat32(h)
	}
	return fp16.BFloat16ToFloat32Scalar(h)
}

func fromF32(dt DType, f float32) uint16 {
	if dt == Float16 {
		return fp16.FromFloat32(f)
	}
	return fp16.BFloat16FromFloat32(f)
}

// sameHalf compares two results, any NaN matching any NaN.
func sameHalf(dt DType, a, b uint16) bool {
	if f, g := toF32(dt, a), toF32(dt, b); f != f && g != g {
		return true
	}
	return a == b
}

// roundHalf rounds x, exact in float64, to the nearest value of dt, ties
// to even, by searching the neighbours of a first guess: a reference
// independent of the kernels' float32 route.
func roundHalf(dt DType, x float64) uint16 {
	if x != x || x == 0 { // NaN; a zero keeps the sign IEEE addition gives it
		return fromF32(dt, float32(x))
	}
	guess := fromF32(dt, float32(x))
	best, bestErr := guess, math.Inf(1)
	for _, c := range []uint16{guess - 1, guess, guess + 1, guess ^ 0x8000} {
		v := float64(toF32(dt, c))
		if v != v {
			continue
		}
		e := math.Abs(v - x)
		if math.IsInf(v, 0) {
			if math.IsInf(x, 0) && v == x {
				e = 0
			} else {
				continue
			}
		}
		if e < bestErr || e == bestErr && best&1 == 1 && c&1 == 0 {
			best, bestErr = c, e
		}
	}
	if math.IsInf(bestErr, 1) { // beyond the largest finite value: overflow
		return guess
	}
	// Past the largest finite value by half an ulp or more rounds to Inf.
	maxFinite := uint16(0x7bff)
	if dt == BFloat16 {
		maxFinite = 0x7f7f
	}
	m := float64(toF32(dt, maxFinite))
	ulp := m - float64(toF32(dt, maxFinite-1))
	if math.Abs(x) >= m+ulp/2 {
		return guess
	}
	return best
}

// FuzzHalfAdd checks the half-precision Add against the correctly rounded
// sum, for any bit patterns.
func FuzzHalfAdd(f *testing.F) {
	f.Add([]byte{0xff, 0x7b, 0xff, 0x7b}, false) // 65504 + 65504 overflows
	f.Add([]byte{0x01, 0x00, 0x00, 0x3c}, false) // the smallest subnormal + 1
	f.Add([]byte{0x80, 0x3f, 0x01, 0x80}, true)
	f.Fuzz(func(t *testing.T, data []byte, bf bool) {
		dt := Float16
		if bf {
			dt = BFloat16
		}
		n := len(data) / 4
		x, y := make([]uint16, n), make([]uint16, n)
		for i := range n {
			x[i] = uint16(data[4*i]) | uint16(data[4*i+1])<<8
			y[i] = uint16(data[4*i+2]) | uint16(data[4*i+3])<<8
		}
		sum := append([]uint16(nil), x...)
		HostKernels().Add(HostBuffer(ptr16(sum), n, dt), HostBuffer(ptr16(y), n, dt))
		for i := range n {
			if want := roundHalf(dt, float64(toF32(dt, x[i]))+float64(toF32(dt, y[i]))); !sameHalf(dt, sum[i], want) {
				t.Fatalf("%s: %#x + %#x = %#x, want %#x", dt, x[i], y[i], sum[i], want)
			}
		}
	})
}

// TestSupports: Kernels that do not implement KernelSupporter (the host's)
// do everything; those that do are asked.
func TestSupports(t *testing.T) {
	if !Supports(HostKernels(), OpScale, Float16) || !Supports(HostKernels(), OpAdd, Float64) {
		t.Error("HostKernels reported as not supporting Scale of half or Add of double")
	}
	k := float32Only{HostKernels()}
	if Supports(k, OpScale, Float16) || !Supports(k, OpScale, Float32) || !Supports(k, OpCompress, Float16) {
		t.Error("Supports does not ask a KernelSupporter")
	}
}

type float32Only struct{ Kernels }

func (float32Only) Supports(op string, dt DType) bool { return op != OpScale || dt == Float32 }
