package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// Collective names a collective operation of a sweep.
type Collective uint8

// The collectives a sweep can time, named as nccl-tests' binaries are
// (all_reduce_perf, ...).
const (
	AllReduce Collective = iota + 1
	Broadcast
	Reduce
	AllGather
	ReduceScatter
	SendRecv
)

var collectiveNames = []string{AllReduce: "allreduce", Broadcast: "broadcast", Reduce: "reduce",
	AllGather: "allgather", ReduceScatter: "reducescatter", SendRecv: "sendrecv"}

// Collectives lists every Collective.
var Collectives = []Collective{AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, SendRecv}

// String returns the name ParseCollective accepts ("allreduce", ...).
func (c Collective) String() string {
	if int(c) < len(collectiveNames) && c > 0 {
		return collectiveNames[c]
	}
	return fmt.Sprintf("Collective(%d)", uint8(c))
}

// Kind returns the comm.Kind whose bus-bandwidth factor applies.
func (c Collective) Kind() comm.Kind {
	switch c {
	case AllReduce:
		return comm.KindAllReduce
	case Broadcast:
		return comm.KindBroadcast
	case Reduce:
		return comm.KindReduce
	case AllGather:
		return comm.KindAllGather
	case ReduceScatter:
		return comm.KindReduceScatter
	case SendRecv:
		return comm.KindSend
	}
	return 0
}

// Reduces reports whether the collective applies a reduction operation.
func (c Collective) Reduces() bool { return c == AllReduce || c == Reduce || c == ReduceScatter }

// Rooted reports whether the collective has a root rank.
func (c Collective) Rooted() bool { return c == Broadcast || c == Reduce }

// ParseCollective accepts "allreduce", "broadcast", "reduce", "allgather",
// "reducescatter" and "sendrecv", with or without underscores.
func ParseCollective(s string) (Collective, error) {
	t := strings.ReplaceAll(strings.ToLower(s), "_", "")
	for _, c := range Collectives {
		if c.String() == t {
			return c, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown collective %q (want one of %s)", ErrConfig, s, strings.Join(collectiveNames[1:], ", "))
}

// ErrConfig reports an invalid benchmark configuration.
var ErrConfig = errors.New("bench: invalid configuration")

// ErrWrong reports that a checked collective produced wrong elements.
var ErrWrong = errors.New("bench: wrong results")

// Timing is one placement (out-of-place or in-place) of one size.
type Timing struct {
	Valid   bool          // false: the placement does not exist for this collective
	Time    time.Duration // per iteration, combined over ranks as CollectiveConfig.Average says
	AlgBW   float64       // GB/s
	BusBW   float64       // GB/s
	Wrong   int64         // wrong elements summed over ranks (when checked)
	Checked bool
}

// CollectiveRow is one size of a sweep.
type CollectiveRow struct {
	Bytes      int64 // nccl-tests' size: the larger of the send and receive buffers
	Count      int   // nccl-tests' count: the collective's count argument (per rank for all_gather and reduce_scatter)
	DType      comm.DType
	RedOp      string // "sum", ... or "none" (as nccl-tests prints it)
	Root       int    // -1 when the collective has no root
	OutOfPlace Timing
	InPlace    Timing
}

// EmulatedOutOfPlace reports whether op's out-of-place column is timed as
// a copy into the result buffer followed by the in-place collective,
// because the comm contract has only the in-place form (Broadcast; every
// other collective, AllReduce included, has a real out-of-place form).
func EmulatedOutOfPlace(op Collective) bool { return op == Broadcast }

// corruptHook, when set by a test, damages a rank's result buffer after a
// checked collective, before it is verified.
var corruptHook func(rank int, inPlace bool, out comm.Buffer)

// RunCollective runs the sweep on the group comms (one Communicator per
// rank, all of one group, each driven from its own goroutine) and calls
// row, if not nil, as each size completes. Every rank issues the same
// sequence. Each iteration is issued and waited before the next (a CPU
// backend has no stream to queue work on); a placement's time is the
// timed loop divided by Iters, combined over the ranks as cfg.Average
// says (the mean by default, as nccl-tests).
//
// comms may also be the one rank this process runs of a job with a
// process per rank (mpirun): every process then calls RunCollective, and
// after each placement the ranks' times and wrong counts are gathered
// with a small AllGather over the communicator, so every process returns
// the rows of the whole group.
func RunCollective(ctx context.Context, comms []comm.Communicator, cfg CollectiveConfig, row func(CollectiveRow)) ([]CollectiveRow, error) {
	n, launched, err := worldOf(comms)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(n); err != nil {
		return nil, err
	}
	sizes := cfg.Sizes()
	maxCount, _ := geometry(cfg.Op, cfg.DType, sizes[len(sizes)-1], n)
	es := cfg.DType.Size()
	var ranks []*rankBufs
	var release func()
	if cfg.Device {
		ranks, release, err = newDeviceBufs(comms, maxCount*es)
	} else {
		ranks, release, err = newRankBufs(len(comms), maxCount*es, comm.HostSourceOf(comms[0]))
	}
	if err != nil {
		return nil, err
	}
	defer release()
	var ex *exchange
	if launched {
		if ex, err = newExchange(comms[0], 2); err != nil {
			return nil, err
		}
		defer ex.close()
	}
	var rows []CollectiveRow
	for _, size := range sizes {
		count, per := geometry(cfg.Op, cfg.DType, size, n)
		if per == 0 {
			continue
		}
		// nccl-tests' count column is the count passed to the collective:
		// per rank for all_gather and reduce_scatter.
		res := CollectiveRow{Bytes: int64(count * es), Count: per, DType: cfg.DType, RedOp: "none", Root: -1}
		// sendrecv_perf prints the -o operation though nothing is reduced;
		// the other collectives without a reduction print "none".
		if cfg.Op.Reduces() || cfg.Op == SendRecv {
			res.RedOp = cfg.RedOp.String()
		}
		if cfg.Op.Rooted() {
			res.Root = cfg.Root
		}
		for _, inPlace := range []bool{false, true} {
			if inPlace && cfg.Op == SendRecv {
				continue // a rank cannot send and receive one buffer at once
			}
			// A collective that completes without blocking may not look
			// at ctx: stop between placements once it is done.
			if err := ctx.Err(); err != nil {
				return rows, err
			}
			t, err := runPlacement(ctx, comms, ranks, &cfg, count, per, inPlace, ex)
			if err != nil {
				return rows, fmt.Errorf("bench: %s %d bytes (%s): %w", cfg.Op, res.Bytes, placeName(inPlace), err)
			}
			if inPlace {
				res.InPlace = t
			} else {
				res.OutOfPlace = t
			}
		}
		rows = append(rows, res)
		if row != nil {
			row(res)
		}
	}
	return rows, nil
}

func placeName(inPlace bool) string {
	if inPlace {
		return "in-place"
	}
	return "out-of-place"
}

// AvgBusBW returns the mean bus bandwidth over every valid timing of rows,
// as nccl-tests' "Avg bus bandwidth" footer.
func AvgBusBW(rows []CollectiveRow) float64 {
	var sum float64
	var k int
	for _, r := range rows {
		for _, t := range []Timing{r.OutOfPlace, r.InPlace} {
			if t.Valid {
				sum += t.BusBW
				k++
			}
		}
	}
	if k == 0 {
		return 0
	}
	return sum / float64(k)
}

// WrongTests returns the number of checked placements (one size, out of
// place or in place) that had at least one wrong element: what
// nccl-tests' "Out of bounds values" footer counts.
func WrongTests(rows []CollectiveRow) int {
	var k int
	for _, r := range rows {
		for _, t := range []Timing{r.OutOfPlace, r.InPlace} {
			if t.Valid && t.Wrong > 0 {
				k++
			}
		}
	}
	return k
}

// WrongTotal returns the wrong elements over all rows.
func WrongTotal(rows []CollectiveRow) int64 {
	var w int64
	for _, r := range rows {
		w += r.OutOfPlace.Wrong + r.InPlace.Wrong
	}
	return w
}
