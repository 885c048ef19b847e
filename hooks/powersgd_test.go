package hooks

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// psgdBucket is one rank's bucket of tensors in pool memory, with the
// scratch the hook asks for.
type psgdBucket struct {
	b     *Bucket
	g     []float32
	puts  []allocator.Block
	shape [][]int
}

func newPSGDBucket(pool *allocator.Pool, h Hook, index int, shapes [][]int) (*psgdBucket, error) {
	pb := &psgdBucket{shape: shapes}
	var ts []Tensor
	off := 0
	for p, s := range shapes {
		n := 1
		for _, d := range s {
			n *= d
		}
		ts = append(ts, Tensor{Param: p, Offset: off, Shape: s})
		off += n
	}
	blk, err := pool.Get(4 * max(off, 1))
	if err != nil {
		return nil, err
	}
	pb.puts = append(pb.puts, blk)
	pb.g = blk.Float32s()[:off]
	pb.b = &Bucket{Index: index, Buf: comm.Float32s(pb.g), Tensors: ts}
	pb.b.Buf = comm.HostBuffer(blk.Addr(), off, comm.Float32)
	if need := ScratchFor(h, pb.b); need > 0 {
		s, err := pool.Get(need)
		if err != nil {
			return nil, err
		}
		pb.puts = append(pb.puts, s)
		pb.b.Scratch = comm.HostBuffer(s.Addr(), need, comm.Uint8)
	}
	return pb, nil
}

func (pb *psgdBucket) free(pool *allocator.Pool) {
	for _, b := range pb.puts {
		pool.Put(b)
	}
}

// psgdGroup runs f on every rank of an n-rank in-process group, each with
// its own pool and a PowerSGD hook of options opts(rank), and returns every
// rank's error (runGroup).
func psgdGroup(t *testing.T, n int, opts func(rank int) PowerSGDOptions, f func(rank int, h *PowerSGDHook, pool *allocator.Pool) error) []error {
	t.Helper()
	return runGroup(t, n, func(r int, pool *allocator.Pool) Hook {
		o := opts(r)
		o.Pool = pool
		return PowerSGD(o)
	}, func(r int, _ comm.Communicator, h Hook, pool *allocator.Pool) error {
		return f(r, h.(*PowerSGDHook), pool)
	})
}

func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// lowRankish returns an n×m matrix with singular values decaying as
// 1/(k+1)^2, plus a little noise: gradients of real layers look so.
func lowRankish(rng *rand.Rand, n, m int) []float32 {
	out := make([]float32, n*m)
	for k := range min(n, m) {
		s := 1 / float64((k+1)*(k+1))
		u := make([]float64, n)
		v := make([]float64, m)
		for i := range u {
			u[i] = rng.NormFloat64()
		}
		for j := range v {
			v[j] = rng.NormFloat64()
		}
		for i := range n {
			for j := range m {
				out[i*m+j] += float32(s * u[i] * v[j])
			}
		}
	}
	for i := range out {
		out[i] += float32(0.001 * rng.NormFloat64())
	}
	return out
}

// psgdOptions returns PyTorch's defaults with compression from step 0 and
// the given rank.
func psgdOptions(rank int) PowerSGDOptions {
	o := DefaultPowerSGDOptions()
	o.StartIter, o.Rank = 0, rank
	return o
}

// relErr returns |got - want| / |want| in the Frobenius norm.
func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

// TestPowerSGDErrorDecreasesWithRank compresses the same gradients of two
// ranks at increasing ranks, one step from a random start: the error of
// the approximation of their average must decrease with the rank, and
// vanish at full rank.
func TestPowerSGDErrorDecreasesWithRank(t *testing.T) {
	const rows, cols = 48, 64
	rng := rand.New(rand.NewPCG(3, 4))
	g := [][]float32{lowRankish(rng, rows, cols), lowRankish(rng, rows, cols)}
	avg := make([]float64, rows*cols)
	for i := range avg {
		avg[i] = (float64(g[0][i]) + float64(g[1][i])) / 2
	}
	prev := math.Inf(1)
	for _, rank := range []int{1, 2, 4, 8, 16, rows} {
		out := make([][]float32, 2)
		noErrors(t, psgdGroup(t, 2, func(int) PowerSGDOptions {
			o := psgdOptions(rank)
			o.ErrorFeedback, o.WarmStart, o.MinCompressionRate = false, false, 0
			return o
		}, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
			pb, err := newPSGDBucket(pool, h, 0, [][]int{{rows, cols}})
			if err != nil {
				return err
			}
			defer pb.free(pool)
			copy(pb.g, g[r])
			if err := reduceOnce(h, pb.b); err != nil {
				return err
			}
			if want := int64(4 * (rows + cols) * rank); pb.b.WireBytes != want {
				return fmt.Errorf("WireBytes %d, want %d", pb.b.WireBytes, want)
			}
			out[r] = append([]float32(nil), pb.g...)
			return nil
		}))
		e := relErr(out[0], avg)
		t.Logf("rank %2d: relative error %.3g", rank, e)
		if !(e < prev) {
			t.Errorf("rank %d: relative error %.3g, not below rank's before (%.3g)", rank, e, prev)
		}
		if rank == rows && e > 1e-3 {
			t.Errorf("full rank %d: relative error %.3g, want the average itself", rank, e)
		}
		prev = e
	}
}

// TestPowerSGDErrorFeedback reduces fresh gradients of two ranks for many
// steps at rank 1: with error feedback, the sum of the approximations must
// differ from the sum of the true averages by exactly the average of the
// ranks' last errors (up to rounding), and so stay bounded while the sums
// grow; without it, the gap grows with the steps.
func TestPowerSGDErrorFeedback(t *testing.T) {
	const rows, cols, steps = 24, 32, 400
	gaps := map[bool]float64{}
	for _, ef := range []bool{true, false} {
		sumApprox := make([][]float64, 2)
		sumTrue := make([]float64, rows*cols)
		var lastErr [2][]float32
		var mu sync.Mutex
		grads := make([][][]float32, steps) // [step][rank]
		rng := rand.New(rand.NewPCG(5, 6))
		base := lowRankish(rng, rows, cols)
		for s := range grads {
			grads[s] = make([][]float32, 2)
			for r := range 2 {
				g := lowRankish(rng, rows, cols)
				for i := range g {
					g[i] += base[i]
				}
				grads[s][r] = g
				for i := range g {
					sumTrue[i] += float64(g[i]) / 2
				}
			}
		}
		noErrors(t, psgdGroup(t, 2, func(int) PowerSGDOptions {
			o := psgdOptions(1)
			o.ErrorFeedback = ef
			return o
		}, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
			pb, err := newPSGDBucket(pool, h, 0, [][]int{{rows, cols}})
			if err != nil {
				return err
			}
			defer pb.free(pool)
			sum := make([]float64, rows*cols)
			for s := range steps {
				copy(pb.g, grads[s][r])
				if err := reduceOnce(h, pb.b); err != nil {
					return err
				}
				for i, v := range pb.g {
					sum[i] += float64(v)
				}
			}
			mu.Lock()
			sumApprox[r] = sum
			if ef {
				lastErr[r] = append([]float32(nil), h.params[0].err...)
			}
			mu.Unlock()
			return nil
		}))
		for i := range sumTrue {
			if sumApprox[0][i] != sumApprox[1][i] {
				t.Fatalf("error feedback %v: ranks' sums differ at %d", ef, i)
			}
		}
		gap := make([]float32, rows*cols)
		for i := range gap {
			gap[i] = float32(sumApprox[0][i] - sumTrue[i])
		}
		var g2, t2 float64
		for i := range gap {
			g2 += float64(gap[i]) * float64(gap[i])
			t2 += sumTrue[i] * sumTrue[i]
		}
		gaps[ef] = math.Sqrt(g2 / t2)
		t.Logf("error feedback %v: |sum of approximations - sum of averages| / |sum of averages| = %.3g after %d steps", ef, gaps[ef], steps)
		if ef {
			// The sums telescope: sum_t approx_t = sum_t avg_t - avg_r e_T.
			want := make([]float64, rows*cols)
			for i := range want {
				want[i] = -(float64(lastErr[0][i]) + float64(lastErr[1][i])) / 2
			}
			if e := relErr(gap, want); e > 1e-3 {
				t.Errorf("the gap is not minus the average of the last errors: relative difference %.3g", e)
			}
		}
	}
	if gaps[true] > 0.02 || gaps[false] < 10*gaps[true] {
		t.Errorf("relative gap %.3g with error feedback (want < 0.02), %.3g without (want 10 times more)", gaps[true], gaps[false])
	}
}

// TestPowerSGDRanksAgree reduces a bucket of convolution, linear and 1-D
// gradients over three ranks for several steps (two uncompressed, then
// compressed, with error feedback and warm start): every rank must hold
// the same bits after every step.
func TestPowerSGDRanksAgree(t *testing.T) {
	const n, steps = 3, 6
	shapes := [][]int{{16, 8, 3, 3}, {16}, {10, 144}, {10}}
	out := make([][][]float32, n) // [rank][step]
	noErrors(t, psgdGroup(t, n, func(int) PowerSGDOptions {
		o := psgdOptions(2)
		o.StartIter, o.OrthogonalizationEpsilon = 2, 1e-8
		return o
	}, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
		pb, err := newPSGDBucket(pool, h, 0, shapes)
		if err != nil {
			return err
		}
		defer pb.free(pool)
		rng := rand.New(rand.NewPCG(uint64(r), 9))
		for s := range steps {
			for i := range pb.g {
				pb.g[i] = float32(rng.NormFloat64())
			}
			if err := reduceOnce(h, pb.b); err != nil {
				return err
			}
			out[r] = append(out[r], append([]float32(nil), pb.g...))
			full := int64(4 * len(pb.g))
			if compressed := pb.b.WireBytes < full; compressed != (s >= 2) {
				return fmt.Errorf("step %d: %d bytes on the wire of %d", s, pb.b.WireBytes, full)
			}
		}
		return nil
	}))
	for s := range steps {
		for r := 1; r < n; r++ {
			for i, v := range out[r][s] {
				if math.Float32bits(v) != math.Float32bits(out[0][s][i]) {
					t.Fatalf("step %d elem %d: rank %d has %g, rank 0 %g", s, i, r, v, out[0][s][i])
				}
			}
		}
	}
}

// TestPowerSGDMinCompressionRate puts a 16×16 matrix and a vector in a
// bucket at rank 4: (16+16)·4·2 = 256 is not below 256 elements, so at
// rate 2 the matrix travels uncompressed and is averaged exactly; at rate
// 1.9 it travels as P and Q. A vector never is compressed, even at rate 0.
func TestPowerSGDMinCompressionRate(t *testing.T) {
	for _, tc := range []struct {
		rate       float64
		compressed bool
	}{{2, false}, {1.9, true}, {0, true}} {
		t.Run(fmt.Sprint(tc.rate), func(t *testing.T) {
			noErrors(t, psgdGroup(t, 2, func(int) PowerSGDOptions {
				o := psgdOptions(4)
				o.MinCompressionRate = tc.rate
				return o
			}, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
				pb, err := newPSGDBucket(pool, h, 0, [][]int{{16, 16}, {40}})
				if err != nil {
					return err
				}
				defer pb.free(pool)
				for i := range pb.g {
					pb.g[i] = float32(i%7) + float32(r)
				}
				if err := reduceOnce(h, pb.b); err != nil {
					return err
				}
				wire, want := pb.b.WireBytes, int64(4*(256+40))
				if tc.compressed {
					want = 4 * (40 + 16*4 + 16*4)
				}
				if wire != want {
					return fmt.Errorf("%d bytes on the wire, want %d", wire, want)
				}
				before, after := h.Compression()
				if tc.compressed && (before != 296 || after != want/4) {
					return fmt.Errorf("Compression() = %d, %d; want 296, %d", before, after, want/4)
				}
				for i, v := range pb.g {
					exact := float32(i%7) + 0.5
					if i >= 256 || !tc.compressed {
						if v != exact {
							return fmt.Errorf("elem %d: %g, want the exact average %g", i, v, exact)
						}
					}
				}
				return nil
			}))
		})
	}
}

// TestPowerSGDMismatch sets up ranks with options that differ: every rank
// fails its first step with ErrMismatch, naming rank 1 and both settings,
// rather than reducing buffers of different sizes.
func TestPowerSGDMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*PowerSGDOptions)
		want string
	}{
		{"rank", func(o *PowerSGDOptions) { o.Rank = 2 }, "matrix_approximation_rank=2"},
		{"start", func(o *PowerSGDOptions) { o.StartIter = 5 }, "start_powerSGD_iter=5"},
		{"seed", func(o *PowerSGDOptions) { o.Seed = 7 }, "random_seed=7"},
		{"feedback", func(o *PowerSGDOptions) { o.ErrorFeedback = false }, "use_error_feedback=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := psgdGroup(t, 3, func(r int) PowerSGDOptions {
				o := psgdOptions(4)
				if r == 1 {
					tc.edit(&o)
				}
				return o
			}, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
				pb, err := newPSGDBucket(pool, h, 0, [][]int{{32, 32}})
				if err != nil {
					return err
				}
				defer pb.free(pool)
				return reduceOnce(h, pb.b)
			})
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "rank 1 has") || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: %v, want ErrMismatch naming rank 1's %s", r, err, tc.want)
				}
			}
		})
	}
}

// deviceKernels claims device memory.
type deviceKernels struct{ comm.Kernels }

func (deviceKernels) Location() comm.Location { return comm.Device }

// TestPowerSGDSetupErrors: options out of range, device memory, no pool.
func TestPowerSGDSetupErrors(t *testing.T) {
	cs, err := inproc.NewGroup(1)
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Close()
	for _, edit := range []func(*PowerSGDOptions){
		func(o *PowerSGDOptions) { o.Rank = 0 },
		func(o *PowerSGDOptions) { o.StartIter = -1 },
		func(o *PowerSGDOptions) { o.MinCompressionRate = math.NaN() },
		func(o *PowerSGDOptions) { o.OrthogonalizationEpsilon = -1 },
	} {
		o := psgdOptions(1)
		edit(&o)
		if err := PowerSGD(o).Setup(cs[0], comm.HostKernels()); !errors.Is(err, ErrBadOptions) {
			t.Errorf("Setup with %v: %v, want ErrBadOptions", o, err)
		}
	}
	h := PowerSGD(psgdOptions(1))
	if err := h.Setup(cs[0], deviceKernels{comm.HostKernels()}); err == nil || !strings.Contains(err.Error(), "device") {
		t.Errorf("Setup on device memory: %v, want a refusal naming device memory", err)
	}
	if h.Wire(comm.Float64) != 0 || h.Wire(comm.Float16) != 0 || h.Wire(comm.Float32) != comm.Float32 {
		t.Errorf("Wire: want float32 buckets only")
	}
	h = PowerSGD(psgdOptions(1)) // no pool
	if err := h.Setup(cs[0], comm.HostKernels()); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	g := make([]float32, 64)
	b := &Bucket{Buf: comm.Float32s(g), Tensors: []Tensor{{Shape: []int{8, 8}}}}
	if _, err := h.Launch(b); err == nil {
		w, _ := h.Launch(b)
		err = w.Wait(context.Background())
		t.Errorf("Launch without scratch: %v", err)
	}
	b.Scratch = comm.Uint8s(make([]uint8, ScratchFor(h, b)))
	if err := reduceOnce(h, b); !errors.Is(err, ErrNoPool) {
		t.Errorf("a step without a pool: %v, want ErrNoPool", err)
	}
}

// TestPowerSGDNoAlloc: once warm, a compressed step allocates nothing on
// the Go heap and takes nothing from the pool.
func TestPowerSGDNoAlloc(t *testing.T) {
	noErrors(t, psgdGroup(t, 1, func(int) PowerSGDOptions { return psgdOptions(4) }, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
		pb, err := newPSGDBucket(pool, h, 0, [][]int{{64, 32, 3, 3}, {64}, {10, 64}})
		if err != nil {
			return err
		}
		defer pb.free(pool)
		for range 2 {
			if err := reduceOnce(h, pb.b); err != nil {
				return err
			}
		}
		gets := pool.Stats().Gets
		if a := testing.AllocsPerRun(20, func() {
			if err := reduceOnce(h, pb.b); err != nil {
				panic(err)
			}
		}); a != 0 {
			return fmt.Errorf("%v allocations per step", a)
		}
		if g := pool.Stats().Gets; g != gets {
			return fmt.Errorf("a warm step took %d blocks from the pool", g-gets)
		}
		return nil
	}))
}

// TestPowerSGDNonfinite puts one NaN, or one +Inf, in one element of one
// rank's gradient for one step (in a compressed matrix, or in a vector
// that travels beside it), with PyTorch's defaults (error feedback and
// warm start on; compression from step 0), over three ranks. That step's
// average must be non-finite on every rank, so that a loss scaler sees it;
// the hook's state (every rank's errors and Qs) must come out of it as it
// went in, and be counted; the steps after it must be the same bits on
// every rank, and the same bits as a run that never had the bad step.
func TestPowerSGDNonfinite(t *testing.T) {
	const n, steps, bad, badRank = 3, 6, 3, 1
	shapes := [][]int{{16, 24}, {16}, {8, 40}}
	grads := make([][][]float32, steps) // [step][rank]
	rng := rand.New(rand.NewPCG(11, 12))
	for s := range grads {
		for range n {
			var g []float32
			for _, sh := range shapes {
				if len(sh) == 2 {
					g = append(g, lowRankish(rng, sh[0], sh[1])...)
				} else {
					g = append(g, lowRankish(rng, 1, sh[0])...)
				}
			}
			grads[s] = append(grads[s], g)
		}
	}
	// run reduces steps (the step numbers of grads) and returns every
	// rank's averages [rank][step] and each rank's state around the bad
	// step (before, after), and the hook's count of non-finite matrices.
	type state struct{ err, q []float32 }
	run := func(at int, poison float32, steps []int) (out [][][]float32, around [][2][]state, counts []int64) {
		out = make([][][]float32, n)
		around = make([][2][]state, n)
		counts = make([]int64, n)
		noErrors(t, psgdGroup(t, n, func(int) PowerSGDOptions {
			o := DefaultPowerSGDOptions()
			o.StartIter = 0
			return o
		}, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
			pb, err := newPSGDBucket(pool, h, 0, shapes)
			if err != nil {
				return err
			}
			defer pb.free(pool)
			snapshot := func() []state {
				var ss []state
				for _, st := range h.params {
					if st != nil {
						ss = append(ss, state{slices.Clone(st.err), slices.Clone(st.q)})
					}
				}
				return ss
			}
			for _, s := range steps {
				copy(pb.g, grads[s][r])
				if s == bad {
					around[r][0] = snapshot()
					if r == badRank {
						pb.g[at] = poison
					}
				}
				if err := reduceOnce(h, pb.b); err != nil {
					return err
				}
				if s == bad {
					around[r][1] = snapshot()
				}
				out[r] = append(out[r], slices.Clone(pb.g))
			}
			counts[r] = h.NonFinite()
			return nil
		}))
		return out, around, counts
	}
	all := []int{0, 1, 2, 3, 4, 5}
	without := []int{0, 1, 2, 4, 5}
	clean, _, _ := run(0, 0, without)
	for _, tc := range []struct {
		name   string
		at     int
		poison float32
	}{
		{"NaN", 7, float32(math.NaN())},
		{"Inf", 16*24 - 1, float32(math.Inf(1))},
		{"NaN in a vector", 16*24 + 3, float32(math.NaN())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			poison := tc.poison
			out, around, counts := run(tc.at, poison, all)
			for r := range n {
				if finite32(out[r][bad]) {
					t.Errorf("rank %d: the step with %v in it has a finite average", r, poison)
				}
				if counts[r] != 1 {
					t.Errorf("rank %d: NonFinite() = %d, want 1", r, counts[r])
				}
				before, after := around[r][0], around[r][1]
				if len(before) != 2 || len(after) != 2 {
					t.Fatalf("rank %d: %d matrices' states before the bad step, %d after; want 2", r, len(before), len(after))
				}
				for k := range before {
					if !slices.Equal(bitsOf(before[k].err), bitsOf(after[k].err)) || !slices.Equal(bitsOf(before[k].q), bitsOf(after[k].q)) {
						t.Errorf("rank %d: matrix %d's state changed in the step with %v", r, k, poison)
					}
				}
				for i, s := range all {
					if s == bad {
						continue
					}
					j := slices.Index(without, s)
					for r0 := range n {
						if !slices.Equal(bitsOf(out[r][i]), bitsOf(out[r0][i])) {
							t.Fatalf("step %d: ranks %d and %d differ", s, r, r0)
						}
					}
					if !slices.Equal(bitsOf(out[r][i]), bitsOf(clean[r][j])) {
						t.Fatalf("rank %d, step %d: the average differs from a run without the bad step", r, s)
					}
				}
			}
		})
	}
}

// TestPowerSGDErrorOverflow makes one rank's new error overflow in a
// step whose reduced values, and so whose average, are finite: rank 0's
// gradient is +3e38 where the rank-1 average P·Qᵀ is -0.8e38. Two ranks,
// a 4×8 matrix, rank 1, error feedback and warm start. Step 0, the same
// on both ranks (rows 0 and 1 of column 1 are 1), makes the warm Q
// column 1 and leaves errors of a rounding; in step 1, column 1 makes P
// (1, 1, 0, 0)/√2 and column 0 carries the large values. That error
// element must be zeroed (ErrorResets counts it on rank 0 only), not kept
// as +Inf, which would make every later step's P, and so its average,
// non-finite; the later steps must be finite and the same bits on both
// ranks.
func TestPowerSGDErrorOverflow(t *testing.T) {
	const n, rows, cols, clean = 2, 4, 8, 4
	const x, y, s = 3e38, 1.6e38, 1e37
	at := func(g []float32, i, j int) *float32 { return &g[i*cols+j] }
	out := make([][][]float32, n) // [rank][step]
	resets := make([]int64, n)
	noErrors(t, psgdGroup(t, n, func(int) PowerSGDOptions { return psgdOptions(1) }, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
		pb, err := newPSGDBucket(pool, h, 0, [][]int{{rows, cols}})
		if err != nil {
			return err
		}
		defer pb.free(pool)
		rng := rand.New(rand.NewPCG(5, 6)) // the same gradients on both ranks after step 1
		for step := range 2 + clean {
			clear(pb.g)
			switch step {
			case 0:
				*at(pb.g, 0, 1), *at(pb.g, 1, 1) = 1, 1
			case 1:
				*at(pb.g, 0, 1), *at(pb.g, 1, 1) = s, s
				*at(pb.g, 0, 0), *at(pb.g, 1, 0) = x, -y
				if r == 1 {
					*at(pb.g, 0, 0) = -x
				}
			default:
				for i := range pb.g {
					pb.g[i] = float32(rng.NormFloat64())
				}
			}
			if err := reduceOnce(h, pb.b); err != nil {
				return err
			}
			out[r] = append(out[r], slices.Clone(pb.g))
		}
		resets[r] = h.ErrorResets()
		return nil
	}))
	if resets[0] != 1 || resets[1] != 0 {
		t.Errorf("ErrorResets() = %d on rank 0, %d on rank 1; want 1 and 0", resets[0], resets[1])
	}
	for step := 1; step < 2+clean; step++ {
		for r := range n {
			if !finite32(out[r][step]) {
				t.Fatalf("rank %d, step %d: the average is not finite: %v", r, step, out[r][step])
			}
		}
		if !slices.Equal(bitsOf(out[0][step]), bitsOf(out[1][step])) {
			t.Fatalf("step %d: ranks 0 and 1 differ", step)
		}
	}
}

func bitsOf(x []float32) []uint32 {
	b := make([]uint32, len(x))
	for i, v := range x {
		b[i] = math.Float32bits(v)
	}
	return b
}

// TestPowerSGDGolden pins the bits of 8 steps over 3 ranks (two
// uncompressed, then compressed with error feedback and warm start) at
// ranks 1, 2 and 4: every rank's averages, errors and Qs after every step,
// by CRC-32. The kernels are deterministic whatever the CPU (the assembly
// gives the pure-Go kernels' bits), so the sums do not depend on the
// machine or on the purego tag; a change of them is a change of the
// arithmetic, which must be deliberate. The sums were recorded before the
// hook kept its state out of non-finite steps, which did not change the
// bits of finite ones, and have not changed since.
func TestPowerSGDGolden(t *testing.T) {
	const n, steps = 3, 8
	// A convolution (16×72), a matrix of a multiple of 8 columns, one of
	// more than 512 columns and not a multiple of 8, and a vector.
	shapes := [][]int{{16, 8, 3, 3}, {24, 40}, {10, 531}, {16}}
	for _, tc := range []struct {
		rank int
		want uint32
	}{
		{1, 0x5443df60},
		{2, 0x769c5344},
		{4, 0x3f8bab39},
	} {
		t.Run(fmt.Sprintf("r%d", tc.rank), func(t *testing.T) {
			sums := make([]uint32, n)
			noErrors(t, psgdGroup(t, n, func(int) PowerSGDOptions {
				o := psgdOptions(tc.rank)
				o.StartIter = 2
				return o
			}, func(r int, h *PowerSGDHook, pool *allocator.Pool) error {
				pb, err := newPSGDBucket(pool, h, 0, shapes)
				if err != nil {
					return err
				}
				defer pb.free(pool)
				rng := rand.New(rand.NewPCG(uint64(r), 31))
				crc := crc32.NewIEEE()
				put := func(x []float32) {
					for _, v := range x {
						binary.Write(crc, binary.LittleEndian, math.Float32bits(v))
					}
				}
				for range steps {
					for i := range pb.g {
						pb.g[i] = float32(rng.NormFloat64())
					}
					if err := reduceOnce(h, pb.b); err != nil {
						return err
					}
					put(pb.g)
					for _, st := range h.params {
						if st != nil {
							put(st.err)
							put(st.q)
						}
					}
				}
				sums[r] = crc.Sum32()
				return nil
			}))
			all := crc32.NewIEEE()
			for _, s := range sums {
				binary.Write(all, binary.LittleEndian, s)
			}
			if got := all.Sum32(); got != tc.want {
				t.Errorf("CRC-32 of the averages, errors and Qs = %#08x, want %#08x", got, tc.want)
			}
		})
	}
}
