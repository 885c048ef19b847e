package hooks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/fp16"
	"github.com/ddpgo/ddpgo/inproc"
)

type kind struct {
	name   string
	hook   func() Hook
	u, eta float64 // unit roundoff and half the smallest subnormal of the wire type
	wire   int     // bytes per element on the wire
}

var kinds = []kind{
	{"allreduce", AllReduce, 0x1p-24, 0x1p-150, 4},
	{"avg", Avg, 0x1p-24, 0x1p-150, 4},
	{"fp16", FP16, 0x1p-11, 0x1p-25, 2},
	{"bf16", BF16, 0x1p-8, 0x1p-134, 2},
}

// bound is the package documentation's error bound for one element, S
// being sum_r |g_r| / n.
func bound(k kind, n int, S float64) float64 {
	a := k.u + 2*0x1p-24
	m := float64(n - 1)
	gamma := m * k.u / (1 - m*k.u)
	return (a+gamma*(1+a))*S + 2*float64(n)*k.eta
}

// group runs f on every rank of an n-rank in-process group, each with its
// own pool and hook, the hook set up with the host kernels.
func group(t *testing.T, n int, k kind, f func(rank int, c comm.Communicator, h Hook, pool *allocator.Pool) error) {
	t.Helper()
	for r, err := range runGroup(t, n, func(int, *allocator.Pool) Hook { return k.hook() }, f) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// runGroup runs f on every rank of an n-rank in-process group, each with
// its own pool and the hook newHook returns for it, set up with the host
// kernels. A rank whose f fails aborts its communicator, so that its peers
// fail rather than wait for it. It returns every rank's error: f's,
// Close's, and memory still in use after Close.
func runGroup(t *testing.T, n int, newHook func(rank int, pool *allocator.Pool) Hook, f func(rank int, c comm.Communicator, h Hook, pool *allocator.Pool) error) []error {
	t.Helper()
	cs, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() {
			pool, err := allocator.New(allocator.Options{})
			if err != nil {
				errs[r] = err
				return
			}
			defer pool.Close()
			h := newHook(r, pool)
			if err := h.Setup(c, comm.HostKernels()); err != nil {
				errs[r] = err
				return
			}
			if errs[r] = f(r, c, h, pool); errs[r] != nil {
				c.Abort(errs[r])
			}
			errs[r] = errors.Join(errs[r], h.Close())
			if st := pool.Stats(); st.InUse != 0 && errs[r] == nil {
				errs[r] = fmt.Errorf("rank %d: %d bytes still in use after Close", r, st.InUse)
			}
		})
	}
	wg.Wait()
	return errs
}

// randomGrads returns n ranks' gradients of m elements with magnitudes
// spread over many binades (down into fp16's subnormals), and signs mixed.
func randomGrads(rng *rand.Rand, n, m int) [][]float32 {
	g := make([][]float32, n)
	for r := range g {
		g[r] = make([]float32, m)
		for i := range g[r] {
			g[r][i] = float32(rng.NormFloat64() * math.Pow(10, -7+9*rng.Float64()))
		}
	}
	return g
}

// TestAccuracy reduces random gradients with every hook and checks each
// element against the exact average (float64) within the derived bound,
// and that every rank holds the same result.
func TestAccuracy(t *testing.T) {
	const m = 10007             // odd: exercises the kernels' tails
	fp32 := map[int][]float32{} // the AllReduce hook's result, by group size
	for _, k := range kinds {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", k.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 11))
				in := randomGrads(rng, n, m)
				out := make([][]float32, n)
				group(t, n, k, func(rank int, c comm.Communicator, h Hook, pool *allocator.Pool) error {
					buf, b, err := reduceValues(pool, h, in[rank])
					if err != nil {
						return err
					}
					if b.WireBytes != int64(m*k.wire) {
						return fmt.Errorf("WireBytes %d, want %d", b.WireBytes, m*k.wire)
					}
					if b.Overflows != 0 {
						return fmt.Errorf("%d overflows on small gradients", b.Overflows)
					}
					out[rank] = buf
					return nil
				})
				worst := 0.0
				for i := range m {
					var exact, S float64
					for r := range n {
						exact += float64(in[r][i]) / float64(n)
						S += math.Abs(float64(in[r][i])) / float64(n)
					}
					got := out[0][i]
					for r := 1; r < n; r++ {
						if math.Float32bits(out[r][i]) != math.Float32bits(got) {
							t.Fatalf("elem %d: rank %d has %g, rank 0 %g", i, r, out[r][i], got)
						}
					}
					d, b := math.Abs(float64(got)-exact), bound(k, n, S)
					if d > b {
						t.Fatalf("elem %d: got %g, exact %g: error %g > bound %g (S %g)", i, got, exact, d, b, S)
					}
					if S > 0 {
						worst = max(worst, d/b)
					}
				}
				t.Logf("largest error / bound: %.3f", worst)
				// Against the float32 hook: within the sum of both bounds.
				if k.name == "allreduce" {
					fp32[n] = out[0]
				} else if ref := fp32[n]; ref != nil {
					for i := range m {
						var S float64
						for r := range n {
							S += math.Abs(float64(in[r][i])) / float64(n)
						}
						d := math.Abs(float64(out[0][i]) - float64(ref[i]))
						if b := bound(k, n, S) + bound(kinds[0], n, S); d > b {
							t.Fatalf("elem %d: %s %g, float32 hook %g: difference %g > %g", i, k.name, out[0][i], ref[i], d, b)
						}
					}
				}
			})
		}
	}
}

// TestOverflow puts values beyond the wire type's range into gradients:
// an element counts on a rank when its reduced value is Inf or NaN although
// that rank's input was finite.
func TestOverflow(t *testing.T) {
	const m = 64
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			// Per rank: element 3 overflows fp16 in rank 0's conversion;
			// element 6's halves are finite but their sum overflows fp16;
			// element 7 is +Inf in rank 0's input (counted on rank 1 only);
			// element 9 (MaxFloat32 on both) overflows fp16's conversion and
			// bfloat16's sum.
			want := map[string][2]int64{"allreduce": {0, 0}, "avg": {0, 0}, "fp16": {3, 4}, "bf16": {1, 2}}[k.name]
			group(t, 2, k, func(rank int, c comm.Communicator, h Hook, pool *allocator.Pool) error {
				in := make([]float32, m)
				for i := range in {
					in[i] = 1
				}
				if rank == 0 {
					in[3] = 2e5
					in[7] = float32(math.Inf(1))
				}
				in[5] = 65000
				in[6] = 70000
				in[9] = math.MaxFloat32
				buf, b, err := reduceValues(pool, h, in)
				if err != nil {
					return err
				}
				if b.Overflows != want[rank] {
					return fmt.Errorf("rank %d: %d overflows, want %d (result %v)", rank, b.Overflows, want[rank], buf[:10])
				}
				return nil
			})
		})
	}
}

func TestSetupErrors(t *testing.T) {
	cs, err := inproc.NewGroup(2)
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Close()
	defer cs[1].Close()
	pool, err := allocator.New(allocator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, k := range kinds {
		h := k.hook()
		buf := make([]float32, 8)
		b := &Bucket{Index: 4, Buf: comm.Float32s(buf)}
		if _, err := h.Launch(b); !errors.Is(err, ErrNotSetup) {
			t.Errorf("%s: Launch before Setup: %v", k.name, err)
		}
		if err := h.Setup(cs[0], comm.HostKernels()); err != nil {
			t.Fatal(err)
		}
		if err := h.Setup(cs[1], comm.HostKernels()); !errors.Is(err, ErrShared) {
			t.Errorf("%s: Setup with a second communicator: %v", k.name, err)
		}
		if need := h.Scratch(8, comm.Float32); need > 0 {
			b.Scratch = comm.Uint8s(make([]uint8, need-1))
			if _, err := h.Launch(b); !errors.Is(err, ErrScratch) {
				t.Errorf("%s: Launch with %d bytes of scratch for %d: %v", k.name, need-1, need, err)
			}
		}
		b.Buf = comm.Int32s(make([]int32, 4))
		if _, err := h.Launch(b); !errors.Is(err, ErrDType) {
			t.Errorf("%s: Launch of an int32 bucket: %v", k.name, err)
		}
		if k.wire == 2 {
			b.Buf = comm.Float64s(make([]float64, 4))
			if _, err := h.Launch(b); !errors.Is(err, ErrDType) {
				t.Errorf("%s: Launch of a float64 bucket: %v", k.name, err)
			}
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if err := h.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		b.Buf = comm.Float32s(buf)
		if err := h.Finish(b); !errors.Is(err, ErrNotSetup) {
			t.Errorf("%s: Finish after Close: %v", k.name, err)
		}
	}
}

// TestNoAlloc checks that the two phases allocate nothing on the Go heap
// and take nothing from the pool once set up.
func TestNoAlloc(t *testing.T) {
	cs, err := inproc.NewGroup(1)
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Close()
	pool, err := allocator.New(allocator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, k := range kinds {
		h := k.hook()
		if err := h.Setup(cs[0], comm.HostKernels()); err != nil {
			t.Fatal(err)
		}
		blk, err := pool.Get(4000)
		if err != nil {
			t.Fatal(err)
		}
		b, put, err := newBucket(pool, h, blk.Float32s()[:1000])
		if err != nil {
			t.Fatal(err)
		}
		gets := pool.Stats().Gets
		allocs := testing.AllocsPerRun(20, func() {
			if err := reduceOnce(h, b); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Launch+Wait+Finish", k.name, allocs)
		}
		if g := pool.Stats().Gets; g != gets {
			t.Errorf("%s: the phases took %d blocks from the pool", k.name, g-gets)
		}
		put()
		pool.Put(blk)
		h.Close()
	}
}

// TestByName checks that every name maps to a hook of that name (or, for
// the alias "none", to Avg) and that an unknown name lists the known ones.
func TestByName(t *testing.T) {
	for _, n := range Names() {
		h, err := ByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{"none": "avg"}[n]; h.Name() != n && h.Name() != want {
			t.Errorf("ByName(%q).Name() = %q", n, h.Name())
		}
	}
	if _, err := ByName("int8"); !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "fp16") {
		t.Errorf("ByName(int8) = %v", err)
	}
	for _, k := range kinds {
		h := k.hook()
		if got, want := h.Wire(comm.Float32).Size(), k.wire; got != want {
			t.Errorf("%s: wire dtype of %d bytes, want %d", k.name, got, want)
		}
	}
}

// TestAvgMatchesAllReduce checks Avg's documented relation to AllReduce:
// for a group size that is a power of two, and values far from float32's
// subnormals and overflow, the two give the same bits on every rank; for
// other sizes they stay within one rounding of each other per element
// (plus the summation's roundings, bounded by TestAccuracy).
func TestAvgMatchesAllReduce(t *testing.T) {
	const m = 4099
	for n := 1; n <= 4; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 23))
			in := randomGrads(rng, n, m)
			res := map[string][][]float32{}
			for _, k := range kinds[:2] { // allreduce, avg
				out := make([][]float32, n)
				group(t, n, k, func(rank int, c comm.Communicator, h Hook, pool *allocator.Pool) error {
					buf, _, err := reduceValues(pool, h, in[rank])
					out[rank] = buf
					return err
				})
				res[k.name] = out
			}
			for r := range n {
				for i := range m {
					a, b := res["allreduce"][r][i], res["avg"][r][i]
					if n&(n-1) == 0 {
						if math.Float32bits(a) != math.Float32bits(b) {
							t.Fatalf("rank %d elem %d: allreduce %g, avg %g: want the same bits for n=%d", r, i, a, b, n)
						}
						continue
					}
					var S float64
					for q := range n {
						S += math.Abs(float64(in[q][i])) / float64(n)
					}
					if d := math.Abs(float64(a) - float64(b)); d > 2*bound(kinds[0], n, S) {
						t.Fatalf("rank %d elem %d: allreduce %g, avg %g differ by %g", r, i, a, b, d)
					}
				}
			}
		})
	}
}

// TestSharedConcurrentSetup: two ranks setting up one Hook value at the
// same time (a value shared by mistake): exactly one succeeds, the other
// fails with ErrShared, without a data race; Close from both is safe.
func TestSharedConcurrentSetup(t *testing.T) {
	for _, k := range kinds {
		cs, err := inproc.NewGroup(2)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := allocator.New(allocator.Options{})
		if err != nil {
			t.Fatal(err)
		}
		h := k.hook()
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r, c := range cs {
			wg.Go(func() { errs[r] = h.Setup(c, comm.HostKernels()) })
		}
		wg.Wait()
		if (errs[0] == nil) == (errs[1] == nil) {
			t.Fatalf("%s: Setup errors %v, want exactly one", k.name, errs)
		}
		for _, err := range errs {
			if err != nil && !errors.Is(err, ErrShared) {
				t.Fatalf("%s: %v, want ErrShared", k.name, err)
			}
		}
		for range 2 {
			wg.Go(func() {
				if err := h.Close(); err != nil {
					t.Errorf("%s: Close: %v", k.name, err)
				}
			})
		}
		wg.Wait()
		if st := pool.Stats(); st.InUse != 0 {
			t.Errorf("%s: %d bytes in use after Close", k.name, st.InUse)
		}
		pool.Close()
		for _, c := range cs {
			c.Close()
		}
	}
}

// newBucket returns a bucket over buf with the scratch h needs, from pool,
// and a function that returns the scratch.
func newBucket(pool *allocator.Pool, h Hook, buf []float32) (*Bucket, func(), error) {
	b := &Bucket{Buf: comm.Float32s(buf)}
	need := h.Scratch(len(buf), comm.Float32)
	if need == 0 {
		return b, func() {}, nil
	}
	blk, err := pool.Get(need)
	if err != nil {
		return nil, nil, err
	}
	b.Scratch = comm.HostBuffer(blk.Addr(), need, comm.Uint8)
	return b, func() { pool.Put(blk) }, nil
}

// reduceValues reduces a copy of in, in pool memory, through h, and
// returns the result and the bucket.
func reduceValues(pool *allocator.Pool, h Hook, in []float32) ([]float32, *Bucket, error) {
	blk, err := pool.Get(max(4*len(in), 4))
	if err != nil {
		return nil, nil, err
	}
	defer pool.Put(blk)
	buf := blk.Float32s()[:len(in)]
	copy(buf, in)
	b, put, err := newBucket(pool, h, buf)
	if err != nil {
		return nil, nil, err
	}
	defer put()
	if err := reduceOnce(h, b); err != nil {
		return nil, nil, err
	}
	return append([]float32(nil), buf...), b, nil
}

// reduceOnce runs h's two phases on b as the Reducer does: Launch, wait
// for the collective, Finish.
func reduceOnce(h Hook, b *Bucket) error {
	w, err := h.Launch(b)
	if err != nil {
		return err
	}
	if err := w.Wait(context.Background()); err != nil {
		return err
	}
	return h.Finish(b)
}

// TestDTypes reduces float64, float16 and bfloat16 buckets with every hook
// and checks the per-dtype behaviour the package documents: the plain
// hooks reduce every floating-point dtype in its own precision (float64
// through comm.Avg, never a float32 factor), FP16 and BF16 reduce a half
// bucket in its own dtype and refuse float64. Each element is checked
// against the exact average of the inputs as the dtype holds them.
func TestDTypes(t *testing.T) {
	const m = 1031
	type dtCase struct {
		dt     comm.DType
		u, eta float64 // of dt
	}
	dts := []dtCase{{comm.Float64, 0x1p-53, 0}, {comm.Float16, 0x1p-11, 0x1p-25}, {comm.BFloat16, 0x1p-8, 0x1p-134}}
	for _, k := range kinds {
		for _, d := range dts {
			for _, n := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/%s/n=%d", k.name, d.dt, n), func(t *testing.T) {
					h := k.hook()
					refused := k.wire == 2 && d.dt == comm.Float64
					if got := h.Wire(d.dt); refused && got != 0 || !refused && got != d.dt {
						t.Fatalf("Wire(%s) = %v, refused %v", d.dt, got, refused)
					}
					if refused {
						return
					}
					rng := rand.New(rand.NewPCG(uint64(n), uint64(d.dt)))
					in := randomGrads(rng, n, m)
					exact := make([]float64, m) // inputs as dt holds them
					S := make([]float64, m)
					for i := range m {
						sum := new(big.Float).SetPrec(256)
						for r := range n {
							v := holdAs(d.dt, in[r][i])
							sum.Add(sum, big.NewFloat(v))
							S[i] += math.Abs(v) / float64(n)
						}
						exact[i], _ = sum.Quo(sum, big.NewFloat(float64(n))).Float64()
					}
					out := make([][]float64, n)
					group(t, n, k, func(rank int, c comm.Communicator, h Hook, pool *allocator.Pool) error {
						if got := h.Scratch(m, d.dt); got != 0 {
							return fmt.Errorf("Scratch(%d, %s) = %d, want 0", m, d.dt, got)
						}
						blk, err := pool.Get(m * d.dt.Size())
						if err != nil {
							return err
						}
						defer pool.Put(blk)
						buf := comm.HostBuffer(blk.Addr(), m, d.dt)
						for i := range m {
							store(buf, i, in[rank][i])
						}
						b := &Bucket{Index: 2, Buf: buf}
						if err := reduceOnce(h, b); err != nil {
							return err
						}
						if b.WireBytes != int64(m*d.dt.Size()) || b.Overflows != 0 {
							return fmt.Errorf("WireBytes %d (want %d), Overflows %d", b.WireBytes, m*d.dt.Size(), b.Overflows)
						}
						out[rank] = make([]float64, m)
						for i := range m {
							out[rank][i] = load(buf, i)
						}
						return nil
					})
					for i := range m {
						for r := 1; r < n; r++ {
							if out[r][i] != out[0][i] {
								t.Fatalf("elem %d: rank %d has %g, rank 0 %g", i, r, out[r][i], out[0][i])
							}
						}
						a := d.u + 2*0x1p-24 // 1/N and the product rounded in float32
						if d.dt == comm.Float64 {
							a = d.u // Avg: one division in float64
						}
						gamma := float64(n-1) * d.u / (1 - float64(n-1)*d.u)
						bound := (a+gamma*(1+a))*S[i] + 2*float64(n)*d.eta
						// exact[i] is the exact average rounded to float64: allow that
						// rounding too.
						bound += math.Abs(exact[i]) * 0x1p-53
						if diff := math.Abs(out[0][i] - exact[i]); diff > bound {
							t.Fatalf("elem %d: got %g, exact %g: error %g > bound %g", i, out[0][i], exact[i], diff, bound)
						}
					}
				})
			}
		}
	}
}

// holdAs returns v as a bucket of dtype dt holds it.
func holdAs(dt comm.DType, v float32) float64 {
	switch dt {
	case comm.Float16:
		return float64(fp16.ToFloat32(fp16.FromFloat32(v)))
	case comm.BFloat16:
		return float64(fp16.BFloat16ToFloat32Scalar(fp16.BFloat16FromFloat32(v)))
	}
	return float64(v) * (1 + 0x1p-30) // a float64 value float32 cannot hold
}

func store(b comm.Buffer, i int, v float32) {
	switch b.DType {
	case comm.Float16:
		b.AsUint16()[i] = fp16.FromFloat32(v)
	case comm.BFloat16:
		b.AsUint16()[i] = fp16.BFloat16FromFloat32(v)
	default:
		b.AsFloat64()[i] = holdAs(comm.Float64, v)
	}
}

func load(b comm.Buffer, i int) float64 {
	switch b.DType {
	case comm.Float16:
		return float64(fp16.ToFloat32(b.AsUint16()[i]))
	case comm.BFloat16:
		return float64(fp16.BFloat16ToFloat32Scalar(b.AsUint16()[i]))
	}
	return b.AsFloat64()[i]
}

// TestScatterMatchesAllReduce reduces the same float32 gradients with
// each hook twice, all-reduced and reduce-scattered (Bucket.Scatter), on
// 1-4 ranks: each rank's part of the scattered bucket must hold the bits
// the all-reduce leaves there, with the overflow count of that part
// (some values overflow fp16 after scaling).
func TestScatterMatchesAllReduce(t *testing.T) {
	const per = 1031
	for n := 1; n <= 4; n++ {
		for _, k := range kinds {
			t.Run(fmt.Sprintf("n=%d/%s", n, k.name), func(t *testing.T) {
				if _, ok := k.hook().(Scatterer); !ok {
					t.Fatalf("%s is not a Scatterer", k.name)
				}
				rng := rand.New(rand.NewPCG(uint64(n), 29))
				in := randomGrads(rng, n, n*per)
				for r := range n {
					in[r][7] = 1e5 * float32(r+1) // beyond fp16 once scaled
				}
				group(t, n, k, func(rank int, c comm.Communicator, h Hook, pool *allocator.Pool) error {
					all, ab, err := reduceValues(pool, h, in[rank])
					if err != nil {
						return err
					}
					blk, err := pool.Get(4 * n * per)
					if err != nil {
						return err
					}
					defer pool.Put(blk)
					buf := blk.Float32s()[:n*per]
					copy(buf, in[rank])
					b, put, err := newBucket(pool, h, buf)
					if err != nil {
						return err
					}
					defer put()
					b.Scatter = true
					if err := reduceOnce(h, b); err != nil {
						return err
					}
					if got := b.Part(rank, n); got.Count != per || got.Addr != comm.Float32s(buf[rank*per:]).Addr {
						return fmt.Errorf("Part(%d, %d) is %d elements at the wrong place", rank, n, got.Count)
					}
					for j := rank * per; j < (rank+1)*per; j++ {
						if math.Float32bits(buf[j]) != math.Float32bits(all[j]) {
							return fmt.Errorf("element %d: scattered %g, all-reduced %g", j, buf[j], all[j])
						}
					}
					if k.name == "fp16" && ab.Overflows == 0 {
						return fmt.Errorf("no overflow in the all-reduce: the count is not tested")
					}
					want := int64(0)
					if k.name == "fp16" && rank == 0 {
						want = ab.Overflows // element 7 is in rank 0's part
					}
					if b.Overflows != want {
						return fmt.Errorf("%d overflows in rank %d's part, want %d (all-reduce: %d)", b.Overflows, rank, want, ab.Overflows)
					}
					return nil
				})
			})
		}
	}
}
