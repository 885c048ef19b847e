package ddp

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
)

// checkParams verifies that every rank has the same parameters: count,
// shapes and dtypes (names are reported but not compared, as in PyTorch).
// One AllGather of (count, fingerprint, longest shape) settles the common
// case (it carries the options that shape the collective sequence as
// well); on a parameter mismatch every rank gathers every rank's descriptors and
// names the first parameter and rank that differ from rank 0.
//
// A rank that failed to prepare its Reducer (failed is not zero: what
// failureOf makes of its error) still takes part in the AllGather, so that
// every other rank learns of it, and of why where failureOf can tell, and
// fails too. The exchanges go through pool memory (control.go).
//
// exchange reports that err is a failure of one of the check's
// collectives, which the peers may not share (they may have completed
// it and gone on), rather than its verdict (a mismatch, a peer's
// failure), which every rank reaches from the same gathered data.
func (r *Reducer) checkParams(ctx context.Context, failed int64) (exchange bool, err error) {
	c, params, o := r.c, r.params, &r.o
	n := c.Size()
	sum, maxDims := fingerprint(params)
	bufSum, _ := fingerprint(r.bufs.params) // broadcast every step: must agree too
	// Options that decide the sequence of collectives must agree too: the
	// hook (by name, up to 16 bytes), the bucket caps, KeepLayout, the
	// buffers and the join mode.
	var hookName [16]byte
	copy(hookName[:], o.Hook.Name())
	keep := int64(o.Shard) << 1 // Options.Shard shares KeepLayout's word
	if o.KeepLayout {
		keep |= 1
	}
	const words = 11
	mine := []int64{int64(len(params)), int64(sum), int64(maxDims),
		int64(o.FirstBucketCap), int64(o.BucketCap), keep, word(hookName[:8]), word(hookName[8:]),
		int64(bufSum), int64(o.Join), failed}
	all := make([]int64, words*n)
	if err := r.ctlAllGather(ctx, "the parameter check", asBytes(mine), asBytes(all), comm.Int64); err != nil {
		return true, fmt.Errorf("ddp: rank %d checking parameters across ranks: %w", c.Rank(), err)
	}
	if failed != 0 {
		return false, nil // the caller returns its own error
	}
	for r := range n {
		switch all[words*r+10] {
		case 0:
		case failedSharedHook:
			return false, fmt.Errorf("ddp: rank %d: rank %d could not set up its hook %s: %w: one Hook value was given to several ranks of this process, and each rank needs its own (rank %d's error names the ranks)",
				c.Rank(), r, o.Hook.Name(), hooks.ErrShared, r)
		default:
			return false, fmt.Errorf("%w: rank %d could not build its reducer (its own error says why: an unsupported parameter, bad options or no memory), so rank %d cannot proceed either",
				ErrParamMismatch, r, c.Rank())
		}
	}
	same := true
	maxCount, width := 0, 0
	for r := 0; r < n; r++ {
		a := all[words*r : words*(r+1)]
		if a[0] != all[0] || a[1] != all[1] {
			same = false
		}
		maxCount = max(maxCount, int(a[0]))
		width = max(width, int(a[2]))
	}
	if same {
		for r := 1; r < n; r++ {
			a := all[words*r : words*(r+1)]
			if !slices.Equal(a[3:8], all[3:8]) || a[9] != all[9] {
				return false, fmt.Errorf("%w: options differ between rank 0 and rank %d: rank 0 has hook %q, bucket caps [%d %d], KeepLayout %v, Shard %v, Join %v; rank %d has hook %q, bucket caps [%d %d], KeepLayout %v, Shard %v, Join %v",
					ErrParamMismatch, r, unword(all[6], all[7]), all[3], all[4], all[5]&1 != 0, ShardMode(all[5]>>1), JoinMode(all[9]), r, unword(a[6], a[7]), a[3], a[4], a[5]&1 != 0, ShardMode(a[5]>>1), JoinMode(a[9]))
			}
			if a[8] != all[8] {
				return false, fmt.Errorf("%w: Options.Buffers differ between rank 0 and rank %d (count, shapes or dtypes): every rank needs the same buffers", ErrParamMismatch, r)
			}
		}
		return false, nil
	}
	for r := range n {
		all[3*r], all[3*r+1], all[3*r+2] = all[words*r], all[words*r+1], all[words*r+2]
	}
	all = all[:3*n]

	// Descriptors: per parameter [present, dtype, ndim, dims...], padded to
	// maxCount parameters; names: the first nameLen bytes.
	const nameLen = 64
	width += 3
	desc := make([]int64, maxCount*width)
	names := make([]uint8, maxCount*nameLen)
	for i, p := range params {
		d := desc[i*width:]
		d[0], d[1], d[2] = 1, int64(p.DType), int64(len(p.Shape))
		for j, s := range p.Shape {
			d[3+j] = int64(s)
		}
		copy(names[i*nameLen:(i+1)*nameLen], p.Name)
	}
	allDesc := make([]int64, n*len(desc))
	allNames := make([]uint8, n*len(names))
	if err := r.ctlAllGather(ctx, "the parameter descriptors", asBytes(desc), asBytes(allDesc), comm.Int64); err != nil {
		return true, fmt.Errorf("ddp: rank %d gathering parameter descriptors: %w", c.Rank(), err)
	}
	if err := r.ctlAllGather(ctx, "the parameter names", names, allNames, comm.Uint8); err != nil {
		return true, fmt.Errorf("ddp: rank %d gathering parameter names: %w", c.Rank(), err)
	}
	at := func(r, i int) []int64 { return allDesc[r*len(desc)+i*width : r*len(desc)+(i+1)*width] }
	name := func(r, i int) string {
		b := allNames[r*len(names)+i*nameLen : r*len(names)+(i+1)*nameLen]
		end := 0
		for end < len(b) && b[end] != 0 {
			end++
		}
		return string(b[:end])
	}
	show := func(r, i int) string {
		d := at(r, i)
		if d[0] == 0 {
			return fmt.Sprintf("rank %d has no parameter %d (it has %d)", r, i, all[3*r])
		}
		shape := make([]int64, d[2])
		copy(shape, d[3:3+d[2]])
		return fmt.Sprintf("rank %d has %q %v %s", r, name(r, i), shape, comm.DType(d[1]))
	}
	for i := 0; i < maxCount; i++ {
		for r := 1; r < n; r++ {
			a, b := at(0, i), at(r, i)
			differ := a[0] != b[0] || a[1] != b[1] || a[2] != b[2]
			for j := 3; !differ && j < 3+int(a[2]); j++ {
				differ = a[j] != b[j]
			}
			if differ {
				return false, fmt.Errorf("%w: parameter %d differs between rank 0 and rank %d: %s, %s (rank 0 has %d parameters, rank %d has %d)",
					ErrParamMismatch, i, r, show(0, i), show(r, i), all[0], r, all[3*r])
			}
		}
	}
	return false, fmt.Errorf("%w: fingerprints differ but no differing parameter was found (rank %d)", ErrParamMismatch, c.Rank())
}

// Failures New's check tells the peers of (see failureOf).
const (
	failedOther      int64 = 1
	failedSharedHook int64 = 2 // hooks.ErrShared
)

// failureOf is what New's check tells the peers of a rank's failure to
// prepare its Reducer: 0 for none; the cause where the peers should report
// it rather than a mismatch (a Hook value shared between ranks fails on
// the rank that set it up second, but the mistake is every rank's).
func failureOf(err error) int64 {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, hooks.ErrShared):
		return failedSharedHook
	}
	return failedOther
}

// fingerprint hashes the count, dtypes and shapes of ps (not the names, as
// in PyTorch) and returns the largest number of dimensions.
func fingerprint(ps []Param) (uint64, int) {
	h := fnv.New64a()
	var w [8]byte
	put := func(v int64) {
		for j := range w {
			w[j] = byte(v >> (8 * j))
		}
		h.Write(w[:])
	}
	maxDims := 0
	put(int64(len(ps)))
	for _, p := range ps {
		put(int64(p.DType))
		put(int64(len(p.Shape)))
		for _, d := range p.Shape {
			put(int64(d))
		}
		maxDims = max(maxDims, len(p.Shape))
	}
	return h.Sum64(), maxDims
}

// word packs 8 bytes into an int64, little-endian.
func word(b []byte) int64 {
	var v uint64
	for j := 7; j >= 0; j-- {
		v = v<<8 | uint64(b[j])
	}
	return int64(v)
}

// unword is the inverse of word over two words, dropping trailing zeros.
func unword(a, b int64) string {
	var buf [16]byte
	for j := range 8 {
		buf[j] = byte(uint64(a) >> (8 * j))
		buf[8+j] = byte(uint64(b) >> (8 * j))
	}
	end := 0
	for end < len(buf) && buf[end] != 0 {
		end++
	}
	return string(buf[:end])
}
