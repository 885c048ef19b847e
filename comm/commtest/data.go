package commtest

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// period is the length of the repeating input pattern. It is prime, so a
// block moved by a power-of-two offset lands on different values.
const period = 1021

// values returns each rank's period input values for dt: small integers
// whose sums over n ranks are exact in dt, or, with frac, exactly
// representable fractions in [1, 2) whose sums need rounding in the half
// types.
func values(dt comm.DType, n int, frac bool, seed uint64) [][]float64 {
	r := rand.New(rand.NewPCG(seed, uint64(dt)<<8|uint64(n)))
	lo, hi := -1000, 1000
	switch dt {
	case comm.Float16:
		lo, hi = -500, 500
	case comm.BFloat16:
		lo, hi = -60, 60
	case comm.Uint8:
		lo, hi = 0, 255/n
	}
	v := make([][]float64, n)
	for rank := range v {
		v[rank] = make([]float64, period)
		for j := range v[rank] {
			switch {
			case frac && dt == comm.Float16:
				v[rank][j] = 1 + float64(r.IntN(1024))/1024
			case frac && dt == comm.BFloat16:
				v[rank][j] = 1 + float64(r.IntN(128))/128
			default:
				v[rank][j] = float64(lo + r.IntN(hi-lo+1))
			}
		}
	}
	return v
}

// combine returns the exact result of op over the ranks' values at j,
// before rounding to the dtype.
func combine(dt comm.DType, op comm.Op, v [][]float64, j int) float64 {
	x := v[0][j]
	for _, w := range v[1:] {
		switch op {
		case comm.Sum, comm.Avg:
			x += w[j]
		case comm.Max:
			x = max(x, w[j])
		case comm.Min:
			x = min(x, w[j])
		}
	}
	if op == comm.Avg {
		x /= float64(len(v))
		if !dt.IsFloat() {
			x = math.Trunc(x)
		}
	}
	return x
}

// table encodes period values in dt.
func table(dt comm.DType, f func(j int) float64) []byte {
	b := make([]byte, period*dt.Size())
	for j := range period {
		encode(dt, b[j*dt.Size():], f(j))
	}
	return b
}

// encode writes x, rounded once to dt, at the start of b.
func encode(dt comm.DType, b []byte, x float64) { comm.PutElem(dt, b, x) }

// key maps an element of a float dtype to an integer whose difference
// between two values counts units in the last place.
func key(dt comm.DType, b []byte) int64 {
	p := unsafe.Pointer(&b[0])
	switch dt {
	case comm.Float32:
		u := *(*uint32)(p)
		if u&(1<<31) != 0 {
			return -int64(u &^ (1 << 31))
		}
		return int64(u)
	case comm.Float64:
		u := *(*uint64)(p)
		if u&(1<<63) != 0 {
			return -int64(u &^ (1 << 63))
		}
		return int64(u)
	case comm.Float16, comm.BFloat16:
		u := *(*uint16)(p)
		if u&(1<<15) != 0 {
			return -int64(u &^ (1 << 15))
		}
		return int64(u)
	}
	return 0
}

// decode returns the element at the start of b as a float64, for messages.
func decode(dt comm.DType, b []byte) float64 { return comm.Elem(dt, b) }

// fill writes count elements of the repeating table into buf, starting at
// pattern position start.
func fill(buf []byte, tab []byte, sz, start, count int) {
	i, j := 0, start%period
	for i < count {
		k := min(count-i, period-j)
		copy(buf[i*sz:(i+k)*sz], tab[j*sz:(j+k)*sz])
		i += k
		j = 0
	}
}

// check compares count elements of got with the repeating table from
// pattern position start, allowing ulps units in the last place for float
// dtypes. It returns a description of the first difference, or "".
func check(dt comm.DType, got, tab []byte, start, count int, ulps int64) string {
	sz := dt.Size()
	i, j := 0, start%period
	for i < count {
		k := min(count-i, period-j)
		g, w := got[i*sz:(i+k)*sz], tab[j*sz:(j+k)*sz]
		if !bytes.Equal(g, w) {
			for e := 0; e < k; e++ {
				ge, we := g[e*sz:(e+1)*sz], w[e*sz:(e+1)*sz]
				if bytes.Equal(ge, we) {
					continue
				}
				if ulps > 0 && dt.IsFloat() {
					if d := key(dt, ge) - key(dt, we); d <= ulps && d >= -ulps {
						continue
					}
				}
				return fmt.Sprintf("element %d of %d = %v, want %v", i+e, count, decode(dt, ge), decode(dt, we))
			}
		}
		i += k
		j = 0
	}
	return ""
}

// tolerance is the allowed difference in units in the last place for a
// reduction of dt with op.
func (c *config) tolerance(dt comm.DType, op comm.Op) int64 {
	switch {
	case !dt.IsFloat() || op == comm.Max || op == comm.Min:
		return 0
	case dt == comm.Float16 || dt == comm.BFloat16:
		if op == comm.Avg {
			return int64(c.halfAvgULPs)
		}
		return int64(c.halfSumULPs)
	case op == comm.Avg:
		return 1
	}
	return 0
}

func buffer(b []byte, dt comm.DType) comm.Buffer {
	return comm.HostBuffer(unsafe.Pointer(unsafe.SliceData(b)), len(b)/dt.Size(), dt)
}

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
