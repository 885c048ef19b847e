package bucket

import (
	"fmt"
	"math"

	"github.com/ddpgo/ddpgo/comm"
)

// encodingVersion is the first word of every encoded layout.
const encodingVersion = 1

// Encode flattens a layout into the []int64 that rank 0 broadcasts after
// rebuilding its buckets (PyTorch's sync_bucket_indices does the same with
// an index tensor and a bucket-size tensor). The encoding is
//
//	version, number of buckets, then per bucket:
//	dtype, device, limit, bytes, count, then count pairs (tensor index, byte offset)
//
// Offsets and sizes travel too, so that Decode on another rank detects a
// tensor whose size differs from rank 0's.
func Encode(bs []Bucket) []int64 {
	n := 2
	for _, b := range bs {
		n += 5 + 2*len(b.Tensors)
	}
	enc := make([]int64, 0, n)
	enc = append(enc, encodingVersion, int64(len(bs)))
	for _, b := range bs {
		enc = append(enc, int64(b.DType), int64(b.Device), int64(b.Limit), int64(b.Bytes), int64(len(b.Tensors)))
		for i, t := range b.Tensors {
			enc = append(enc, int64(t), int64(b.Offsets[i]))
		}
	}
	return enc
}

// Decode parses an encoded layout and validates it against the local
// tensors with Validate. Every error wraps ErrLayout and names the word,
// bucket or tensor at fault.
func Decode(tensors []Tensor, enc []int64) ([]Bucket, error) {
	if err := checkTensors(tensors); err != nil {
		return nil, err
	}
	d := decoder{enc: enc}
	if v := d.next("version"); d.err == nil && v != encodingVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrLayout, v, encodingVersion)
	}
	nb := d.next("bucket count")
	if d.err != nil {
		return nil, d.err
	}
	// Each bucket takes at least six words: a count this large cannot fit.
	if nb < 1 || nb > int64(len(enc)) || nb > int64(len(tensors)) {
		return nil, fmt.Errorf("%w: bucket count %d for %d tensors in %d words", ErrLayout, nb, len(tensors), len(enc))
	}
	bs := make([]Bucket, nb)
	idx := make([]int, 0, len(tensors))
	off := make([]int, 0, len(tensors))
	for k := range bs {
		b := &bs[k]
		dt := d.next("dtype")
		dev := d.next("device")
		lim := d.next("limit")
		by := d.next("bytes")
		cnt := d.next("count")
		if d.err != nil {
			return nil, fmt.Errorf("bucket %d: %w", k, d.err)
		}
		if dt < 0 || dt > math.MaxUint8 || !comm.DType(dt).Valid() {
			return nil, fmt.Errorf("%w: bucket %d has unknown dtype %d", ErrLayout, k, dt)
		}
		if dev < math.MinInt32 || dev > math.MaxInt32 {
			return nil, fmt.Errorf("%w: bucket %d has device %d out of range", ErrLayout, k, dev)
		}
		if lim <= 0 || by < 0 {
			return nil, fmt.Errorf("%w: bucket %d has limit %d and bytes %d", ErrLayout, k, lim, by)
		}
		if cnt < 1 || cnt > int64(len(tensors)-len(idx)) || cnt > int64(d.left()/2) {
			return nil, fmt.Errorf("%w: bucket %d claims %d tensors (%d tensors unplaced, %d words left)", ErrLayout, k, cnt, len(tensors)-len(idx), d.left())
		}
		start := len(idx)
		for range cnt {
			t, o := d.next("tensor index"), d.next("offset")
			if t < 0 || t >= int64(len(tensors)) {
				return nil, fmt.Errorf("%w: bucket %d lists tensor %d, out of range [0, %d)", ErrLayout, k, t, len(tensors))
			}
			if o < 0 || o > math.MaxInt {
				return nil, fmt.Errorf("%w: bucket %d: tensor %d has offset %d", ErrLayout, k, t, o)
			}
			idx = append(idx, int(t))
			off = append(off, int(o))
		}
		*b = Bucket{
			Tensors: idx[start:len(idx):len(idx)],
			Offsets: off[start:len(off):len(off)],
			Limit:   int(lim),
			Bytes:   int(by),
			DType:   comm.DType(dt),
			Device:  int(dev),
		}
	}
	if d.left() != 0 {
		return nil, fmt.Errorf("%w: %d trailing words after %d buckets", ErrLayout, d.left(), nb)
	}
	if err := Validate(tensors, bs); err != nil {
		return nil, err
	}
	return bs, nil
}

// Validate reports whether bs is a layout of tensors: every tensor in
// exactly one bucket, every bucket non-empty with one DType and Device
// matching its tensors, offsets dense in listed order, Bytes their total and
// Limit positive. Errors wrap ErrLayout.
func Validate(tensors []Tensor, bs []Bucket) error {
	where := make([]int32, len(tensors)) // bucket+1 holding each tensor
	placed := 0
	for k, b := range bs {
		if len(b.Tensors) == 0 {
			return fmt.Errorf("%w: bucket %d is empty", ErrLayout, k)
		}
		if len(b.Offsets) != len(b.Tensors) {
			return fmt.Errorf("%w: bucket %d has %d tensors and %d offsets", ErrLayout, k, len(b.Tensors), len(b.Offsets))
		}
		if b.Limit <= 0 {
			return fmt.Errorf("%w: bucket %d has limit %d", ErrLayout, k, b.Limit)
		}
		pos := 0
		for i, t := range b.Tensors {
			if t < 0 || t >= len(tensors) {
				return fmt.Errorf("%w: bucket %d lists tensor %d, out of range [0, %d)", ErrLayout, k, t, len(tensors))
			}
			if where[t] != 0 {
				return fmt.Errorf("%w: tensor %d is in bucket %d and bucket %d", ErrLayout, t, where[t]-1, k)
			}
			where[t] = int32(k + 1)
			placed++
			ten := tensors[t]
			if ten.DType != b.DType || ten.Device != b.Device {
				return fmt.Errorf("%w: bucket %d (%s, device %d) holds tensor %d (%s, device %d)",
					ErrLayout, k, b.DType, b.Device, t, ten.DType, ten.Device)
			}
			if b.Offsets[i] != pos {
				return fmt.Errorf("%w: bucket %d: tensor %d at offset %d, want %d", ErrLayout, k, t, b.Offsets[i], pos)
			}
			pos += ten.Bytes()
		}
		if b.Bytes != pos {
			return fmt.Errorf("%w: bucket %d has %d bytes, its tensors %d", ErrLayout, k, b.Bytes, pos)
		}
	}
	if placed != len(tensors) {
		for t, w := range where {
			if w == 0 {
				return fmt.Errorf("%w: tensor %d is in no bucket (%d of %d placed)", ErrLayout, t, placed, len(tensors))
			}
		}
	}
	return nil
}

// decoder reads words from an encoding, remembering the first overrun.
type decoder struct {
	enc []int64
	pos int
	err error
}

func (d *decoder) next(what string) int64 {
	if d.err != nil {
		return 0
	}
	if d.pos >= len(d.enc) {
		d.err = fmt.Errorf("%w: truncated at word %d reading %s", ErrLayout, d.pos, what)
		return 0
	}
	v := d.enc[d.pos]
	d.pos++
	return v
}

func (d *decoder) left() int { return len(d.enc) - d.pos }
