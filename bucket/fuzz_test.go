package bucket

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

// fuzzTensors makes a small tensor list from bytes: two bytes per tensor
// (numel, then dtype and device bits).
func fuzzTensors(data []byte) []Tensor {
	var ts []Tensor
	for i := 0; i+1 < len(data) && len(ts) < 64; i += 2 {
		ts = append(ts, Tensor{
			Numel:  int(data[i]),
			DType:  comm.DTypes[int(data[i+1]&7)%len(comm.DTypes)],
			Device: int(data[i+1]>>3) & 1,
		})
	}
	return ts
}

// FuzzDecode feeds arbitrary words to Decode: it must never panic, and what
// it accepts must be a valid layout that encodes back to the same words.
func FuzzDecode(f *testing.F) {
	ts := fuzzTensors([]byte{1, 0, 2, 0, 3, 3, 4, 0, 5, 8})
	for _, limits := range [][]int{{4}, {8, 16}, {1 << 20}} {
		bs, err := Assign(ts, limits, nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(words(Encode(bs)))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var enc []int64
		for len(data) >= 2 {
			// Mostly small words, so that structure is often right.
			enc = append(enc, int64(int16(binary.LittleEndian.Uint16(data))))
			data = data[2:]
		}
		bs, err := Decode(ts, enc)
		if err != nil {
			return
		}
		if err := Validate(ts, bs); err != nil {
			t.Fatalf("Decode accepted an invalid layout: %v", err)
		}
		if again := Encode(bs); !slices.Equal(again, enc) {
			t.Fatalf("Encode(Decode(%v)) = %v", enc, again)
		}
	})
}

func words(enc []int64) []byte {
	out := make([]byte, 0, 2*len(enc))
	for _, w := range enc {
		out = binary.LittleEndian.AppendUint16(out, uint16(int16(w)))
	}
	return out
}

// FuzzAssign checks Assign against the naive transcription on arbitrary
// tensors, limits and orders (which bucket each tensor lands in, in which
// order, under which cap), that every tensor is in exactly one bucket
// (Validate), and that the layout survives Encode and Decode.
func FuzzAssign(f *testing.F) {
	f.Add([]byte{50, 0, 25, 3, 50, 0, 25, 3}, uint16(200), uint16(400), false, uint64(0))
	f.Add([]byte{1, 0, 1, 0, 1, 0, 1, 0, 1, 0}, uint16(4), uint16(8), true, uint64(7))
	f.Fuzz(func(t *testing.T, data []byte, l0, l1 uint16, ordered bool, seed uint64) {
		ts := fuzzTensors(data)
		if len(ts) == 0 {
			return
		}
		limits := []int{int(l0) + 1, int(l1) + 1}
		var order []int
		if ordered {
			order = make([]int, len(ts))
			for i := range order {
				order[i] = i
			}
			for i := len(order) - 1; i > 0; i-- { // deterministic shuffle
				seed = seed*6364136223846793005 + 1442695040888963407
				j := int((seed >> 33) % uint64(i+1))
				order[i], order[j] = order[j], order[i]
			}
		}
		bs, err := Assign(ts, limits, order)
		if err != nil {
			t.Fatal(err)
		}
		if err := Validate(ts, bs); err != nil {
			t.Fatal(err)
		}
		// The encoding rank 0 broadcasts decodes to the same layout.
		dec, err := Decode(ts, Encode(bs))
		if err != nil {
			t.Fatalf("Decode(Encode(%v)): %v", indices(bs), err)
		}
		if !slices.EqualFunc(indices(dec), indices(bs), slices.Equal) || !slices.Equal(limitsOf(dec), limitsOf(bs)) {
			t.Fatalf("Decode(Encode(layout)) = %v %v, want %v %v", indices(dec), limitsOf(dec), indices(bs), limitsOf(bs))
		}
		want, wantLimits := reference(ts, limits, order)
		if !slices.EqualFunc(indices(bs), want, slices.Equal) || !slices.Equal(limitsOf(bs), wantLimits) {
			t.Fatalf("got %v %v, want %v %v", indices(bs), limitsOf(bs), want, wantLimits)
		}
	})
}
