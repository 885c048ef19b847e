package bench

import (
	"math"

	"github.com/ddpgo/ddpgo/comm"
)

// pattern is the data of a checked collective: element i of rank r's
// input is a small integer, so that sums over ranks are exact in every
// dtype (bfloat16 holds integers exactly up to 256).
type pattern struct {
	dt comm.DType
	n  int
}

// garbage marks output elements that the collective must overwrite.
const garbage = 99

// value returns rank r's input element i.
func (p pattern) value(r, i int) int64 {
	v := int64((i*7 + r*3) % 9)
	if p.dt == comm.Uint8 {
		return v
	}
	return v - 4
}

// expected returns element i of the result of red over all ranks' inputs.
func (p pattern) expected(red comm.Op, i int) float64 {
	acc := p.value(0, i)
	for r := 1; r < p.n; r++ {
		v := p.value(r, i)
		switch red {
		case comm.Sum, comm.Avg:
			acc += v
		case comm.Max:
			acc = max(acc, v)
		case comm.Min:
			acc = min(acc, v)
		}
	}
	if p.dt == comm.Uint8 && red != comm.Max && red != comm.Min {
		acc &= 0xff
	}
	if red != comm.Avg {
		return float64(acc)
	}
	if !p.dt.IsFloat() {
		return float64(acc / int64(p.n)) // truncation, as integers divide
	}
	return float64(acc) / float64(p.n)
}

func (p pattern) fillInputs(cfg *CollectiveConfig, b *rankBufs, r, count, per int, inPlace bool) {
	if b.kern != nil {
		defer b.upload(count, p.dt)
	}
	es := p.dt.Size()
	switch cfg.Op {
	case AllReduce, Reduce, ReduceScatter:
		if inPlace && cfg.Op != ReduceScatter {
			p.fill(b.recv[:count*es], r, 0)
		} else {
			p.fill(b.send[:count*es], r, 0)
			p.fillConst(b.recv[:count*es], garbage)
		}
	case Broadcast:
		p.fillConst(b.recv[:count*es], garbage)
		if r == cfg.Root {
			if inPlace {
				p.fill(b.recv[:count*es], r, 0)
			} else {
				p.fill(b.send[:count*es], r, 0)
			}
		}
	case AllGather:
		p.fillConst(b.recv[:count*es], garbage)
		if inPlace {
			p.fill(b.recv[r*per*es:(r+1)*per*es], r, 0)
		} else {
			p.fill(b.send[:per*es], r, 0)
		}
	case SendRecv:
		p.fill(b.send[:count*es], r, 0)
		p.fillConst(b.recv[:count*es], garbage)
	}
}

// fill writes rank r's pattern into buf, element i holding value(r, base+i).
func (p pattern) fill(buf []byte, r, base int) {
	n := len(buf) / p.dt.Size()
	for i := range n {
		p.set(buf, i, p.value(r, base+i))
	}
}

func (p pattern) fillConst(buf []byte, v int64) {
	n := len(buf) / p.dt.Size()
	for i := range n {
		p.set(buf, i, v)
	}
}

func (p pattern) set(buf []byte, i int, v int64) {
	comm.PutElem(p.dt, buf[i*p.dt.Size():], float64(v))
}

func (p pattern) get(buf []byte, i int) float64 {
	return comm.Elem(p.dt, buf[i*p.dt.Size():])
}

// tolerance is the error allowed for an average, which is not an integer;
// every other result is compared exactly.
func (p pattern) tolerance(red comm.Op, want float64) float64 {
	if red != comm.Avg || !p.dt.IsFloat() {
		return 0
	}
	rel := map[comm.DType]float64{comm.Float32: 1e-6, comm.Float64: 1e-12, comm.Float16: 1e-3, comm.BFloat16: 8e-3}[p.dt]
	return rel * max(1, math.Abs(want))
}

// check counts the elements of out that differ from the exact result.
func (p pattern) check(cfg *CollectiveConfig, r int, out comm.Buffer, per int) int64 {
	if out.Count == 0 {
		return 0
	}
	buf := out.AsBytes()
	var wrong int64
	for i := range out.Count {
		var want float64
		switch cfg.Op {
		case AllReduce, Reduce:
			want = p.expected(cfg.RedOp, i)
		case ReduceScatter:
			want = p.expected(cfg.RedOp, r*per+i)
		case Broadcast:
			want = float64(p.value(cfg.Root, i))
		case AllGather:
			want = float64(p.value(i/per, i%per))
		case SendRecv:
			want = float64(p.value((r-1+p.n)%p.n, i))
		}
		got := p.get(buf, i)
		if !(math.Abs(got-want) <= p.tolerance(cfg.RedOp, want)) {
			wrong++
		}
	}
	return wrong
}
