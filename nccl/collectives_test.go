//go:build cgo

package nccl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
)

// runRanks runs f for every rank on its own goroutine and fails the test
// with every rank's error.
func runRanks(t *testing.T, cs []*Comm, f func(r int, c *Comm) error) {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// mem is a buffer of either kind for one rank: host pool memory, or
// device memory from the communicator's Source, reached through the
// communicator's kernels.
type mem struct {
	c    *Comm
	pool *allocator.Pool
	blk  allocator.Block
	buf  comm.Buffer
}

func newMem(t testing.TB, c *Comm, pool *allocator.Pool, count int, dt comm.DType) *mem {
	t.Helper()
	blk, err := pool.Get(max(count*dt.Size(), 1))
	if err != nil {
		t.Fatal(err)
	}
	m := &mem{c: c, pool: pool, blk: blk}
	m.buf = comm.Buffer{Addr: blk.Addr(), Count: count, DType: dt, Loc: comm.Host}
	if !pool.Host() {
		m.buf.Loc, m.buf.Device = comm.Device, c.Device()
	}
	t.Cleanup(func() { pool.Put(blk) })
	return m
}

func (m *mem) set(b []byte) {
	if m.buf.Loc == comm.Host {
		copy(m.blk.Bytes(), b)
		return
	}
	m.c.Kernels().Upload(m.buf, b)
}

func (m *mem) get() []byte {
	b := make([]byte, m.buf.Bytes())
	if m.buf.Loc == comm.Host {
		copy(b, m.blk.Bytes())
		return b
	}
	m.c.Kernels().Download(b, m.buf)
	return b
}

// value is element j of rank r's input: small integers, exact in every
// dtype for up to 4 ranks.
func value(dt comm.DType, r, j int) float64 {
	v := float64((r*7+j*3)%11 - 5)
	if dt == comm.Uint8 {
		v += 5
	}
	return v
}

func encode(dt comm.DType, vals []float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		p := b[i*dt.Size():]
		switch dt {
		case comm.Float32:
			binary.LittleEndian.PutUint32(p, math.Float32bits(float32(v)))
		case comm.Float64:
			binary.LittleEndian.PutUint64(p, math.Float64bits(v))
		case comm.Float16:
			binary.LittleEndian.PutUint16(p, fp16.FromFloat32(float32(v)))
		case comm.BFloat16:
			binary.LittleEndian.PutUint16(p, fp16.BFloat16FromFloat32(float32(v)))
		case comm.Int32:
			binary.LittleEndian.PutUint32(p, uint32(int32(v)))
		case comm.Int64:
			binary.LittleEndian.PutUint64(p, uint64(int64(v)))
		case comm.Uint8:
			p[0] = uint8(v)
		}
	}
	return b
}

func inputs(dt comm.DType, r, n int) []float64 {
	v := make([]float64, n)
	for j := range v {
		v[j] = value(dt, r, j)
	}
	return v
}

// reduced is the exact result of op over size ranks at element j.
func reduced(dt comm.DType, op comm.Op, size, j int) float64 {
	x := value(dt, 0, j)
	for r := 1; r < size; r++ {
		v := value(dt, r, j)
		switch op {
		case comm.Sum, comm.Avg:
			x += v
		case comm.Max:
			x = max(x, v)
		case comm.Min:
			x = min(x, v)
		}
	}
	if op == comm.Avg {
		x /= float64(size)
		if !dt.IsFloat() {
			x = math.Trunc(x)
		}
	}
	return x
}

// closeEnough compares, allowing an average one unit in the last place.
func closeEnough(dt comm.DType, op comm.Op, got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	sz := dt.Size()
	for i := 0; i < len(got); i += sz {
		g, w := got[i:i+sz], want[i:i+sz]
		if bytes.Equal(g, w) {
			continue
		}
		if op == comm.Avg && dt.IsFloat() {
			var d int64
			switch sz {
			case 2:
				d = int64(binary.LittleEndian.Uint16(g)) - int64(binary.LittleEndian.Uint16(w))
			case 4:
				d = int64(binary.LittleEndian.Uint32(g)) - int64(binary.LittleEndian.Uint32(w))
			case 8:
				d = int64(binary.LittleEndian.Uint64(g) - binary.LittleEndian.Uint64(w))
			}
			if d >= -1 && d <= 1 {
				continue
			}
		}
		return fmt.Errorf("element %d: got % x, want % x", i/sz, g, w)
	}
	return nil
}

// pools returns the memory kinds each test runs on: host pool memory
// (staged through the device) and device memory from c.Source().
func pools(t *testing.T, c *Comm) map[string]*allocator.Pool {
	dev, err := allocator.New(allocator.Options{Source: c.Source(), Limit: 64 << 20, SlabSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return map[string]*allocator.Pool{"host": hostPool(t), "device": dev}
}

func TestAllReduce(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("%dranks", n), func(t *testing.T) {
			cs := newGroup(t, n, nil)
			runRanks(t, cs, func(r int, c *Comm) error {
				for _, kind := range []string{"host", "device"} {
					pool := pools(t, c)[kind]
					for _, dt := range comm.DTypes {
						for _, op := range comm.Ops {
							for _, count := range []int{0, 1, 7, 1027} {
								for _, inPlace := range []bool{false, true} {
									send := newMem(t, c, pool, count, dt)
									recv := send
									if !inPlace {
										recv = newMem(t, c, pool, count, dt)
									}
									send.set(encode(dt, inputs(dt, r, count)))
									if err := c.AllReduce(send.buf, recv.buf, op).Wait(t.Context()); err != nil {
										return err
									}
									want := make([]float64, count)
									for j := range want {
										want[j] = reduced(dt, op, n, j)
									}
									if err := closeEnough(dt, op, recv.get(), encode(dt, want)); err != nil {
										return fmt.Errorf("%s %s %s count %d in place %v: %v", kind, dt, op, count, inPlace, err)
									}
									if !inPlace && !bytes.Equal(send.get(), encode(dt, inputs(dt, r, count))) {
										return fmt.Errorf("%s %s %s count %d: send buffer changed", kind, dt, op, count)
									}
								}
							}
						}
					}
				}
				return nil
			})
		})
	}
}

func TestOtherCollectives(t *testing.T) {
	const count = 5
	n := groupSize(3)
	cs := newGroup(t, n, nil)
	dt := comm.Int32
	runRanks(t, cs, func(r int, c *Comm) error {
		for kind, pool := range pools(t, c) {
			// Broadcast from each root.
			for root := range n {
				b := newMem(t, c, pool, count, dt)
				b.set(encode(dt, inputs(dt, r, count)))
				if err := c.Broadcast(b.buf, root).Wait(t.Context()); err != nil {
					return err
				}
				if !bytes.Equal(b.get(), encode(dt, inputs(dt, root, count))) {
					return fmt.Errorf("%s: Broadcast from %d: wrong result", kind, root)
				}
			}
			// Reduce to each root.
			for root := range n {
				s, d := newMem(t, c, pool, count, dt), newMem(t, c, pool, count, dt)
				s.set(encode(dt, inputs(dt, r, count)))
				if err := c.Reduce(s.buf, d.buf, comm.Sum, root).Wait(t.Context()); err != nil {
					return err
				}
				if r == root {
					want := make([]float64, count)
					for j := range want {
						want[j] = reduced(dt, comm.Sum, n, j)
					}
					if !bytes.Equal(d.get(), encode(dt, want)) {
						return fmt.Errorf("%s: Reduce to %d: wrong result", kind, root)
					}
				}
			}
			// AllGather and ReduceScatter, out of place and in place.
			all := newMem(t, c, pool, n*count, dt)
			mine := newMem(t, c, pool, count, dt)
			mine.set(encode(dt, inputs(dt, r, count)))
			if err := c.AllGather(mine.buf, all.buf).Wait(t.Context()); err != nil {
				return err
			}
			var want []float64
			for q := range n {
				want = append(want, inputs(dt, q, count)...)
			}
			if !bytes.Equal(all.get(), encode(dt, want)) {
				return fmt.Errorf("%s: AllGather: wrong result", kind)
			}
			own := all.buf.Slice(r*count, count)
			// In place: the rank's values sit in its own block of recv.
			tmp := encode(dt, append(append(make([]float64, r*count), inputs(dt, r, count)...), make([]float64, (n-r-1)*count)...))
			all.set(tmp)
			if err := c.AllGather(own, all.buf).Wait(t.Context()); err != nil {
				return err
			}
			if !bytes.Equal(all.get(), encode(dt, want)) {
				return fmt.Errorf("%s: AllGather in place: wrong result", kind)
			}
			src := newMem(t, c, pool, n*count, dt)
			var in []float64
			for q := range n {
				in = append(in, inputs(dt, (r+q)%n, count)...)
			}
			src.set(encode(dt, in))
			dst := newMem(t, c, pool, count, dt)
			if err := c.ReduceScatter(src.buf, dst.buf, comm.Max).Wait(t.Context()); err != nil {
				return err
			}
			wantRS := make([]float64, count)
			for j := range wantRS {
				wantRS[j] = math.Inf(-1)
				for q := range n {
					wantRS[j] = max(wantRS[j], value(dt, (q+r)%n, j))
				}
			}
			if !bytes.Equal(dst.get(), encode(dt, wantRS)) {
				return fmt.Errorf("%s: ReduceScatter: wrong result", kind)
			}
			if n == 1 {
				// Send and Recv need another rank.
				if err := c.Barrier().Wait(t.Context()); err != nil {
					return err
				}
				continue
			}
			// Send/Recv around a ring, posted without a group: the
			// stand-in's sends are buffered, as NCCL's small ones are.
			sb, rb := newMem(t, c, pool, count, dt), newMem(t, c, pool, count, dt)
			sb.set(encode(dt, inputs(dt, r, count)))
			c.GroupStart()
			ws := c.Send(sb.buf, (r+1)%n)
			wr := c.Recv(rb.buf, (r+n-1)%n)
			if err := c.GroupEnd(); err != nil {
				return err
			}
			if err := ws.Wait(t.Context()); err != nil {
				return err
			}
			if err := wr.Wait(t.Context()); err != nil {
				return err
			}
			if !bytes.Equal(rb.get(), encode(dt, inputs(dt, (r+n-1)%n, count))) {
				return fmt.Errorf("%s: Recv from %d: wrong result", kind, (r+n-1)%n)
			}
			if err := c.Barrier().Wait(t.Context()); err != nil {
				return err
			}
		}
		return nil
	})
}
