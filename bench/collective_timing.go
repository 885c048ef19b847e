package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// issueFunc returns the call one rank makes for one iteration, and the
// buffer that holds that rank's result (Count 0 when the rank has none).
func issueFunc(c comm.Communicator, b *rankBufs, cfg *CollectiveConfig, count, per int, inPlace bool) (issue func() comm.Work, out comm.Buffer) {
	r, n := c.Rank(), c.Size()
	dt := cfg.DType
	send, recv := typed(b.sendBuf, count, dt), typed(b.recvBuf, count, dt)
	es := dt.Size()
	switch cfg.Op {
	case AllReduce:
		if inPlace {
			return func() comm.Work { return c.AllReduce(recv, recv, cfg.RedOp) }, recv
		}
		return func() comm.Work { return c.AllReduce(send, recv, cfg.RedOp) }, recv
	case Broadcast:
		if inPlace || r != cfg.Root {
			return func() comm.Work { return c.Broadcast(recv, cfg.Root) }, recv
		}
		if b.kern != nil {
			// On the device stream, ordered before the broadcast.
			return func() comm.Work {
				b.kern.Copy(recv, send)
				return c.Broadcast(recv, cfg.Root)
			}, recv
		}
		return func() comm.Work {
			copy(b.recv[:count*es], b.send[:count*es])
			return c.Broadcast(recv, cfg.Root)
		}, recv
	case Reduce:
		out := recv
		if r != cfg.Root {
			out = comm.Buffer{DType: dt}
		}
		if inPlace {
			return func() comm.Work { return c.Reduce(recv, recv, cfg.RedOp, cfg.Root) }, out
		}
		return func() comm.Work { return c.Reduce(send, recv, cfg.RedOp, cfg.Root) }, out
	case AllGather:
		s := typed(b.sendBuf, per, dt)
		if inPlace {
			s = recv.Slice(r*per, per)
		}
		return func() comm.Work { return c.AllGather(s, recv) }, recv
	case ReduceScatter:
		o := typed(b.recvBuf, per, dt)
		if inPlace {
			o = send.Slice(r*per, per)
		}
		return func() comm.Work { return c.ReduceScatter(send, o, cfg.RedOp) }, o
	case SendRecv:
		to, from := (r+1)%n, (r-1+n)%n
		// Send and Recv are rendezvous operations run in issue order, so
		// a ring alternates: even ranks send first, odd ranks receive
		// first (with an odd number of ranks, the last even rank's send
		// waits for rank 0's, which completes against rank 1).
		if r%2 == 0 {
			return func() comm.Work {
				sw := c.Send(send, to)
				return joinWork(sw, c.Recv(recv, from))
			}, recv
		}
		return func() comm.Work {
			rw := c.Recv(recv, from)
			return joinWork(rw, c.Send(send, to))
		}, recv
	}
	panic("unreachable")
}

// joinWork waits for a and then b.
func joinWork(a, b comm.Work) comm.Work { return comm.NewWork(pair{a, b}, 0) }

type pair struct{ a, b comm.Work }

func (p pair) WaitOp(ctx context.Context, _ uint64) error {
	return errors.Join(p.a.Wait(ctx), p.b.Wait(ctx))
}

func (p pair) TestOp(uint64) (bool, error) {
	da, ea := p.a.Test()
	db, eb := p.b.Test()
	return da && db, errors.Join(ea, eb)
}

func runPlacement(ctx context.Context, comms []comm.Communicator, ranks []*rankBufs, cfg *CollectiveConfig, count, per int, inPlace bool, ex *exchange) (Timing, error) {
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	var wg sync.WaitGroup
	for i, c := range comms {
		b := ranks[i]
		b.elapsed, b.wrong, b.err = 0, 0, nil
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.err = runRank(ctx, c, b, cfg, count, per, inPlace)
			if b.err != nil {
				// Release the other ranks from the collective this one left.
				c.Abort(fmt.Errorf("rank %d failed: %w", c.Rank(), b.err))
			}
		}()
	}
	wg.Wait()
	bytes := int64(count * cfg.DType.Size())
	if ex == nil {
		return combine(ranks, cfg, bytes)
	}
	// One rank of a launched job: its own outcome, then everyone's.
	b := ranks[0]
	if b.err != nil {
		return Timing{}, b.err
	}
	all, err := ex.gather(ctx, float64(b.elapsed), float64(b.wrong))
	if err != nil {
		return Timing{}, err
	}
	group := make([]*rankBufs, ex.n)
	for r := range group {
		group[r] = &rankBufs{elapsed: time.Duration(all[2*r]), wrong: int64(all[2*r+1])}
	}
	return combine(group, cfg, bytes)
}

// combine makes one placement's Timing from every rank's: the time is
// combined as cfg.Average says (by default the mean over ranks, as
// nccl-tests), wrong elements are summed, and the bandwidths are those of
// bytes in that time.
func combine(ranks []*rankBufs, cfg *CollectiveConfig, bytes int64) (Timing, error) {
	t := Timing{Valid: true, Checked: cfg.Check}
	var sum time.Duration
	lo, hi := ranks[0].elapsed, ranks[0].elapsed
	errs := make([]error, len(ranks))
	for i, b := range ranks {
		errs[i] = b.err
		sum += b.elapsed
		lo, hi = min(lo, b.elapsed), max(hi, b.elapsed)
		t.Wrong += b.wrong
	}
	if err := firstErr(errs); err != nil {
		return t, err // the root cause rather than the aborts it caused
	}
	switch cfg.Average {
	case AverageRank0:
		t.Time = ranks[0].elapsed
	case AverageMin:
		t.Time = lo
	case AverageMax:
		t.Time = hi
	default:
		t.Time = sum / time.Duration(len(ranks))
	}
	t.AlgBW = comm.AlgBW(bytes, t.Time)
	t.BusBW = comm.BusBW(cfg.Op.Kind(), len(ranks), bytes, t.Time)
	return t, nil
}

func runRank(ctx context.Context, c comm.Communicator, b *rankBufs, cfg *CollectiveConfig, count, per int, inPlace bool) error {
	issue, out := issueFunc(c, b, cfg, count, per, inPlace)
	p := pattern{dt: cfg.DType, n: c.Size()}
	// Timed data: the pattern too, so that reductions over it stay finite.
	p.fillInputs(cfg, b, c.Rank(), count, per, inPlace)
	for range cfg.Warmup {
		if err := b.wait(ctx, issue()); err != nil {
			return err
		}
	}
	if err := b.wait(ctx, c.Barrier()); err != nil {
		return err
	}
	start := time.Now()
	for range cfg.Iters {
		if err := b.wait(ctx, issue()); err != nil {
			return err
		}
	}
	b.elapsed = time.Since(start) / time.Duration(cfg.Iters)
	if !cfg.Check {
		return nil
	}
	// One more iteration on fresh inputs, verified element by element.
	p.fillInputs(cfg, b, c.Rank(), count, per, inPlace)
	if err := b.wait(ctx, c.Barrier()); err != nil {
		return err
	}
	if err := b.wait(ctx, issue()); err != nil {
		return err
	}
	if b.kern != nil {
		out = b.download(out)
	}
	if corruptHook != nil {
		corruptHook(c.Rank(), inPlace, out)
	}
	b.wrong = p.check(cfg, c.Rank(), out, per)
	return nil
}
