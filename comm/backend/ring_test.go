package backend

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

// rank is a minimal backend over a Ring: the test completes its
// operations by hand.
type rank struct {
	ops    Ring[int]
	failed atomic.Pointer[error]
	parked atomic.Int32
	adv    func(id uint64)
}

type hooks rank

func (h *hooks) Advance(id uint64) {
	if h.adv != nil {
		h.adv(id)
	}
}
func (h *hooks) Parking(uint64) { h.parked.Add(1) }
func (h *hooks) Failure() error {
	if p := h.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func newRank(spin bool) *rank {
	r := new(rank)
	r.ops.Init(Config{Backend: "test", Rank: 3, Spin: spin, Hooks: (*hooks)(r)})
	return r
}

func (r *rank) TestOp(id uint64) (bool, error)              { return r.ops.Test(id) }
func (r *rank) WaitOp(ctx context.Context, id uint64) error { return r.ops.Wait(ctx, id) }

// issue reserves and publishes the next operation.
func (r *rank) issue() uint64 {
	seq := r.ops.Reserve(r)
	*r.ops.Op(seq) = int(seq)
	r.ops.Publish(seq)
	return seq
}

// TestSlotBeingRewritten steps a slot through its rewrite by a later
// operation by hand, as Complete does it, and checks what Test says of
// both operations at every step: the old one never takes the new one's
// result, and the new one is not done before its result is in place.
func TestSlotBeingRewritten(t *testing.T) {
	r := newRank(false)
	errOld := errors.New("old failure")
	const old, next = 1, 1 + RingSize
	r.ops.issued.Store(next)
	r.ops.Complete(old, errOld)
	s := &r.ops.slots[old%RingSize]
	check := func(step string, nextDone bool, nextErr error) {
		t.Helper()
		if done, err := r.ops.Test(old); !done || err != errOld {
			t.Errorf("%s: Test(old) = %v, %v; want true, %v", step, done, err, errOld)
		}
		if done, err := r.ops.Test(next); done != nextDone || err != nextErr {
			t.Errorf("%s: Test(next) = %v, %v; want %v, %v", step, done, err, nextDone, nextErr)
		}
	}
	check("before", false, nil)
	s.done.Store(next | writing)
	check("marked", false, nil)
	s.err.Store(nil)
	check("error replaced", false, nil)
	s.done.Store(next)
	check("after", true, nil)
}

// TestResults completes operations with and without errors across many
// reuses of every slot and checks that each keeps its own result.
func TestResults(t *testing.T) {
	r := newRank(false)
	const n = 3*RingSize + 7
	errs := map[uint64]error{}
	for range n {
		seq := r.issue()
		var err error
		if seq%5 == 0 {
			err = fmt.Errorf("op %d", seq)
			errs[seq] = err
		}
		if !r.ops.Complete(seq, err) {
			t.Fatalf("Complete(%d) did not record", seq)
		}
		if r.ops.Complete(seq, errors.New("again")) {
			t.Fatalf("a second Complete(%d) recorded", seq)
		}
	}
	for seq := uint64(1); seq <= n; seq++ {
		done, err := r.ops.Test(seq)
		if !done || err != errs[seq] {
			t.Errorf("Test(%d) = %v, %v; want true, %v", seq, done, err, errs[seq])
		}
	}
	for _, id := range []uint64{0, n + 1} {
		if done, err := r.ops.Test(id); !done || !errors.Is(err, comm.ErrInvalid) {
			t.Errorf("Test(%d) of an operation never issued = %v, %v; want ErrInvalid", id, done, err)
		}
	}
}

// TestFailLog fails more operations than the log keeps: the oldest are
// reported as unknown (never as a success), the rest keep their errors,
// and once a Sticky backend has failed, later operations report its
// failure without being logged.
func TestFailLog(t *testing.T) {
	r := newRank(false)
	const n = FailLogMax + RingSize + 1
	for range n {
		r.ops.Complete(r.issue(), errors.New("failed"))
	}
	if done, err := r.ops.Test(1); !done || !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), "no longer kept") {
		t.Errorf("Test(1) after %d failures = %v, %v; want ErrInvalid, no longer kept", n, done, err)
	}
	if done, err := r.ops.Test(n - RingSize); !done || err == nil || err.Error() != "failed" {
		t.Errorf("Test(%d) = %v, %v; want its own failure", n-RingSize, done, err)
	}

	r = newRank(false)
	r.ops.Complete(r.issue(), nil)
	groupErr := errors.New("group failed")
	r.failed.Store(&groupErr)
	first := r.issue()
	r.ops.Complete(first, fmt.Errorf("op: %w", groupErr))
	for range 2 * RingSize {
		r.ops.Complete(r.issue(), fmt.Errorf("op: %w", groupErr))
	}
	if len(r.ops.fails) != 1 {
		t.Errorf("a failed Sticky backend logged %d failures, want 1", len(r.ops.fails))
	}
	if done, err := r.ops.Test(1); !done || err != nil {
		t.Errorf("Test(1), a success before the failure = %v, %v; want true, nil", done, err)
	}
	if done, err := r.ops.Test(first + 1); !done || !errors.Is(err, groupErr) {
		t.Errorf("Test(%d) after the failure = %v, %v; want the group's failure", first+1, done, err)
	}
}

// TestFailLogOutOfOrder completes operations out of order, as a wrapper
// whose waiters complete launched operations does: each keeps its error.
func TestFailLogOutOfOrder(t *testing.T) {
	r := newRank(false)
	var seqs []uint64
	for range RingSize {
		seqs = append(seqs, r.issue())
	}
	for i := len(seqs) - 1; i >= 0; i-- {
		r.ops.Complete(seqs[i], fmt.Errorf("op %d", seqs[i]))
	}
	for range RingSize {
		r.ops.Complete(r.issue(), nil)
	}
	for _, seq := range seqs {
		if done, err := r.ops.Test(seq); !done || err == nil || err.Error() != fmt.Sprintf("op %d", seq) {
			t.Errorf("Test(%d) = %v, %v", seq, done, err)
		}
	}
}

// TestCompleteRace has several goroutines complete each operation at
// once: exactly one records it, and Test reports that one's result.
func TestCompleteRace(t *testing.T) {
	r := newRank(false)
	for range 2 * RingSize {
		seq := r.issue()
		var wins atomic.Int32
		var winner atomic.Int32
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				var err error
				if g > 0 {
					err = fmt.Errorf("from %d", g)
				}
				if r.ops.Complete(seq, err) {
					wins.Add(1)
					winner.Store(int32(g))
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("op %d: %d completions recorded, want 1", seq, wins.Load())
		}
		_, err := r.ops.Test(seq)
		if g := winner.Load(); (g == 0) != (err == nil) || g > 0 && err.Error() != fmt.Sprintf("from %d", g) {
			t.Fatalf("op %d: Test = %v, but goroutine %d's completion was recorded", seq, err, g)
		}
	}
}

// TestWait parks a waiter, spinning first or not, and completes its
// operation from another goroutine: the Wait returns the result, the
// backend heard of the park, and the waiter is gone afterwards.
func TestWait(t *testing.T) {
	for _, spin := range []bool{false, true} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) {
			r := newRank(spin)
			seq := r.issue()
			want := errors.New("late")
			res := make(chan error)
			go func() { res <- r.ops.Wait(context.Background(), seq) }()
			// Parking comes after the waiter is registered, so once it
			// has been called the waiter must be there.
			for r.parked.Load() == 0 {
				runtime.Gosched()
			}
			if n := r.ops.Waiting(); n != 1 {
				t.Errorf("%d waiters registered when Parking was called, want 1", n)
			}
			r.ops.Complete(seq, want)
			if err := <-res; err != want {
				t.Errorf("Wait = %v, want %v", err, want)
			}
			if n := r.parked.Load(); n != 1 {
				t.Errorf("Parking called %d times, want 1", n)
			}
			if n := r.ops.Waiting(); n != 0 {
				t.Errorf("%d waiters left", n)
			}
		})
	}
}

// TestWaitAdvance completes an operation from the backend's Advancer,
// which Test calls: a Wait needs nobody else.
func TestWaitAdvance(t *testing.T) {
	r := newRank(true)
	seq := r.issue()
	polls := 0
	r.adv = func(id uint64) {
		if polls++; polls == 10 {
			r.ops.Complete(id, nil)
		}
	}
	if err := r.ops.Wait(context.Background(), seq); err != nil {
		t.Fatal(err)
	}
	if polls != 10 {
		t.Errorf("Advance called %d times, want 10", polls)
	}
}

// waitErr is a backend with its own WaitError.
type waitErr struct{ rank }

func (w *waitErr) WaitError(id uint64, cause error) error {
	return fmt.Errorf("custom wait of %d: %w", id, cause)
}

// TestWaitContext ends a Wait by its context: the error wraps the cause
// and says what it waited for, in the backend's words when it has some.
func TestWaitContext(t *testing.T) {
	cause := errors.New("the caller gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)

	r := newRank(false)
	seq := r.issue()
	err := r.ops.Wait(ctx, seq)
	if !errors.Is(err, cause) || err.Error() != "test: rank 3: waiting for operation #1: the caller gave up" {
		t.Errorf("Wait = %v", err)
	}

	w := new(waitErr)
	w.ops.Init(Config{Backend: "test", Hooks: w})
	seq = w.issue()
	if err := w.ops.Wait(ctx, seq); !errors.Is(err, cause) || !strings.HasPrefix(err.Error(), "custom wait of 1") {
		t.Errorf("Wait with a WaitErrorer = %v", err)
	}
	done := false
	if err := w.ops.Await(ctx, seq, func() bool { return done }); !errors.Is(err, cause) {
		t.Errorf("Await = %v", err)
	}
	done = true
	if err := w.ops.Await(ctx, seq, func() bool { return done }); err != nil {
		t.Errorf("Await of a ready condition = %v", err)
	}
}

// TestReserveWaits fills the ring: reserving one more waits until the
// oldest operation completes.
func TestReserveWaits(t *testing.T) {
	r := newRank(false)
	for range RingSize {
		r.issue()
	}
	got := make(chan uint64)
	go func() { got <- r.ops.Reserve(r) }()
	for r.ops.Waiting() == 0 {
		runtime.Gosched()
	}
	select {
	case seq := <-got:
		t.Fatalf("Reserve returned %d before operation 1 completed", seq)
	default:
	}
	r.ops.Complete(1, nil)
	if seq := <-got; seq != RingSize+1 {
		t.Errorf("Reserve = %d, want %d", seq, RingSize+1)
	}
}

// TestAllocs holds issuing, completing, testing and a Wait that finds its
// operation done at zero allocations.
func TestAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	r := newRank(true)
	ctx := context.Background()
	n := testing.AllocsPerRun(3*RingSize, func() {
		seq := r.issue()
		r.ops.Complete(seq, nil)
		if done, err := r.ops.Test(seq); !done || err != nil {
			t.Fatal(done, err)
		}
		if err := r.ops.Wait(ctx, seq); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per operation, want 0", n)
	}
}

// TestPublishDone publishes operations as complete, among ordinary ones,
// over slots whose last operation failed: each keeps its number and is
// done without error, and the failed ones keep their errors. Ended says
// an operation has completed even once its slot is reused, and not
// before it completes.
func TestPublishDone(t *testing.T) {
	r := newRank(false)
	errs := map[uint64]error{}
	for i := range RingSize {
		seq := r.issue()
		var err error
		if i%2 == 0 {
			err = fmt.Errorf("op %d", seq)
			errs[seq] = err
		}
		if r.ops.Ended(seq) {
			t.Fatalf("Ended(%d) before it completed", seq)
		}
		r.ops.Complete(seq, err)
	}
	for i := range 2 * RingSize {
		want := uint64(RingSize + i + 1)
		seq := r.ops.Reserve(r)
		*r.ops.Op(seq) = int(seq)
		r.ops.PublishDone(seq)
		if seq != want || r.ops.Issued() != want {
			t.Fatalf("Reserve = %d, Issued %d after PublishDone; want %d", seq, r.ops.Issued(), want)
		}
		if done, err := r.ops.Test(want); !done || err != nil {
			t.Fatalf("Test(%d) = %v, %v; want done, no error", want, done, err)
		}
		if err := r.ops.Wait(context.Background(), want); err != nil {
			t.Fatalf("Wait(%d) = %v", want, err)
		}
	}
	for seq, want := range errs {
		if done, err := r.ops.Test(seq); !done || !errors.Is(err, want) {
			t.Errorf("Test(%d) of a failed operation whose slot was reused = %v, %v; want %v", seq, done, err, want)
		}
	}
	for seq := uint64(1); seq <= r.ops.Issued(); seq++ {
		if !r.ops.Ended(seq) {
			t.Fatalf("Ended(%d) = false for a completed operation (slot done %#x)", seq, r.ops.slots[seq%RingSize].done.Load())
		}
	}
	if next := r.ops.Issued() + 1; r.ops.Ended(next) {
		t.Errorf("Ended(%d) of an operation not yet issued", next)
	}
}

// mustPanic reports f's panic message, failing t if f returns.
func mustPanic(t *testing.T, what string, f func()) string {
	t.Helper()
	msg, ok := panicked(f)
	if !ok {
		t.Errorf("%s did not panic", what)
	}
	return msg
}

func panicked(f func()) (msg string, ok bool) {
	defer func() {
		if p := recover(); p != nil {
			msg, ok = fmt.Sprint(p), true
		}
	}()
	f()
	return "", false
}

// TestMisuse: a backend that breaks the ring's rules gets a panic in
// every build, not a success, and the ring is as it was.
func TestMisuse(t *testing.T) {
	r := newRank(false)
	seq := r.issue()
	if msg := mustPanic(t, "Complete before Publish", func() { r.ops.Complete(seq+1, nil) }); !strings.Contains(msg, "completes operation #2, published 1") {
		t.Errorf("Complete before Publish: %q", msg)
	}
	mustPanic(t, "Complete(seq+RingSize) while seq is pending", func() { r.ops.Complete(seq+RingSize, nil) })
	mustPanic(t, "Complete(0)", func() { r.ops.Complete(0, nil) })
	mustPanic(t, "Publish twice", func() { r.ops.Publish(seq) })
	mustPanic(t, "Publish skipping a number", func() { r.ops.Publish(seq + 2) })
	for range RingSize - 1 {
		r.ops.Complete(r.issue(), nil)
	}
	mustPanic(t, "Publish over a pending operation", func() { r.ops.Publish(seq + RingSize) })
	mustPanic(t, "PublishDone over a pending operation", func() { r.ops.PublishDone(seq + RingSize) })
	if r.ops.Issued() != RingSize {
		t.Errorf("Issued() = %d after the misuses, want %d", r.ops.Issued(), RingSize)
	}
	if done, _ := r.ops.Test(seq); done {
		t.Errorf("operation %d done after the misuses; nothing completed it", seq)
	}
	if !r.ops.Complete(seq, nil) || !r.ops.Done(seq) {
		t.Errorf("operation %d could not complete after the misuses", seq)
	}
}

// TestWaitersDropTwice: a second Drop of a channel panics, and the set
// is as it was: a waiter registered since is counted and woken, and two
// waiters never share a channel.
func TestWaitersDropTwice(t *testing.T) {
	var w Waiters
	ch := w.Add()
	w.Drop(ch)
	mustPanic(t, "a second Drop", func() { w.Drop(ch) })
	a := w.Add()
	b := w.Add()
	if a == b {
		t.Fatal("two waiters share a channel")
	}
	if n := w.Len(); n != 2 {
		t.Errorf("Len() = %d with two waiters, want 2", n)
	}
	w.Notify()
	for i, c := range []chan struct{}{a, b} {
		select {
		case <-c:
		default:
			t.Errorf("Notify did not wake waiter %d", i)
		}
	}
	w.Drop(a)
	w.Drop(b)
	mustPanic(t, "Drop of a channel not from Add", func() { w.Drop(make(chan struct{}, 1)) })
	if n := w.Len(); n != 0 {
		t.Errorf("Len() = %d, want 0", n)
	}
}

// FuzzRing runs a sequence of ring and Waiters operations decoded from
// the input, one byte for the operation and one for its argument, on one
// goroutine, and compares every answer with a model: a map of the
// operations' states and a list of registered channels. Misuses (the
// operations the model knows to be wrong) must panic and change nothing.
func FuzzRing(f *testing.F) {
	f.Add([]byte{0, 0, 2, 0, 4, 1, 4, 2, 5, 1})
	f.Add([]byte{0, 0, 0, 0, 1, 0, 2, 1, 2, 0, 3, 0, 6, 0, 6, 1, 6, 2, 6, 3, 6, 4, 7, 1, 7, 2})
	f.Add([]byte{8, 0, 8, 0, 10, 0, 9, 0, 9, 0, 11, 0, 8, 0, 10, 0, 0, 0, 5, 1, 2, 255, 9, 1})
	long := make([]byte, 0, 4*RingSize+40)
	for i := range RingSize + 10 {
		long = append(long, 0, 0, 2, byte(i)) // issue, complete (a failure when odd)
	}
	f.Add(append(long, 0, 0, 6, 2, 4, 3, 4, 200, 7, 9))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1200 { // 600 operations: enough to reuse every slot
			data = data[:1200]
		}
		r := newRank(false)
		const (
			pending = iota + 1
			ok
			failed
		)
		state := map[uint64]int{}
		errs := map[uint64]error{}
		var issued uint64
		var chans, dropped []chan struct{}
		canceled, cancel := context.WithCancel(context.Background())
		cancel()
		free := func(seq uint64) bool { return seq <= RingSize || state[seq-RingSize] > pending }
		var open, ended []uint64                          // the operations pending, and completed
		ids := func(pick byte, want int) (uint64, bool) { // the pick-th pending (or completed, want 0) operation
			in := open
			if want == 0 {
				in = ended
			}
			if len(in) == 0 {
				return 0, false
			}
			return in[int(pick)%len(in)], true
		}
		result := func(id uint64) (bool, error) { // what Test must say
			switch {
			case id == 0 || id > issued:
				return true, comm.ErrInvalid
			case state[id] == pending:
				return false, nil
			}
			return true, errs[id]
		}
		same := func(err, want error) bool { return err == want || want == comm.ErrInvalid && errors.Is(err, want) }
		for i := 0; i+1 < len(data); i += 2 {
			op, arg := data[i]%12, data[i+1]
			seq := issued + 1
			switch op {
			case 0, 1: // issue, or issue complete
				if !free(seq) {
					continue // Reserve would wait for an operation nobody completes
				}
				if got := r.ops.Reserve(r); got != seq {
					t.Fatalf("Reserve = %d, want %d", got, seq)
				}
				*r.ops.Op(seq) = int(seq)
				issued = seq
				if op == 0 {
					r.ops.Publish(seq)
					state[seq] = pending
					open = append(open, seq)
				} else {
					r.ops.PublishDone(seq)
					state[seq], errs[seq] = ok, nil
					ended = append(ended, seq)
				}
			case 2: // complete a pending operation
				id, found := ids(arg, pending)
				if !found {
					continue
				}
				var err error
				if arg&1 != 0 {
					err = fmt.Errorf("op %d", id)
				}
				if !r.ops.Complete(id, err) {
					t.Fatalf("Complete(%d) of a pending operation did not record", id)
				}
				state[id], errs[id] = ok, err
				if err != nil {
					state[id] = failed
				}
				open = slices.DeleteFunc(open, func(s uint64) bool { return s == id })
				ended = append(ended, id)
			case 3: // complete again
				if id, found := ids(arg, 0); found && r.ops.Complete(id, errors.New("again")) {
					t.Fatalf("a second Complete(%d) recorded", id)
				}
			case 4, 5: // Test, Wait with a context that has ended
				id := uint64(arg) % (issued + 3)
				done, want := result(id)
				var err error
				if op == 4 {
					var got bool
					if got, err = r.ops.Test(id); got != done {
						t.Fatalf("Test(%d) done = %v, want %v", id, got, done)
					}
				} else if err = r.ops.Wait(canceled, id); !done {
					want = context.Canceled
					if !errors.Is(err, want) {
						t.Fatalf("Wait(%d) of a pending operation, its context ended: %v", id, err)
					}
					continue
				}
				if !same(err, want) {
					t.Fatalf("op %d: %v, want %v", id, err, want)
				}
			case 6: // misuse
				var what string
				var bad func()
				switch arg % 5 {
				case 0:
					what, bad = "Complete before Publish", func() { r.ops.Complete(seq, nil) }
				case 1:
					id, found := ids(arg, pending)
					if !found {
						continue
					}
					what, bad = "Complete(seq+RingSize) while seq is pending", func() { r.ops.Complete(id+RingSize, nil) }
				case 2:
					if free(seq) {
						what, bad = "Publish skipping a number", func() { r.ops.Publish(seq + 1) }
					} else {
						what, bad = "Publish over a pending operation", func() { r.ops.Publish(seq) }
					}
				case 3:
					if issued == 0 {
						continue
					}
					what, bad = "Publish twice", func() { r.ops.Publish(issued) }
				case 4:
					what, bad = "Complete(0)", func() { r.ops.Complete(0, nil) }
				}
				if _, p := panicked(bad); !p {
					t.Fatalf("%s did not panic", what)
				}
				if r.ops.Issued() != issued {
					t.Fatalf("%s moved Issued to %d from %d", what, r.ops.Issued(), issued)
				}
			case 7: // Done and Ended
				id := uint64(arg) % (issued + 3)
				ended := id >= 1 && state[id] > pending
				if got := r.ops.Ended(id); id > 0 && got != ended {
					t.Fatalf("Ended(%d) = %v, want %v", id, got, ended)
				}
				if got, want := r.ops.Done(id), ended && state[id+RingSize] <= pending; id > 0 && got != want {
					t.Fatalf("Done(%d) = %v, want %v", id, got, want)
				}
			case 8: // a waiter registers
				ch := r.ops.waiters.Add()
				if slices.Contains(chans, ch) {
					t.Fatal("Add returned a channel another waiter holds")
				}
				chans = append(chans, ch)
			case 9: // a waiter leaves
				if len(chans) == 0 {
					continue
				}
				k := int(arg) % len(chans)
				r.ops.waiters.Drop(chans[k])
				dropped = append(dropped, chans[k])
				chans = slices.Delete(chans, k, k+1)
			case 10: // Notify wakes every waiter
				r.ops.Notify()
				for k, ch := range chans {
					select {
					case <-ch:
					default:
						t.Fatalf("Notify did not wake waiter %d of %d", k, len(chans))
					}
				}
			case 11: // a channel dropped again
				if len(dropped) == 0 {
					continue
				}
				ch := dropped[int(arg)%len(dropped)]
				if slices.Contains(chans, ch) {
					continue // handed out again since: dropping it is legitimate
				}
				if _, p := panicked(func() { r.ops.waiters.Drop(ch) }); !p {
					t.Fatal("a second Drop of a channel did not panic")
				}
			}
			if n := r.ops.Waiting(); n != len(chans) {
				t.Fatalf("Waiting() = %d, %d waiters registered", n, len(chans))
			}
		}
	})
}
