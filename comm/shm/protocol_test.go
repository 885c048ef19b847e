package shm

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
)

// The protocol's tests run every rank of a group in one goroutine: a
// schedule says which rank takes its next step, so that an interleaving
// is a list of rank numbers, and a wrong rule shows as a wrong output, two
// verdicts on one collective, a write after a cancel or a group that can
// take no step.

// simOp is one collective of the simulated job, as every rank calls it
// unless a fault says otherwise.
type simOp struct {
	kind   comm.Kind
	count  int
	root   int
	direct bool // Direct rather than Staged
	// faults
	odd     int  // this rank (from 1; 0 none) calls it with one element more
	invalid int  // this rank (from 1) calls it with invalid arguments
	giveUp  bool // a rank whose wait for it finds a peer missing gives up
	// agree: a direct op takes the Agree step (a Mapper that can fail);
	// nomap: this rank (from 1) could not map its peers' buffers
	agree bool
	nomap int
}

// simRank is one rank of the simulation: its endpoint and where it is.
type simRank struct {
	ep    *Endpoint
	k     uint64 // the collective it is at (from 1)
	state int    // stIdle, stCalled, stSharing, stDone
	bufs  []simBufs
	errs  []error
	ok    []bool // completed without error
}

type simBufs struct{ send, recv []float32 }

const (
	stIdle = iota
	stCalled
	stGivingUp // its look found a peer missing; it gives up at its next step
	stAgreed   // published Agreed; waits for every rank's
	stSharing
	stDone
)

// sim is a group of ranks over one segment running ops.
type sim struct {
	t      testing.TB
	n      int
	ops    []simOp
	ranks  []*simRank
	failed bool // some rank gave up: the group has failed
	trace  []string
}

// simStage is the simulation's staging buffer: small, so that the tests
// cover inline, staged and direct inputs with few elements.
const simStage = 256

func newSim(t testing.TB, n int, ops []simOp) *sim {
	seg, err := NewHeap(Layout{Ranks: n, Stage: simStage})
	if err != nil {
		t.Fatal(err)
	}
	return newSimOn(t, func(int) *Segment { return seg }, n, ops)
}

// newSimOn is newSim with rank r's view of the segment seg(r).
func newSimOn(t testing.TB, seg func(r int) *Segment, n int, ops []simOp) *sim {
	s := &sim{t: t, n: n, ops: ops}
	for r := range n {
		sr := &simRank{ep: seg(r).Endpoint(r), k: 1}
		for k, op := range ops {
			sr.bufs = append(sr.bufs, simBuffers(op, n, r, uint64(k+1)))
		}
		sr.errs = make([]error, len(ops))
		sr.ok = make([]bool, len(ops))
		if len(ops) == 0 {
			sr.state = stDone
		}
		s.ranks = append(s.ranks, sr)
	}
	return s
}

// simBuffers makes rank r's buffers of collective k: an input of small
// integers (so that every order of summing them gives the same bits) and
// an output filled with a sentinel.
func simBuffers(op simOp, n, r int, k uint64) simBufs {
	in, out := op.count+1, op.count+1
	switch op.kind {
	case comm.KindAllGather:
		out = n * (op.count + 1)
	case comm.KindReduceScatter:
		in = n * (op.count + 1)
	}
	b := simBufs{send: make([]float32, in), recv: make([]float32, out)}
	for i := range b.send {
		b.send[i] = float32((r+1)*(i%7+1)) + float32(k)
	}
	for i := range b.recv {
		b.recv[i] = sentinel
	}
	if op.kind == comm.KindBroadcast {
		b.recv = b.send // in place, as comm's Broadcast is
	}
	return b
}

const sentinel = -12345

// call is rank r's call of op number k.
func (s *sim) call(r int, k uint64) (comm.Call, Flags) {
	op := s.ops[k-1]
	c := comm.Call{Kind: op.kind, Op: comm.Sum, DType: comm.Float32, Count: op.count, Root: op.root, Seq: k}
	if op.kind == comm.KindBarrier {
		c = comm.Call{Kind: op.kind, Seq: k}
	}
	if op.odd == r+1 {
		c.Count++
	}
	f := Staged
	if op.direct {
		f = Direct
	}
	if op.invalid == r+1 {
		f = Invalid
	}
	return c, f
}

// step takes rank r's next step, if it can take one, and reports whether
// it did. A rank blocked on its peers while the group has failed gives up
// (as an adapter's wait fails once its group has), and so does a rank at
// a collective whose op says giveUp.
func (s *sim) step(r int) bool {
	sr := s.ranks[r]
	k := sr.k
	switch sr.state {
	case stDone:
		return false
	case stIdle:
		if s.failed {
			s.complete(r, fmt.Errorf("rank %d: group failed before collective #%d", r, k))
			return true
		}
		c, f := s.call(r, k)
		b := sr.bufs[k-1]
		d := LocalDesc(unsafe.Pointer(unsafe.SliceData(b.send)), unsafe.Pointer(unsafe.SliceData(b.recv)))
		sr.ep.Publish(k, c, f, unsafe.Pointer(unsafe.SliceData(b.send)), &d)
		sr.state = stCalled
		s.trace = append(s.trace, fmt.Sprintf("%d:publish#%d", r, k))
		return true
	case stCalled, stGivingUp:
		op := s.ops[k-1]
		all := sr.ep.Lagging(k, Called, 0) == s.n
		switch {
		case sr.state == stGivingUp && (op.direct || !all):
			// The wait failed on its last look. A staged collective that
			// every rank has published by now goes on (one more look, as
			// an adapter's failed wait takes); a direct one is cancelled,
			// unless a rank that saw every call opened it first.
			s.trace = append(s.trace, fmt.Sprintf("%d:giveup#%d", r, k))
			s.failed = true
			if !op.direct {
				s.complete(r, fmt.Errorf("rank %d: gave up collective #%d", r, k))
				return true
			}
			if cancelled, _ := sr.ep.Cancel(k); cancelled {
				s.complete(r, fmt.Errorf("rank %d: gave up collective #%d, cancelled", r, k))
				return true
			}
		case !all:
			if !s.failed && !op.giveUp {
				return false
			}
			// The look that fails the wait: the rank gives up at its next
			// step, whatever the peers do in between.
			sr.state = stGivingUp
			return true
		default:
			if v := sr.ep.Judge(k); v != nil {
				s.complete(r, v)
				return true
			}
		}
		if !op.direct {
			sr.ep.FinishStaged(k, unsafe.Pointer(unsafe.SliceData(sr.bufs[k-1].recv)))
			s.complete(r, nil)
			return true
		}
		if op.agree && sr.state != stGivingUp {
			sr.ep.Agree(k, op.nomap != r+1)
			sr.state = stAgreed
			s.trace = append(s.trace, fmt.Sprintf("%d:agree#%d", r, k))
			return true
		}
		return s.open(r)
	case stAgreed:
		if sr.ep.Lagging(k, Agreed, 0) < s.n {
			if !s.failed {
				return false
			}
			// A wait before the gate that fails cancels it, as one for
			// the calls does: unless a rank has opened it, nobody writes.
			if cancelled, _ := sr.ep.Cancel(k); cancelled {
				s.complete(r, fmt.Errorf("rank %d: group failed during collective #%d, cancelled", r, k))
				return true
			}
			return s.open(r)
		}
		if !sr.ep.Agreement(k) {
			s.complete(r, fmt.Errorf("rank %d: collective #%d not agreed: some rank could not map", r, k))
			return true
		}
		return s.open(r)
	case stSharing:
		if sr.ep.Lagging(k, Shared, 0) < s.n {
			return false // past the gate nobody gives up: every rank shares
		}
		s.complete(r, nil)
		return true
	}
	panic("unreachable")
}

// open opens rank r's direct collective and shares it, unless a rank
// cancelled it.
func (s *sim) open(r int) bool {
	sr := s.ranks[r]
	k := sr.k
	if open, _ := sr.ep.Open(k); !open {
		s.complete(r, fmt.Errorf("rank %d: collective #%d cancelled", r, k))
		return true
	}
	sr.ep.Share(k, Local)
	sr.state = stSharing
	s.trace = append(s.trace, fmt.Sprintf("%d:share#%d", r, k))
	return true
}

func (s *sim) complete(r int, err error) {
	sr := s.ranks[r]
	sr.errs[sr.k-1], sr.ok[sr.k-1] = err, err == nil
	s.trace = append(s.trace, fmt.Sprintf("%d:done#%d(%v)", r, sr.k, err == nil))
	sr.k++
	sr.state = stIdle
	if int(sr.k) > len(s.ops) {
		sr.state = stDone
	}
}

// run takes steps in the order sched gives (each byte a rank, modulo the
// rank count; a rank that cannot step is passed over), then round robin
// until every rank is done, and fails the test if the group gets stuck.
func (s *sim) run(sched []byte) {
	for _, b := range sched {
		s.step(int(b) % s.n)
	}
	for {
		progress, done := false, true
		for r := range s.n {
			progress = s.step(r) || progress
			done = done && s.ranks[r].state == stDone
		}
		if done {
			return
		}
		if !progress {
			s.t.Fatalf("stuck: no rank can step; trace %s", strings.Join(s.trace, " "))
		}
	}
}

// check checks every outcome: the same verdict on every rank that judged
// a collective, the right output where one succeeded, no output written
// where one failed, and a group that failed only where a fault asked.
func (s *sim) check() {
	t := s.t
	for i, op := range s.ops {
		k := uint64(i + 1)
		anyOK := false
		for r, sr := range s.ranks {
			anyOK = anyOK || sr.ok[i]
			if !sr.ok[i] {
				if op.kind != comm.KindBroadcast && slices.ContainsFunc(sr.bufs[i].recv, func(v float32) bool { return v != sentinel }) {
					t.Errorf("collective #%d failed on rank %d (%v), yet its output was written: %v", k, r, sr.errs[i], sr.bufs[i].recv)
				}
				continue
			}
			if want := s.want(i, r); !slices.Equal(sr.bufs[i].recv, want) {
				t.Errorf("collective #%d (%s) on rank %d: %v, want %v; trace %s", k, op.kind, r, sr.bufs[i].recv, want, strings.Join(s.trace, " "))
			}
		}
		if op.nomap != 0 && op.direct && anyOK {
			t.Errorf("collective #%d shared although rank %d could not map", k, op.nomap-1)
		}
		faulty := op.odd != 0 || op.invalid != 0
		if faulty && anyOK {
			t.Errorf("collective #%d with a fault (%+v) succeeded on some rank", k, op)
		}
		if faulty {
			// Every rank that judged reached the same verdict.
			var v string
			for r, sr := range s.ranks {
				var inv *InvalidError
				e := sr.errs[i]
				if !errors.Is(e, comm.ErrMismatch) && !errors.As(e, &inv) {
					continue // it gave up, or the group had failed
				}
				if v == "" {
					v = e.Error()
				} else if e.Error() != v {
					t.Errorf("collective #%d: rank %d's verdict %q, another's %q", k, r, e, v)
				}
				if op.invalid != 0 && (inv == nil || !slices.Equal(inv.Ranks, []int{op.invalid - 1})) {
					t.Errorf("collective #%d: rank %d's verdict %v does not name rank %d alone", k, r, e, op.invalid-1)
				}
			}
		}
	}
	if !s.failed {
		for r, sr := range s.ranks {
			for i, op := range s.ops {
				if !sr.ok[i] && op.odd == 0 && op.invalid == 0 && (op.nomap == 0 || !op.direct) {
					t.Errorf("collective #%d failed on rank %d with no fault: %v", i+1, r, sr.errs[i])
				}
			}
		}
	}
}

// want is rank r's expected output of op i.
func (s *sim) want(i, r int) []float32 {
	op := s.ops[i]
	in := func(j int) []float32 { return simBuffers(op, s.n, j, uint64(i+1)).send }
	out := simBuffers(op, s.n, r, uint64(i+1)).recv
	c := op.count
	switch op.kind {
	case comm.KindAllReduce, comm.KindReduce:
		if op.kind == comm.KindReduce && r != op.root {
			return out
		}
		for e := range c {
			out[e] = 0
			for j := range s.n {
				out[e] += in(j)[e]
			}
		}
	case comm.KindBroadcast:
		copy(out[:c], in(op.root))
	case comm.KindAllGather:
		for j := range s.n {
			copy(out[j*c:(j+1)*c], in(j)[:c])
		}
	case comm.KindReduceScatter:
		for e := range c {
			out[e] = 0
			for j := range s.n {
				out[e] += in(j)[r*c+e]
			}
		}
	}
	return out
}

// simJob is a job of every kind of collective, staged (inline and in the
// staging buffer) and direct, in an order that puts each kind after each
// other and reuses both parities.
func simJob(n int) []simOp {
	return []simOp{
		{kind: comm.KindAllReduce, count: 3},
		{kind: comm.KindAllReduce, count: 40},
		{kind: comm.KindAllReduce, count: 100, direct: true},
		{kind: comm.KindBroadcast, count: 30, root: n - 1},
		{kind: comm.KindAllGather, count: 12},
		{kind: comm.KindReduceScatter, count: 9},
		{kind: comm.KindBarrier},
		{kind: comm.KindReduce, count: 33, root: 0, direct: true},
		{kind: comm.KindAllGather, count: 17, direct: true},
		{kind: comm.KindReduceScatter, count: 17, direct: true},
		{kind: comm.KindBroadcast, count: 70, root: 0, direct: true},
		{kind: comm.KindAllReduce, count: 64, direct: true, agree: true},
		{kind: comm.KindAllReduce, count: 2},
		{kind: comm.KindReduce, count: 50, root: n - 1},
	}
}

// TestInterleavings runs the job under schedules that stress the parity
// rule: one rank running ahead as far as the protocol lets it, the ranks
// in lockstep, and the ranks taking turns in reverse.
func TestInterleavings(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		ahead := make([]byte, 200) // rank 0 alone, as far as it gets
		lagLast := []byte{}        // every rank but the last, many times
		for range 100 {
			for r := range n - 1 {
				lagLast = append(lagLast, byte(r))
			}
		}
		reverse := []byte{}
		for range 60 {
			for r := n - 1; r >= 0; r-- {
				reverse = append(reverse, byte(r), byte(r))
			}
		}
		leads := []byte{} // rank 0 finishes and publishes the next before the others finish
		for range 60 {
			leads = append(leads, 0, 0)
			for r := 1; r < n; r++ {
				leads = append(leads, byte(r))
			}
		}
		for name, sched := range map[string][]byte{"ahead": ahead, "lag-last": lagLast, "reverse": reverse, "leads": leads, "round-robin": nil} {
			t.Run(fmt.Sprintf("%d-ranks/%s", n, name), func(t *testing.T) {
				s := newSim(t, n, simJob(n))
				s.run(sched)
				s.check()
				if s.failed {
					t.Errorf("the group failed with no fault")
				}
			})
		}
	}
}

// TestFaults: mismatched and invalid calls fail on every rank with one
// verdict; a rank that gives up cancels a direct collective for every
// rank unless a rank that saw every call opened it first, and nobody
// writes the buffers of a cancelled one.
func TestFaults(t *testing.T) {
	job := func(n int, f func(ops []simOp)) []simOp {
		ops := simJob(n)
		f(ops)
		return ops
	}
	for _, n := range []int{2, 3} {
		for _, tc := range []struct {
			name  string
			ops   []simOp
			sched []byte
		}{
			{"odd-staged", job(n, func(o []simOp) { o[1].odd = n }), nil},
			{"odd-inline", job(n, func(o []simOp) { o[0].odd = 1 }), []byte{1, 1, 1, 0}},
			{"odd-direct", job(n, func(o []simOp) { o[2].odd = 1 }), nil},
			{"invalid-staged", job(n, func(o []simOp) { o[4].invalid = 2 }), nil},
			{"invalid-direct", job(n, func(o []simOp) { o[8].invalid = 1 }), nil},
			{"nomap", job(n, func(o []simOp) { o[11].nomap = n }), nil},
			// The ranks in lockstep to the direct all-reduce #3; rank 0
			// calls it, finds the others missing and gives up before they
			// call it: cancelled everywhere.
			{"cancel", job(n, func(o []simOp) { o[2].giveUp = true }), append(lockstep(n, 2), 0, 0, 0)},
			// Rank 0 finds the last rank missing and is about to give up;
			// the last rank calls it and rank 1 opens it before rank 0
			// cancels: too late, rank 0 shares with the others.
			{"open-first", job(n, func(o []simOp) { o[2].giveUp = true }), append(lockstep(n, 2), openFirst(n)...)},
		} {
			t.Run(fmt.Sprintf("%d-ranks/%s", n, tc.name), func(t *testing.T) {
				s := newSim(t, n, tc.ops)
				s.run(tc.sched)
				s.check()
				for r, sr := range s.ranks {
					if tc.name == "cancel" && sr.ok[2] || tc.name == "open-first" && !sr.ok[2] {
						t.Errorf("collective #3 on rank %d: %v; trace %s", r, sr.errs[2], strings.Join(s.trace, " "))
					}
				}
			})
		}
	}
}

// lockstep is the schedule that takes the ranks through c staged
// collectives together: every rank publishes, then every rank finishes.
func lockstep(n, c int) []byte {
	var s []byte
	for range 2 * c {
		for r := range n {
			s = append(s, byte(r))
		}
	}
	return s
}

// openFirst: every rank but the last publishes, rank 0 looks and finds the
// last missing, the last publishes, rank 1 opens and shares, rank 0 tries
// to cancel.
func openFirst(n int) []byte {
	var s []byte
	for r := range n - 1 {
		s = append(s, byte(r))
	}
	return append(s, 0, byte(n-1), 1, 0)
}

// FuzzInterleaving runs a job chosen by the input under a schedule chosen
// by the input: 2 to 4 ranks, collectives of every kind and path, faults
// of every kind.
func FuzzInterleaving(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8}, []byte{0, 0, 0, 1, 1, 0, 1})
	f.Add([]byte{1, 2, 200, 31, 77, 5}, []byte{1, 1, 1, 1, 0, 0, 0, 0})
	f.Add([]byte{2, 9, 9, 9, 9, 9, 9, 9}, []byte{2, 2, 2, 1, 1, 1, 0, 0, 0})
	kinds := []comm.Kind{comm.KindAllReduce, comm.KindBroadcast, comm.KindReduce, comm.KindAllGather, comm.KindReduceScatter, comm.KindBarrier}
	f.Fuzz(func(t *testing.T, job, sched []byte) {
		if len(job) == 0 || len(job) > 40 || len(sched) > 2000 {
			return
		}
		n := 2 + int(job[0])%3
		var ops []simOp
		for _, b := range job[1:] {
			op := simOp{kind: kinds[int(b)%len(kinds)], direct: b&0x08 != 0, root: int(b>>4) % n, agree: b&0x10 != 0}
			switch (b >> 4) % 4 {
			case 0:
				op.count = 1 + int(b)%5 // inline
			case 1:
				op.count = 7 + int(b)%40 // staged
			default:
				op.count = 20 + int(b)%90
			}
			if !op.direct && StagedBytes(comm.Call{Kind: op.kind, DType: comm.Float32, Count: op.count + 1}, n) > simStage {
				op.direct = true
			}
			if op.kind == comm.KindBarrier {
				op.count, op.direct = 0, false
			}
			switch b >> 6 {
			case 1:
				if b&0x20 != 0 && op.kind != comm.KindBarrier {
					op.odd = 1 + int(b)%n
				}
			case 2:
				if b&0x20 != 0 {
					op.invalid = 1 + int(b)%n
				} else if op.agree {
					op.nomap = 1 + int(b)%n
				}
			case 3:
				if b&0x20 != 0 {
					op.giveUp = true
				}
			}
			ops = append(ops, op)
		}
		s := newSim(t, n, ops)
		s.run(sched)
		s.check()
	})
}

// TestJudgePaths: the same calls, staged on one rank and direct on the
// other, are a mismatch on both: neither reads the other's stale staging
// buffer or descriptor.
func TestJudgePaths(t *testing.T) {
	seg, err := NewHeap(Layout{Ranks: 2, Stage: simStage})
	if err != nil {
		t.Fatal(err)
	}
	c := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum, DType: comm.Float32, Count: 8, Seq: 1}
	in := make([]float32, 8)
	d := LocalDesc(unsafe.Pointer(&in[0]), unsafe.Pointer(&in[0]))
	seg.Endpoint(0).Publish(1, c, Staged, unsafe.Pointer(&in[0]), nil)
	seg.Endpoint(1).Publish(1, c, Direct, nil, &d)
	for r := range 2 {
		err := seg.Endpoint(r).Judge(1)
		if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "rank 0: staged; rank 1: direct") {
			t.Errorf("rank %d: %v, want a mismatch naming both paths", r, err)
		}
	}
}

// TestStreamed runs two-rank direct all-reduces, out of place, whose
// slices are past Layout.StreamMin: Share writes both outputs with
// streaming stores, and every rank gets the same result as the ordinary
// stores give (check).
func TestStreamed(t *testing.T) {
	seg, err := NewHeap(Layout{Ranks: 2, Stage: simStage, StreamMin: 64})
	if err != nil {
		t.Fatal(err)
	}
	var ops []simOp
	for _, count := range []int{16, 33, 1000, 4099} {
		ops = append(ops, simOp{kind: comm.KindAllReduce, count: count, direct: true})
	}
	s := newSimOn(t, func(int) *Segment { return seg }, 2, ops)
	s.run(nil)
	s.check()
}
