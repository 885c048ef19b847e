package reduce

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// alignedF32 returns a slice of n float32s that starts on a 32-byte
// boundary, with pad more elements behind it.
func alignedF32(n, pad int) []float32 {
	s := make([]float32, n+pad+8)
	skip := int(-uintptr(unsafe.Pointer(&s[0])) % 32 / 4)
	return s[skip : skip+n+pad]
}

// nanPairs puts NaNs with different payloads, quiet and signaling, of
// either sign, in a and b at the same elements: which of the two a kernel
// returns is then visible.
func nanPairs(r *rand.Rand, a, b []float32) {
	for i := range a {
		if r.IntN(8) == 0 {
			a[i] = math.Float32frombits(0x7f800001 | r.Uint32()&0x807fffff)
			b[i] = math.Float32frombits(0x7f800001 | r.Uint32()&0x807fffff)
		}
	}
}

// sameBits reports whether x and y are the same float32 bit for bit, NaN
// payloads included.
func sameBits(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) }

// ntKernels pairs each streaming kernel with the kernel it must match bit
// for bit and with its arithmetic in plain Go.
var ntKernels = []struct {
	name       string
	nt, plain  func(dst0, dst1, a, b []float32)
	arithmetic func(a, b float32) float32
}{
	{"SumFloat32TwiceNT", SumFloat32TwiceNT, SumFloat32Twice, func(a, b float32) float32 { return a + b }},
	{"AvgFloat32TwiceNT", AvgFloat32TwiceNT, AvgFloat32Twice, func(a, b float32) float32 { return float32(a*0.5) + float32(b*0.5) }},
}

// ntOffsets are element offsets of (dst0, dst1, a, b) from a 32-byte
// boundary: each operand misaligned alone, the outputs misaligned together
// (the kernels stream after a head), and everything misaligned.
func ntOffsets() [][4]int {
	var offs [][4]int
	for o := range 8 {
		offs = append(offs,
			[4]int{o, 0, 0, 0}, [4]int{0, o, 0, 0}, [4]int{0, 0, o, 0}, [4]int{0, 0, 0, o},
			[4]int{o, o, 0, 0}, [4]int{o, o, o, o}, [4]int{o, o, (o + 3) % 8, (o + 5) % 8},
			[4]int{o, (o + 1) % 8, (o + 2) % 8, (o + 7) % 8})
	}
	return offs
}

// checkNT runs k's streaming kernel on dst0, dst1, a, b at the given
// offsets (each a prefix of a longer buffer with guard elements around
// it) and checks both outputs against the ordinary kernel bit for bit and
// against plain Go arithmetic, and that nothing outside them was written.
func checkNT(t *testing.T, name string, nt, plain func(dst0, dst1, a, b []float32), arithmetic func(a, b float32) float32, a0, b0 []float32, off [4]int) {
	t.Helper()
	n := len(a0)
	const guard = 40
	buf := func(o int) []float32 {
		s := alignedF32(o+n, guard)
		for i := range s {
			s[i] = -7
		}
		return s
	}
	d0, d1, ab, bb := buf(off[0]), buf(off[1]), buf(off[2]), buf(off[3])
	copy(ab[off[2]:], a0)
	copy(bb[off[3]:], b0)
	want0, want1 := make([]float32, n), make([]float32, n)
	plain(want0, want1, a0, b0)
	nt(d0[off[0]:off[0]+n], d1[off[1]:off[1]+n], ab[off[2]:off[2]+n], bb[off[3]:off[3]+n])
	for i := range n {
		x, y := d0[off[0]+i], d1[off[1]+i]
		if !sameBits(x, want0[i]) || !sameBits(y, want1[i]) || !sameF32(x, arithmetic(a0[i], b0[i])) {
			t.Fatalf("%s n=%d offsets %v: [%d] = %#x, %#x; want %#x (a=%#x b=%#x)", name, n, off, i,
				math.Float32bits(x), math.Float32bits(y), math.Float32bits(want0[i]), math.Float32bits(a0[i]), math.Float32bits(b0[i]))
		}
	}
	for k, s := range [][]float32{d0, d1, ab, bb} {
		for i, v := range s {
			if (i < off[k] || i >= off[k]+n) && v != -7 {
				t.Fatalf("%s n=%d offsets %v: operand %d element %d outside the slice was written", name, n, off, k, i-off[k])
			}
		}
	}
	if !sameBitsSlice(ab[off[2]:off[2]+n], a0) || !sameBitsSlice(bb[off[3]:off[3]+n], b0) {
		t.Fatalf("%s n=%d offsets %v: an input was written", name, n, off)
	}
}

func sameBitsSlice(x, y []float32) bool {
	for i := range x {
		if !sameBits(x[i], y[i]) {
			return false
		}
	}
	return true
}

// TestTwiceNT checks the streaming kernels against the ordinary ones bit
// for bit, NaN payloads included, and against plain Go arithmetic, for
// every length across the vector blocks and the scalar tail and some long
// ones that span several assembly runs, with every operand at every
// offset from a 32-byte boundary, and NaN, infinite, subnormal, signed
// zero and largest finite inputs.
func TestTwiceNT(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	sizes := []int{1023, 1024, 4099, 1<<18 + 37, 2<<18 + 5}
	for n := range 201 {
		sizes = append(sizes, n)
	}
	for _, k := range ntKernels {
		for _, n := range sizes {
			a, b := randEdgeF32(r, n), randEdgeF32(r, n)
			nanPairs(r, a, b)
			offs := ntOffsets()
			if n > 4099 {
				offs = [][4]int{{0, 0, 0, 0}, {3, 3, 1, 6}, {0, 5, 0, 0}}
			}
			for _, off := range offs {
				checkNT(t, k.name, k.nt, k.plain, k.arithmetic, a, b, off)
			}
		}
	}
}

// TestTwiceNTAliased checks the streaming kernels in place and with the
// outputs swapped over the inputs, aligned and not.
func TestTwiceNTAliased(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, k := range ntKernels {
		for _, n := range []int{0, 1, 7, 8, 9, 31, 32, 33, 100, 4099} {
			for off := range 3 {
				a, b := randEdgeF32(r, n), randEdgeF32(r, n)
				nanPairs(r, a, b)
				want0, want1 := make([]float32, n), make([]float32, n)
				k.plain(want0, want1, a, b)
				for _, swapped := range []bool{false, true} {
					x, y := alignedF32(off+n, 0)[off:], alignedF32(off+n, 0)[off:]
					copy(x, a)
					copy(y, b)
					if swapped {
						k.nt(y, x, x, y)
					} else {
						k.nt(x, y, x, y)
					}
					for i := range n {
						if !sameBits(x[i], want0[i]) || !sameBits(y[i], want1[i]) {
							t.Fatalf("%s n=%d offset %d swapped %v: [%d] = %#x, %#x; want %#x", k.name, n, off, swapped, i, math.Float32bits(x[i]), math.Float32bits(y[i]), math.Float32bits(want0[i]))
						}
					}
				}
			}
		}
	}
}

func FuzzTwiceNT(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, false, uint16(0))
	f.Add(make([]byte, 8*40), true, uint16(0x0249))
	f.Add([]byte{1, 0, 0xc0, 0x7f, 3, 0, 0xc0, 0xff, 0, 0, 0x80, 0x7f, 1, 0, 0, 0}, true, uint16(0))
	f.Fuzz(func(t *testing.T, raw []byte, avg bool, offs uint16) {
		n := len(raw) / 8
		a, b := make([]float32, n), make([]float32, n)
		for i := range n {
			a[i] = math.Float32frombits(uint32(raw[8*i]) | uint32(raw[8*i+1])<<8 | uint32(raw[8*i+2])<<16 | uint32(raw[8*i+3])<<24)
			b[i] = math.Float32frombits(uint32(raw[8*i+4]) | uint32(raw[8*i+5])<<8 | uint32(raw[8*i+6])<<16 | uint32(raw[8*i+7])<<24)
		}
		k := ntKernels[0]
		if avg {
			k = ntKernels[1]
		}
		var off [4]int
		for j := range off {
			off[j] = int(offs>>(3*j)) & 7
		}
		checkNT(t, k.name, k.nt, k.plain, k.arithmetic, a, b, off)
	})
}

// BenchmarkTwiceNT compares the two-rank all-reduce kernel out of place,
// with ordinary and with streaming stores, on one thread, from inputs that
// fit in L2 to ones far past the last-level cache. GB/s counts the bytes
// the kernel must move: two inputs read, two outputs written.
func BenchmarkTwiceNT(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20, 64 << 20} {
		n := size / 4
		x, y := alignedF32(n, 0), alignedF32(n, 0)
		d0, d1 := alignedF32(n, 0), alignedF32(n, 0)
		for i := range x {
			x[i], y[i] = float32(i), 1
		}
		for _, k := range []struct {
			name string
			f    func(dst0, dst1, a, b []float32)
		}{{"plain", SumFloat32Twice}, {"nt", SumFloat32TwiceNT}} {
			b.Run(fmt.Sprintf("in=%dKiB/stores=%s", size>>10, k.name), func(b *testing.B) {
				for b.Loop() {
					k.f(d0, d1, x, y)
				}
				b.ReportMetric(float64(4*size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}
