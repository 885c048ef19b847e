package bench

import (
	"fmt"
	"math"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// CollectiveConfig configures an nccl-tests style sweep.
type CollectiveConfig struct {
	Op       Collective
	DType    comm.DType // 0 -> Float32
	RedOp    comm.Op    // 0 -> Sum
	Root     int
	MinBytes int64 // first size
	MaxBytes int64 // last size (inclusive)
	Factor   int   // size multiplier between rows, >= 2 (or 1 with Step)
	Step     int64 // additive increment when Factor is 1
	Iters    int   // timed iterations per size and placement
	Warmup   int   // untimed iterations before them
	Check    bool  // fill inputs with a pattern and count wrong elements
	// Timeout bounds each size's placement (warmup, timed loop and check)
	// on every rank; 0 means no bound beyond the caller's context.
	Timeout time.Duration
	// Average is how the ranks' times make a row's time (nccl-tests' -a);
	// the zero value is the mean, nccl-tests' default.
	Average Average
	// Device puts each rank's buffers in its device's memory, from a
	// CommPool over its communicator's own Source (DeviceMemory, as
	// nccl.Comm has), filled and read back through its kernels, as
	// nccl-tests' buffers are cudaMalloc'd. Without it the buffers are
	// host memory, which a device backend would stage: a device figure
	// must not include that.
	Device bool
}

// DeviceMemory is what a communicator offers for its collectives to run
// on device memory: a Source of that memory for a CommPool, and the
// kernels (comm.KernelSource) that reach it. nccl.Comm has both.
type DeviceMemory interface {
	comm.KernelSource
	Source() allocator.Source
}

// Average says how the ranks' times of one placement combine into its
// reported time, as nccl-tests' -a option does.
type Average uint8

// The ways of combining ranks' times. nccl-tests numbers them 0 (rank 0),
// 1 (mean), 2 (min) and 3 (max); see ParseAverage.
const (
	AverageMean Average = iota
	AverageRank0
	AverageMin
	AverageMax
)

// ParseAverage maps nccl-tests' -a values (0 rank 0, 1 mean, 2 min, 3 max)
// to an Average.
func ParseAverage(a int) (Average, error) {
	switch a {
	case 0:
		return AverageRank0, nil
	case 1:
		return AverageMean, nil
	case 2:
		return AverageMin, nil
	case 3:
		return AverageMax, nil
	}
	return 0, fmt.Errorf("%w: average %d: want 0 (rank 0), 1 (mean), 2 (min) or 3 (max)", ErrConfig, a)
}

// NCCLTests returns the -a value nccl-tests uses for a.
func (a Average) NCCLTests() int {
	return [...]int{AverageMean: 1, AverageRank0: 0, AverageMin: 2, AverageMax: 3}[a]
}

// Sizes returns the byte sizes of a sweep, as nccl-tests walks them.
func (cfg *CollectiveConfig) Sizes() []int64 {
	var out []int64
	for s := cfg.MinBytes; s <= cfg.MaxBytes && s > 0; {
		out = append(out, s)
		// Stop before the next size would pass MaxBytes, so that a huge
		// factor or step cannot wrap around int64 into a small size again.
		if cfg.Factor > 1 {
			if s > cfg.MaxBytes/int64(cfg.Factor) {
				break
			}
			s *= int64(cfg.Factor)
		} else {
			if cfg.Step <= 0 || s > cfg.MaxBytes-cfg.Step {
				break
			}
			s += cfg.Step
		}
	}
	return out
}

func (cfg *CollectiveConfig) validate(n int) error {
	if cfg.DType == 0 {
		cfg.DType = comm.Float32
	}
	if cfg.RedOp == 0 {
		cfg.RedOp = comm.Sum
	}
	switch {
	case cfg.Op.Kind() == 0:
		return fmt.Errorf("%w: unknown collective %d", ErrConfig, cfg.Op)
	case !cfg.DType.Valid():
		return fmt.Errorf("%w: invalid dtype %d", ErrConfig, cfg.DType)
	case !cfg.RedOp.Valid():
		return fmt.Errorf("%w: invalid reduction op %d", ErrConfig, cfg.RedOp)
	case cfg.MinBytes <= 0 || cfg.MaxBytes < cfg.MinBytes:
		return fmt.Errorf("%w: sizes %d..%d: want 0 < min <= max", ErrConfig, cfg.MinBytes, cfg.MaxBytes)
	case cfg.Factor < 1 || (cfg.Factor == 1 && cfg.Step <= 0):
		return fmt.Errorf("%w: step factor %d (increment %d): want a factor >= 2, or 1 with a positive increment", ErrConfig, cfg.Factor, cfg.Step)
	case cfg.Iters < 1:
		return fmt.Errorf("%w: %d iterations, want >= 1", ErrConfig, cfg.Iters)
	case cfg.Warmup < 0:
		return fmt.Errorf("%w: %d warmup iterations, want >= 0", ErrConfig, cfg.Warmup)
	case cfg.Op.Rooted() && (cfg.Root < 0 || cfg.Root >= n):
		return fmt.Errorf("%w: root %d outside 0..%d", ErrConfig, cfg.Root, n-1)
	case n < 1:
		return fmt.Errorf("%w: no ranks", ErrConfig)
	case cfg.Op == SendRecv && n < 2:
		return fmt.Errorf("%w: sendrecv needs at least 2 ranks", ErrConfig)
	case cfg.MaxBytes/int64(cfg.DType.Size()) > math.MaxInt32:
		// Element counts are ints in the comm contract and int32 in NCCL
		// and MPI (nccl-tests' own limit): refuse what would not fit.
		return fmt.Errorf("%w: %d bytes of %s are %d elements, more than a count can hold (%d)",
			ErrConfig, cfg.MaxBytes, cfg.DType, cfg.MaxBytes/int64(cfg.DType.Size()), math.MaxInt32)
	}
	if k := cfg.NumSizes(); k > MaxSizes {
		return fmt.Errorf("%w: %d sizes from %d to %d bytes, want at most %d", ErrConfig, k, cfg.MinBytes, cfg.MaxBytes, MaxSizes)
	}
	return nil
}

// MaxSizes bounds the number of sizes of one sweep: its rows are kept
// for the footer, so their number bounds the memory of the sweep.
const MaxSizes = 1 << 16

// NumSizes returns the number of sizes the sweep walks (len(Sizes())),
// without building the list: at most MaxSizes+1, so that a step of one
// byte up to a terabyte is counted in constant time and refused.
func (cfg *CollectiveConfig) NumSizes() int {
	if cfg.MinBytes <= 0 || cfg.MaxBytes < cfg.MinBytes {
		return 0
	}
	if cfg.Factor <= 1 {
		if cfg.Step <= 0 {
			return 1
		}
		k := (cfg.MaxBytes-cfg.MinBytes)/cfg.Step + 1
		return int(min(k, MaxSizes+1))
	}
	k := 0
	for s := cfg.MinBytes; ; s *= int64(cfg.Factor) {
		k++
		if s > cfg.MaxBytes/int64(cfg.Factor) {
			return k
		}
	}
}

// geometry returns, for a requested size, the element counts nccl-tests
// uses: count is the element count of the larger buffer and per the count
// each rank contributes to (all_gather) or receives from (reduce_scatter)
// the gather and scatter collectives, which nccl-tests rounds down to a
// multiple of 16 bytes ((count/nranks) & -(16/eltSize)); for the other
// collectives per is count.
func geometry(op Collective, dt comm.DType, size int64, n int) (count, per int) {
	count = int(size / int64(dt.Size()))
	if op == AllGather || op == ReduceScatter {
		align := max(1, 16/dt.Size())
		per = count / n
		per -= per % align
		return per * n, per
	}
	return count, count
}
