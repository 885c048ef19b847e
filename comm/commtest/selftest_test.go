package commtest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/inproc"
)

// brokenEnv selects, in a child process, the way TestBrokenBackend breaks
// its backend and the driver that runs the suite on it: "mode/driver".
const brokenEnv = "COMMTEST_BROKEN"

// TestSuiteFails runs the suite on backends broken on purpose, in a child
// process (a failing suite fails its test), and checks from the child's
// output that the suite failed the right checks, on every rank, naming the
// broken rank and what went wrong, and that the checks after them passed:
// the ranks stayed in step.
func TestSuiteFails(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("in the child process")
	}
	tests := []struct {
		mode    string
		checks  string   // the -test.run pattern below the group level
		want    []string // regular expressions the output must match
		forbid  []string
		passing []string // checks that must pass on every rank
	}{
		{
			mode:   "corrupt",
			checks: "^AllReduce$/^float$/^(sum|avg)$",
			want: []string{
				`rank 1: all_reduce\(sum\) of float, count 7, in place: element 3 of 7 = -?\d+, want -?\d+ \(and \d+ more failures\)`,
			},
			forbid:  []string{"did not complete", "rank 0: all_reduce"},
			passing: []string{"AllReduce/float/avg"},
		},
		{
			mode:   "deadline",
			checks: "^(WaitDeadline|Barrier)$",
			want: []string{
				`rank 1: Wait with a context that expired after 20ms has not returned after 500ms`,
			},
			forbid:  []string{"did not complete", "rank 0: Wait"},
			passing: []string{"Barrier"},
		},
		{
			mode:   "stall",
			checks: "^AllReduce$/^float$/^(sum|avg)$",
			want: []string{
				`rank 0: all_reduce\(sum\) of float, count 7, in place: the operation \(id \d+\) did not complete within 1s`,
				`rank 1: all_reduce\(sum\) of float, count 7, in place: the operation \(id \d+\) did not complete within 1s`,
			},
			passing: []string{"AllReduce/float/avg"},
		},
	}
	for _, tt := range tests {
		for _, driver := range []string{"run", "spmd"} {
			t.Run(tt.mode+"/"+driver, func(t *testing.T) {
				// The children mostly wait for their deadlines.
				t.Parallel()
				pattern := "^TestBrokenBackend$/^2ranks$/" + tt.checks
				want := tt.want
				prefixes := []string{"TestBrokenBackend/2ranks/"}
				if driver == "spmd" {
					pattern = "^TestBrokenBackend$/^rank[01]$/^2ranks$/" + tt.checks
					// The healthy rank fails the check too, naming the
					// broken one, unless it failed on its own.
					if tt.mode != "stall" {
						want = append(want, `rank\(s\) \[1\] failed this check`)
					}
					prefixes = []string{"TestBrokenBackend/rank0/2ranks/", "TestBrokenBackend/rank1/2ranks/"}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=90s")
				cmd.Env = append(os.Environ(), brokenEnv+"="+tt.mode+"/"+driver)
				out, err := cmd.CombinedOutput()
				if _, ok := err.(*exec.ExitError); !ok {
					t.Fatalf("the suite on a backend broken by %q did not fail (error %v):\n%s", tt.mode, err, out)
				}
				for _, w := range want {
					if !regexp.MustCompile(w).Match(out) {
						t.Errorf("the output does not match %q:\n%s", w, out)
					}
				}
				for _, f := range tt.forbid {
					if strings.Contains(string(out), f) {
						t.Errorf("the output contains %q:\n%s", f, out)
					}
				}
				for _, p := range tt.passing {
					for _, pre := range prefixes {
						if !strings.Contains(string(out), "--- PASS: "+pre+p+" ") {
							t.Errorf("%s%s did not pass after the failure: the ranks fell out of step:\n%s", pre, p, out)
						}
					}
				}
			})
		}
	}
}

// TestBrokenBackend runs the suite on a backend broken as brokenEnv says;
// only TestSuiteFails runs it.
func TestBrokenBackend(t *testing.T) {
	mode, driver, ok := strings.Cut(os.Getenv(brokenEnv), "/")
	if !ok {
		t.Skip("run by TestSuiteFails in a child process")
	}
	newGroup := func(t *testing.T, n int) []comm.Communicator {
		cs, err := inproc.NewGroup(n)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]comm.Communicator, n)
		for r, c := range cs {
			out[r] = &brokenComm{Communicator: c, mode: mode}
		}
		return out
	}
	opts := []commtest.Option{commtest.AbortReachesPeers(), commtest.WaitTimeout(time.Second), commtest.Large(0)}
	switch driver {
	case "run":
		commtest.Run(t, newGroup, append(opts, commtest.Ranks(2))...)
	case "spmd":
		commtest.RunGoroutines(t, 2, newGroup, opts...)
	default:
		t.Fatalf("%s=%q: unknown driver %q", brokenEnv, os.Getenv(brokenEnv), driver)
	}
}

// brokenComm breaks rank 1's all_reduce of float32 counts of 7 or more:
// "corrupt" adds 1 to element 3 of the sums, "stall" never issues the sums
// (their Works never complete), and "deadline" waits for every all_reduce
// as if its context never ended.
type brokenComm struct {
	comm.Communicator
	mode string
}

func (b *brokenComm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	if b.Rank() != 1 || send.DType != comm.Float32 {
		return b.Communicator.AllReduce(send, recv, op)
	}
	switch {
	case b.mode == "deadline":
		return comm.NewWork(ignoring{b.Communicator.AllReduce(send, recv, op)}, 1)
	case op != comm.Sum || send.Count < 7:
	case b.mode == "corrupt":
		return comm.NewWork(&corrupting{w: b.Communicator.AllReduce(send, recv, op), buf: recv}, 1)
	case b.mode == "stall":
		return comm.NewWork(stalled{}, 1)
	}
	return b.Communicator.AllReduce(send, recv, op)
}

type corrupting struct {
	w    comm.Work
	buf  comm.Buffer
	once sync.Once
}

func (c *corrupting) WaitOp(ctx context.Context, _ uint64) error {
	err := c.w.Wait(ctx)
	if err == nil {
		c.once.Do(c.corrupt)
	}
	return err
}

func (c *corrupting) TestOp(uint64) (bool, error) {
	done, err := c.w.Test()
	if done && err == nil {
		c.once.Do(c.corrupt)
	}
	return done, err
}

func (c *corrupting) corrupt() { c.buf.AsFloat32()[3]++ }

type ignoring struct{ w comm.Work }

func (i ignoring) WaitOp(context.Context, uint64) error { return i.w.Wait(context.Background()) }
func (i ignoring) TestOp(uint64) (bool, error)          { return i.w.Test() }

type stalled struct{}

func (stalled) WaitOp(ctx context.Context, _ uint64) error {
	<-ctx.Done()
	return fmt.Errorf("an all_reduce never issued: %w", ctx.Err())
}

func (stalled) TestOp(uint64) (bool, error) { return false, nil }
