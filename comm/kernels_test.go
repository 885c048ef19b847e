package comm

import (
	"math"
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
