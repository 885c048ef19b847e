package checked_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/checked"
	"github.com/ddpgo/ddpgo/inproc"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// grouper is an inproc rank that pretends to batch: it records, at the
// outermost GroupStart and GroupEnd, where its groups begin and end, and
// every collective it receives, and runs every call at once (inproc needs
// no group to run collectives in order). It also supplies kernels of its
// own, to check that the wrapper passes them on.
type grouper struct {
	*inproc.Comm
	mu     sync.Mutex
	depth  int
	events []string
}

type kernels struct{ comm.Kernels }

var theKernels = kernels{comm.HostKernels()}

func (g *grouper) Kernels() comm.Kernels { return theKernels }

func (g *grouper) log(e string) {
	g.mu.Lock()
	g.events = append(g.events, e)
	g.mu.Unlock()
}

func (g *grouper) GroupStart() {
	g.mu.Lock()
	g.depth++
	if g.depth == 1 {
		g.events = append(g.events, "start")
	}
	g.mu.Unlock()
}

func (g *grouper) GroupEnd() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.depth--
	if g.depth == 0 {
		g.events = append(g.events, "end")
	}
	return nil
}

func (g *grouper) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	g.log("all_reduce")
	return g.Comm.AllReduce(send, recv, op)
}

func (g *grouper) Broadcast(buf comm.Buffer, root int) comm.Work {
	g.log("broadcast")
	return g.Comm.Broadcast(buf, root)
}

func (g *grouper) AllGather(send, recv comm.Buffer) comm.Work {
	g.log("all_gather")
	return g.Comm.AllGather(send, recv)
}

// TestGroups: a group's calls are checked together and launched together:
// the fingerprint exchanges in one backend group, the calls that agree in
// another; a mismatched call in the group fails on every rank while the
// others run. Nested groups are one group. The wrapper is a Grouper and a
// KernelSource because the backend is.
func TestGroups(t *testing.T) {
	cs, err := inproc.NewGroup(2)
	if err != nil {
		t.Fatal(err)
	}
	gs := []*grouper{{Comm: cs[0]}, {Comm: cs[1]}}
	ws := wrapAll(t, []comm.Communicator{gs[0], gs[1]}, checked.Options{})
	if _, ok := ws[0].(comm.Grouper); !ok {
		t.Fatal("the wrapper of a Grouper is not a comm.Grouper")
	}
	if ks, ok := ws[0].(comm.KernelSource); !ok || ks.Kernels() != theKernels {
		t.Fatal("the wrapper does not pass the backend's kernels on")
	}
	bufs := [][]float32{{1, 2}, {10, 20}}
	bc := [][]float32{{5}, {6}}
	mx := [][]float32{{3}, {4}}
	works := make([][]comm.Work, 2)
	for r, c := range ws {
		comm.GroupStart(c)
		works[r] = append(works[r], c.AllReduce(comm.Float32s(bufs[r]), comm.Float32s(bufs[r]), comm.Sum))
		comm.GroupStart(c)                                                // nested: still one group
		works[r] = append(works[r], c.Broadcast(comm.Float32s(bc[r]), r)) // roots differ
		if err := comm.GroupEnd(c); err != nil {
			t.Fatal(err)
		}
		works[r] = append(works[r], c.AllReduce(comm.Float32s(mx[r]), comm.Float32s(mx[r]), comm.Max))
		if err := comm.GroupEnd(c); err != nil {
			t.Fatal(err)
		}
	}
	for r := range ws {
		errs := testutil.WaitAll(t, works[r]...)
		if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], comm.ErrMismatch) {
			t.Errorf("rank %d: %v; want nil, ErrMismatch, nil", r, errs)
		}
		if bufs[r][0] != 11 || bufs[r][1] != 22 || mx[r][0] != 4 || bc[r][0] != float32(5+r) {
			t.Errorf("rank %d: %v, %v, %v; want [11 22], [4] and its broadcast buffer untouched", r, bufs[r], mx[r], bc[r])
		}
		want := []string{"start", "all_gather", "all_gather", "all_gather", "end", "start", "all_reduce", "all_reduce", "end"}
		gs[r].mu.Lock()
		got := slices.Clone(gs[r].events)
		gs[r].mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("rank %d: the backend saw %v, want %v", r, got, want)
		}
	}
	if err := comm.GroupEnd(ws[0]); !errors.Is(err, comm.ErrInvalid) {
		t.Errorf("GroupEnd without GroupStart: %v; want ErrInvalid", err)
	}
}
