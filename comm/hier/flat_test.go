package hier_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/hier"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// compareLayouts adds to the conformance layouts one with more shards
// than one (S = 2) on uneven hosts: host 0 reduces shard by shard, host 1
// by reduce-scatter.
var compareLayouts = append(layouts[:len(layouts):len(layouts)], struct {
	name string
	l    hier.Layout
}{"3+2", hier.PerHost(3, 2)})

// TestAgainstFlat runs the same all-reduces on the composite (whole, and
// in chunks of 1 KiB) and on one flat inproc group of all the ranks: every rank of the composite must
// have the same bits; float32 sums and averages must be within the bound
// the package documents of the flat result, and integer results equal.
// The inputs have mixed signs and magnitudes, so that the order of
// summation shows in the last bits.
func TestAgainstFlat(t *testing.T) {
	ctx := context.Background()
	pool, err := allocator.New(allocator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	for _, tc := range compareLayouts {
		for _, chunk := range []int{0, 1 << 10} {
			t.Run(fmt.Sprintf("%s/chunk%d", tc.name, chunk), func(t *testing.T) {
				n := len(tc.l)
				hc := newChunkedJob(t, tc.l, inproc.Options{}, chunk)
				fc, err := inproc.NewGroup(n)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					for r := range n {
						hc[r].Close()
						fc[r].Close()
					}
				})
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				for _, count := range []int{1, 2, 3, 5, 7, 1000, 4099} {
					for _, dt := range []comm.DType{comm.Float32, comm.Int32, comm.Int64} {
						for _, op := range comm.Ops {
							if dt == comm.Float32 && (op == comm.Max || op == comm.Min) {
								continue // exact, as the conformance suite checks
							}
							what := fmt.Sprintf("all_reduce(%s) of %d x %s", op, count, dt)
							in := make([][]byte, n)
							for r := range n {
								in[r] = randomBytes(rng, dt, count)
							}
							flat := run(t, pool, ctx, asComms(fc), in, dt, op, true)
							for _, inPlace := range []bool{true, false} {
								got := run(t, pool, ctx, asComms(hc), in, dt, op, inPlace)
								for r := 1; r < n; r++ {
									if i := firstDiff(got[0], got[r]); i >= 0 {
										t.Fatalf("%s, in place %v: rank %d's element %d differs from rank 0's", what, inPlace, r, i/dt.Size())
									}
								}
								if msg := compare(dt, op, in, got[0], flat[0]); msg != "" {
									t.Fatalf("%s, in place %v: %s", what, inPlace, msg)
								}
							}
						}
					}
				}
			})
		}
	}
}

func asComms[C comm.Communicator](cs []C) []comm.Communicator {
	out := make([]comm.Communicator, len(cs))
	for r, c := range cs {
		out[r] = c
	}
	return out
}

// run all-reduces in[r] on every rank of cs and returns each rank's
// result.
func run(t *testing.T, pool *allocator.Pool, ctx context.Context, cs []comm.Communicator, in [][]byte, dt comm.DType, op comm.Op, inPlace bool) [][]byte {
	t.Helper()
	n, bytes := len(cs), len(in[0])
	var blocks []allocator.Block
	get := func() []byte {
		b, err := pool.Get(max(bytes, 1))
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, b)
		return b.Bytes()[:bytes]
	}
	defer func() {
		for _, b := range blocks {
			pool.Put(b)
		}
	}()
	send, recv := make([][]byte, n), make([][]byte, n)
	ws := make([]comm.Work, n)
	for r := range n {
		send[r] = get()
		copy(send[r], in[r])
		recv[r] = send[r]
		if !inPlace {
			recv[r] = get()
		}
		ws[r] = cs[r].AllReduce(buf(send[r], dt), buf(recv[r], dt), op)
	}
	testutil.MustWaitAll(t, ws...)
	out := make([][]byte, n)
	for r := range n {
		out[r] = append([]byte(nil), recv[r]...)
	}
	return out
}

func buf(b []byte, dt comm.DType) comm.Buffer {
	if len(b) == 0 {
		return comm.Buffer{DType: dt}
	}
	return comm.HostBuffer(unsafe.Pointer(unsafe.SliceData(b)), len(b)/dt.Size(), dt)
}

// randomBytes returns count random elements of dt: float32 values of
// both signs spread over six decades, integers over their whole range
// (sums wrap around, alike on both paths).
func randomBytes(rng *rand.Rand, dt comm.DType, count int) []byte {
	b := make([]byte, count*dt.Size())
	for i := range count {
		e := b[i*dt.Size():]
		switch dt {
		case comm.Float32:
			x := (rng.Float64()*2 - 1) * math.Pow(10, float64(rng.IntN(6)-3))
			comm.PutElem(dt, e, x)
		case comm.Int32:
			v := rng.Uint32()
			e[0], e[1], e[2], e[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		case comm.Int64:
			v := rng.Uint64()
			for k := range 8 {
				e[k] = byte(v >> (8 * k))
			}
		}
	}
	return b
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// compare checks the composite's result got against the flat group's:
// equal for integers; for float32, within twice γ(n-1)·Σ|x_i| (each of
// the two sums is within γ(n-1)·Σ|x_i| of the exact one, whatever its
// order), divided by n for Avg, plus one rounding of each average.
func compare(dt comm.DType, op comm.Op, in [][]byte, got, flat []byte) string {
	if dt != comm.Float32 {
		if i := firstDiff(got, flat); i >= 0 {
			return fmt.Sprintf("element %d = %v, flat all_reduce's %v", i/dt.Size(), comm.Elem(dt, got[i/dt.Size()*dt.Size():]), comm.Elem(dt, flat[i/dt.Size()*dt.Size():]))
		}
		return ""
	}
	n := len(in)
	const u = 0x1p-24
	gamma := float64(n-1) * u / (1 - float64(n-1)*u)
	for i := 0; i < len(got); i += 4 {
		abs := 0.0
		for r := range n {
			abs += math.Abs(comm.Elem(dt, in[r][i:]))
		}
		g, f := comm.Elem(dt, got[i:]), comm.Elem(dt, flat[i:])
		bound := 2 * gamma * abs
		if op == comm.Avg {
			bound = bound/float64(n)*(1+u) + u*(math.Abs(g)+math.Abs(f))
		}
		if d := math.Abs(g - f); d > bound {
			return fmt.Sprintf("element %d = %v, flat all_reduce's %v: they differ by %g, more than the bound %g", i/4, g, f, d, bound)
		}
	}
	return ""
}
