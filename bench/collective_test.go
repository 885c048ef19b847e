package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/inproc"
)

func group(t testing.TB, n int) []comm.Communicator {
	t.Helper()
	g, err := inproc.NewGroupWith(n, inproc.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]comm.Communicator, n)
	for i, c := range g {
		out[i] = c
	}
	t.Cleanup(func() {
		for _, c := range out {
			c.Close()
		}
	})
	return out
}

func small(op Collective, dt comm.DType, red comm.Op) CollectiveConfig {
	return CollectiveConfig{Op: op, DType: dt, RedOp: red, MinBytes: 96, MaxBytes: 6144, Factor: 8, Iters: 2, Warmup: 1, Check: true, Timeout: 20 * time.Second}
}

// TestCollectiveCorrect runs every collective, dtype and reduction over a
// few sizes with checking on: the backend must produce no wrong element,
// in place and out of place.
func TestCollectiveCorrect(t *testing.T) {
	for _, n := range []int{2, 3} {
		g := group(t, n)
		for _, op := range Collectives {
			for _, dt := range comm.DTypes {
				reds := []comm.Op{comm.Sum}
				if op.Reduces() {
					reds = comm.Ops
				}
				for _, red := range reds {
					cfg := small(op, dt, red)
					if op.Rooted() {
						cfg.Root = n - 1
					}
					rows, err := RunCollective(context.Background(), g, cfg, nil)
					if err != nil {
						t.Fatalf("%d ranks %s %s %s: %v", n, op, dt, red, err)
					}
					if len(rows) != 3 {
						t.Fatalf("%s: %d rows, want 3 (96, 768, 6144 bytes)", op, len(rows))
					}
					for _, r := range rows {
						if w := r.OutOfPlace.Wrong + r.InPlace.Wrong; w != 0 {
							t.Errorf("%d ranks %s %s %s %d bytes: %d wrong", n, op, dt, red, r.Bytes, w)
						}
						if !r.OutOfPlace.Valid || r.InPlace.Valid == (op == SendRecv) {
							t.Errorf("%s: placements %v %v", op, r.OutOfPlace.Valid, r.InPlace.Valid)
						}
						if r.OutOfPlace.Time <= 0 || r.OutOfPlace.BusBW <= 0 {
							t.Errorf("%s: no time measured: %+v", op, r.OutOfPlace)
						}
					}
				}
			}
		}
	}
}

// TestCollectiveCountsWrong damages results through the test hook and
// checks that exactly the damaged elements are counted.
func TestCollectiveCountsWrong(t *testing.T) {
	g := group(t, 2)
	for _, op := range Collectives {
		t.Run(op.String(), func(t *testing.T) {
			const damaged = 5
			corruptHook = func(rank int, inPlace bool, out comm.Buffer) {
				if rank != 1 || !inPlace && op != SendRecv || out.Count == 0 {
					return
				}
				b := out.AsBytes()
				for i := range damaged {
					// 0x7f in the top byte turns any element into a value
					// the pattern never produces (a NaN, huge, or 127+).
					b[(i*2+1)*out.DType.Size()-1] ^= 0x7f
				}
			}
			defer func() { corruptHook = nil }()
			cfg := small(op, comm.Float32, comm.Sum)
			cfg.Root = 1
			rows, err := RunCollective(context.Background(), g, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				got := r.InPlace.Wrong
				if op == SendRecv {
					got = r.OutOfPlace.Wrong
				} else if r.OutOfPlace.Wrong != 0 {
					t.Errorf("%d bytes: %d wrong out of place, want 0", r.Bytes, r.OutOfPlace.Wrong)
				}
				if got != damaged {
					t.Errorf("%d bytes: counted %d wrong, want %d", r.Bytes, got, damaged)
				}
			}
			if WrongTotal(rows) != damaged*int64(len(rows)) {
				t.Errorf("WrongTotal %d", WrongTotal(rows))
			}
			if WrongTests(rows) != len(rows) {
				t.Errorf("WrongTests %d, want %d (one damaged placement per size)", WrongTests(rows), len(rows))
			}
		})
	}
}

func TestCollectiveConfigErrors(t *testing.T) {
	g := group(t, 2)
	base := small(AllReduce, comm.Float32, comm.Sum)
	tests := []struct {
		name   string
		mutate func(*CollectiveConfig)
	}{
		{"no op", func(c *CollectiveConfig) { c.Op = 0 }},
		{"bad dtype", func(c *CollectiveConfig) { c.DType = 99 }},
		{"bad redop", func(c *CollectiveConfig) { c.RedOp = 99 }},
		{"zero size", func(c *CollectiveConfig) { c.MinBytes = 0 }},
		{"max < min", func(c *CollectiveConfig) { c.MaxBytes = 8 }},
		{"factor", func(c *CollectiveConfig) { c.Factor = 1 }},
		{"iters", func(c *CollectiveConfig) { c.Iters = 0 }},
		{"warmup", func(c *CollectiveConfig) { c.Warmup = -1 }},
		{"root", func(c *CollectiveConfig) { c.Op, c.Root = Broadcast, 2 }},
	}
	for _, tt := range tests {
		cfg := base
		tt.mutate(&cfg)
		if _, err := RunCollective(context.Background(), g, cfg, nil); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", tt.name, err)
		}
	}
}

func TestSizes(t *testing.T) {
	cfg := CollectiveConfig{MinBytes: 4 << 10, MaxBytes: 256 << 20, Factor: 4}
	s := cfg.Sizes()
	if len(s) != 9 || s[0] != 4<<10 || s[8] != 256<<20 {
		t.Errorf("sizes %v", s)
	}
	cfg = CollectiveConfig{MinBytes: 1000, MaxBytes: 3000, Factor: 1, Step: 1000}
	if s := cfg.Sizes(); fmt.Sprint(s) != "[1000 2000 3000]" {
		t.Errorf("sizes %v", s)
	}
	// A factor or step so large that the next size wraps around int64
	// (4096 * (2^62+1) is 4096 again) ends the sweep instead of looping.
	for _, c := range []CollectiveConfig{
		{MinBytes: 4096, MaxBytes: 1 << 30, Factor: 1<<62 + 1},
		{MinBytes: 4096, MaxBytes: 1 << 30, Factor: math.MaxInt},
		{MinBytes: 4096, MaxBytes: 1 << 30, Factor: 1, Step: math.MaxInt64},
		{MinBytes: 1 << 50, MaxBytes: 1 << 50, Factor: 2},
	} {
		if s := c.Sizes(); len(s) != 1 || s[0] != c.MinBytes {
			t.Errorf("%+v: sizes %v, want [%d]", c, s, c.MinBytes)
		}
	}
}

func TestParseCollective(t *testing.T) {
	for _, c := range Collectives {
		got, err := ParseCollective(c.String())
		if err != nil || got != c {
			t.Errorf("ParseCollective(%q) = %v, %v", c, got, err)
		}
	}
	if c, err := ParseCollective("all_reduce"); err != nil || c != AllReduce {
		t.Errorf("all_reduce: %v %v", c, err)
	}
	if _, err := ParseCollective("alltoall"); !errors.Is(err, ErrConfig) {
		t.Errorf("alltoall: %v", err)
	}
}

// TestCombine checks how one placement's ranks make its row: the mean
// time over ranks (nccl-tests' default), summed wrong elements, and the
// bus bandwidth factor of the collective.
func TestCombine(t *testing.T) {
	ranks := []*rankBufs{{elapsed: 10 * time.Microsecond, wrong: 1}, {elapsed: 30 * time.Microsecond, wrong: 2},
		{elapsed: 20 * time.Microsecond}, {elapsed: 20 * time.Microsecond}}
	for _, tt := range []struct {
		op     Collective
		factor float64
	}{{AllReduce, 1.5}, {AllGather, 0.75}, {ReduceScatter, 0.75}, {Broadcast, 1}, {Reduce, 1}, {SendRecv, 1}} {
		cfg := &CollectiveConfig{Op: tt.op, Check: true}
		got, err := combine(ranks, cfg, 40000)
		if err != nil {
			t.Fatal(err)
		}
		if got.Time != 20*time.Microsecond || got.Wrong != 3 || !got.Valid || !got.Checked {
			t.Errorf("%s: %+v, want 20µs and 3 wrong", tt.op, got)
		}
		if math.Abs(got.AlgBW-2) > 1e-12 || math.Abs(got.BusBW-2*tt.factor) > 1e-12 {
			t.Errorf("%s: algbw %g busbw %g, want 2 and %g GB/s", tt.op, got.AlgBW, got.BusBW, 2*tt.factor)
		}
	}
	for _, tt := range []struct {
		a    int
		want time.Duration
	}{{0, 10 * time.Microsecond}, {1, 20 * time.Microsecond}, {2, 10 * time.Microsecond}, {3, 30 * time.Microsecond}} {
		avg, err := ParseAverage(tt.a)
		if err != nil || avg.NCCLTests() != tt.a {
			t.Fatalf("ParseAverage(%d) = %v, %v", tt.a, avg, err)
		}
		got, _ := combine(ranks, &CollectiveConfig{Op: AllReduce, Average: avg}, 8)
		if got.Time != tt.want {
			t.Errorf("-a %d: time %v, want %v", tt.a, got.Time, tt.want)
		}
	}
	if _, err := ParseAverage(4); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseAverage(4): %v", err)
	}
	failed := errors.New("rank failed")
	aborted := fmt.Errorf("rank 0: %w", comm.ErrAborted)
	if _, err := combine([]*rankBufs{{err: aborted}, {err: failed}}, &CollectiveConfig{Op: AllReduce}, 8); err != failed {
		t.Errorf("combine with a failed rank: %v, want the failure, not the abort it caused", err)
	}
}

// TestRowRedOpAndRoot checks the redop and root columns of each
// collective against what nccl-tests' binaries print.
func TestRowRedOpAndRoot(t *testing.T) {
	g := group(t, 2)
	want := map[Collective]struct {
		redop string
		root  int
	}{AllReduce: {"max", -1}, Broadcast: {"none", 1}, Reduce: {"max", 1}, AllGather: {"none", -1},
		ReduceScatter: {"max", -1}, SendRecv: {"max", -1}}
	for _, op := range Collectives {
		cfg := small(op, comm.Float32, comm.Max)
		cfg.MaxBytes, cfg.Root = cfg.MinBytes, 1
		rows, err := RunCollective(context.Background(), g, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || rows[0].RedOp != want[op].redop || rows[0].Root != want[op].root {
			t.Errorf("%s: rows %+v, want redop %q root %d", op, rows, want[op].redop, want[op].root)
		}
	}
}

// TestCancelled checks that a cancelled context stops a sweep and a run,
// even when no collective has to block and so would not look at it.
func TestCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RunCollective(ctx, group(t, 2), small(AllReduce, comm.Float32, comm.Sum), nil); !errors.Is(err, context.Canceled) {
		t.Errorf("RunCollective: %v, want context.Canceled", err)
	}
	_, err := Run(ctx, Config{Params: []ddp.Param{{Name: "w", Shape: []int{4}}}, Comms: group(t, 2), Steps: 1})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want context.Canceled", err)
	}
}

// TestGeometry checks the sizes and counts of each collective against
// nccl-tests' GetCollByteCount: all_gather and reduce_scatter split the
// size over the ranks, rounded down to 16 bytes per rank, and their count
// column is the per-rank count.
func TestGeometry(t *testing.T) {
	tests := []struct {
		op         Collective
		dt         comm.DType
		size       int64
		n          int
		count, per int
	}{
		{AllReduce, comm.Float32, 4096, 3, 1024, 1024},
		{Broadcast, comm.Float16, 4098, 2, 2049, 2049},
		{AllGather, comm.Float32, 4096, 3, 1020, 340},    // 341 floats per rank -> 340
		{ReduceScatter, comm.Float64, 4096, 3, 510, 170}, // 170.67 -> 170 (2 doubles = 16 B)
		{AllGather, comm.Uint8, 4096, 3, 4080, 1360},     // 1365 bytes -> 1360
		{ReduceScatter, comm.BFloat16, 1 << 20, 8, 1 << 19, 1 << 16},
		{AllGather, comm.Float32, 40, 3, 0, 0}, // 3 floats per rank: below 16 B
	}
	for _, tt := range tests {
		count, per := geometry(tt.op, tt.dt, tt.size, tt.n)
		if count != tt.count || per != tt.per {
			t.Errorf("%s %s %d B %d ranks: count %d per %d, want %d and %d", tt.op, tt.dt, tt.size, tt.n, count, per, tt.count, tt.per)
		}
	}
	g := group(t, 3)
	cfg := small(AllGather, comm.Float32, comm.Sum)
	cfg.MinBytes, cfg.MaxBytes = 4096, 4096
	rows, err := RunCollective(context.Background(), g, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Bytes != 4080 || rows[0].Count != 340 || rows[0].InPlace.Wrong != 0 {
		t.Errorf("all_gather 4096 B on 3 ranks: %+v, want 4080 bytes, count 340", rows)
	}
}

// TestNumSizes checks that NumSizes counts what Sizes lists, and that a
// sweep with more sizes than MaxSizes is refused before any list or
// buffer is made.
func TestNumSizes(t *testing.T) {
	for _, c := range []CollectiveConfig{
		{MinBytes: 4 << 10, MaxBytes: 256 << 20, Factor: 4},
		{MinBytes: 8, MaxBytes: 8, Factor: 2},
		{MinBytes: 1000, MaxBytes: 3000, Factor: 1, Step: 1000},
		{MinBytes: 1000, MaxBytes: 3999, Factor: 1, Step: 1000},
		{MinBytes: 4096, MaxBytes: 1 << 30, Factor: math.MaxInt},
		{MinBytes: 1, MaxBytes: 1 << 50, Factor: 2},
		{MinBytes: 4096, MaxBytes: 1 << 30, Factor: 1, Step: math.MaxInt64},
	} {
		if got, want := c.NumSizes(), len(c.Sizes()); got != want {
			t.Errorf("%+v: NumSizes %d, Sizes lists %d", c, got, want)
		}
	}
	huge := small(AllReduce, comm.Float32, comm.Sum)
	huge.MinBytes, huge.MaxBytes, huge.Factor, huge.Step = 4, 1<<40, 1, 4
	if k := huge.NumSizes(); k != MaxSizes+1 {
		t.Errorf("2^38 sizes counted as %d, want MaxSizes+1", k)
	}
	big := small(AllReduce, comm.Float32, comm.Sum)
	big.MinBytes, big.MaxBytes = 4, 1<<40 // 2^38 floats: more than a count holds
	g := group(t, 2)
	for _, cfg := range []CollectiveConfig{huge, big} {
		if _, err := RunCollective(context.Background(), g, cfg, nil); !errors.Is(err, ErrConfig) {
			t.Errorf("%d..%d bytes, step %d: %v, want ErrConfig", cfg.MinBytes, cfg.MaxBytes, cfg.Step, err)
		}
	}
}

// TestCollectiveInterrupted checks that a sweep cancelled between sizes
// returns the rows it completed with the context's error.
func TestCollectiveInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := small(AllReduce, comm.Float32, comm.Sum)
	var seen int
	rows, err := RunCollective(ctx, group(t, 2), cfg, func(CollectiveRow) {
		if seen++; seen == 2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || len(rows) != 2 {
		t.Errorf("%d rows, error %v: want the 2 rows done and context.Canceled", len(rows), err)
	}
}

// TestCollectiveTimeoutDrains checks that a placement cut short by its
// deadline aborts the ranks and waits for the pending operations before
// the buffers go back to the pool: RunCollective returns the deadline's
// error and leaves no goroutine behind.
func TestCollectiveTimeoutDrains(t *testing.T) {
	g := group(t, 2)
	for i := range g {
		g[i] = commtest.Stuck(g[i])
	}
	cfg := small(AllReduce, comm.Float32, comm.Sum)
	cfg.Timeout = 50 * time.Millisecond
	_, err := RunCollective(context.Background(), g, cfg, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%v, want the placement's deadline", err)
	}
}
