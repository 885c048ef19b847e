package hooks

import (
	"context"
	"errors"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// Hook reduces one bucket of float32 gradients so that, on every rank, the
// bucket ends holding the average over ranks.
//
// A Hook value belongs to one rank: the Reducer calls Setup before the
// first step and again whenever its bucket layout changes, then Reduce once
// per bucket per synced step, always from the rank's communication
// goroutine (never concurrently), and Close once. Every rank of a group
// must use the same kind of hook, since the hook decides which collectives
// run.
type Hook interface {
	// Name identifies the hook in statistics and errors ("allreduce",
	// "avg", "fp16", "bf16"). The Reducer compares it across ranks: every
	// rank must use a hook of the same name.
	Name() string
	// Setup prepares the hook for buckets of the given element counts on
	// communicator c: a hook that needs scratch memory takes it from pool
	// here, sized for the largest bucket, and reuses it in every Reduce.
	// Setup may be called again with a new layout; it then keeps or
	// replaces its scratch. It fails with ErrShared if c is not the
	// communicator of an earlier Setup.
	Setup(c comm.Communicator, pool *allocator.Pool, counts []int) error
	// Reduce replaces b.Buf with the average of b.Buf over all ranks of c
	// and records its phases in b.Times. It returns when b.Buf holds the
	// result, or with the collective's error, or ctx's.
	Reduce(ctx context.Context, c comm.Communicator, b *Bucket) error
	// Close returns the hook's scratch to the pool. It is idempotent.
	Close() error
}

// Bucket is what a Hook reduces: one bucket of float32 gradients.
type Bucket struct {
	Index int         // bucket index in the current layout
	Buf   comm.Buffer // Float32 elements; on return, the average over ranks
	Start time.Time   // origin of the timestamps in Times (the step's start)
	Times Times       // filled by Reduce
}

// Times are the phases of one Reduce, as offsets from Bucket.Start, plus
// what the collective carried. A phase a hook does not have (AllReduce has
// no compression) has start == end.
type Times struct {
	CompressStart   time.Duration // scaling / conversion to the wire type begins
	CompressEnd     time.Duration
	CollectiveStart time.Duration // the collective is issued
	CollectiveEnd   time.Duration // the collective completed
	DecompressEnd   time.Duration // the result is back in Buf as float32
	WireBytes       int64         // payload bytes given to collectives
	Overflows       int64         // FP16/BF16: elements reduced to Inf/NaN from a finite input (see the package doc)
}

// Errors returned by hooks; test with errors.Is.
var (
	// ErrNotSetup: Reduce was called before Setup, or after Close.
	ErrNotSetup = errors.New("hooks: hook is not set up")
	// ErrShared: one Hook value was given two communicators. Each rank needs
	// its own hook value.
	ErrShared = errors.New("hooks: hook used by two communicators")
	// ErrTooLarge: a bucket has more elements than Setup was told of.
	ErrTooLarge = errors.New("hooks: bucket larger than the layout given to Setup")
	// ErrDType: a bucket's buffer is not Float32.
	ErrDType = errors.New("hooks: bucket is not float32")
)

// since returns the time elapsed since start (monotonic clock).
func since(start time.Time) time.Duration { return time.Since(start) }
