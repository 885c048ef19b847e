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

// brokenEnv names, in a child process, the driver that TestBrokenBackend
// runs the suite with.
const brokenEnv = "COMMTEST_BROKEN"

// TestSuiteFails runs the suite on a backend broken on purpose (see
// brokenComm), in a child process since a failing suite fails its test,
// and checks from the child's output that the suite failed the right
// checks, on every rank, naming the broken rank and what went wrong, and
// that the checks after them passed: the ranks stayed in step.
func TestSuiteFails(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("in the child process")
	}
	// Rank 1's float sums are corrupted, its int32 sums never issued, and
	// its Wait ignores the context in WaitDeadline.
	want := []string{
		`rank 1: all_reduce\(sum\) of float, count 7, in place: element 3 of 7 = -?\d+, want -?\d+ \(and \d+ more failures\)`,
		`rank 0: all_reduce\(sum\) of int32, count 7, in place: the operation \(id \d+\) did not complete within 1s`,
		`rank 1: all_reduce\(sum\) of int32, count 7, in place: the operation \(id \d+\) did not complete within 1s`,
		`rank 1: Wait with a context that expired after 20ms has not returned after 500ms`,
	}
	forbid := []string{"rank 0: all_reduce(sum) of float", "rank 0: Wait"}
	failing := []string{"AllReduce/float/sum", "AllReduce/int32/sum", "WaitDeadline"}
	passing := []string{"AllReduce/float/avg", "AllReduce/int32/avg", "Barrier"}
	checks := "^(AllReduce|WaitDeadline|Barrier)$/^(float|int32)?$/^(sum|avg)?$"
	for _, driver := range []string{"run", "spmd"} {
		t.Run(driver, func(t *testing.T) {
			// The children mostly wait for their deadlines.
			t.Parallel()
			pattern := "^TestBrokenBackend$/^2ranks$/" + checks
			want := want
			prefixes := []string{"TestBrokenBackend/2ranks/"}
			if driver == "spmd" {
				pattern = "^TestBrokenBackend$/^rank[01]$/^2ranks$/" + checks
				// The healthy rank fails the checks too, naming the
				// broken one.
				want = append(want, `rank\(s\) \[1\] failed this check`)
				prefixes = []string{"TestBrokenBackend/rank0/2ranks/", "TestBrokenBackend/rank1/2ranks/"}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=90s")
			// A race-enabled child would sleep a second before it exits.
			cmd.Env = append(os.Environ(), brokenEnv+"="+driver, "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
			out, err := cmd.CombinedOutput()
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("the suite on a broken backend did not fail (error %v):\n%s", err, out)
			}
			for _, w := range want {
				if !regexp.MustCompile(w).Match(out) {
					t.Errorf("the output does not match %q:\n%s", w, out)
				}
			}
			for _, f := range forbid {
				if strings.Contains(string(out), f) {
					t.Errorf("the output contains %q:\n%s", f, out)
				}
			}
			for _, pre := range prefixes {
				for _, c := range failing {
					if !strings.Contains(string(out), "--- FAIL: "+pre+c+" ") {
						t.Errorf("%s%s did not fail:\n%s", pre, c, out)
					}
				}
				for _, c := range passing {
					if !strings.Contains(string(out), "--- PASS: "+pre+c+" ") {
						t.Errorf("%s%s did not pass after the failures: the ranks fell out of step:\n%s", pre, c, out)
					}
				}
			}
		})
	}
}

// TestBrokenBackend runs the suite on brokenComm with the driver brokenEnv
// names; only TestSuiteFails runs it.
func TestBrokenBackend(t *testing.T) {
	driver := os.Getenv(brokenEnv)
	if driver == "" {
		t.Skip("run by TestSuiteFails in a child process")
	}
	newGroup := func(t *testing.T, n int) []comm.Communicator {
		cs, err := inproc.NewGroup(n)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]comm.Communicator, n)
		for r, c := range cs {
			out[r] = &brokenComm{Communicator: c}
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
		t.Fatalf("%s=%q: unknown driver", brokenEnv, driver)
	}
}

// brokenComm breaks rank 1's all_reduce: it adds 1 to element 3 of the
// float32 sums of 7 elements or more, never issues the int32 sums of 7
// elements or more (their Works never complete), and waits for an
// all_reduce of 2 float32 elements (WaitDeadline's) as if its context
// never ended. The control communicator's all_reduce (int32 Max) is left
// alone.
type brokenComm struct {
	comm.Communicator
}

func (b *brokenComm) AllReduce(send, recv comm.Buffer, op comm.Op) comm.Work {
	if b.Rank() != 1 {
		return b.Communicator.AllReduce(send, recv, op)
	}
	switch {
	case send.DType == comm.Float32 && send.Count == 2:
		return comm.NewWork(ignoring{b.Communicator.AllReduce(send, recv, op)}, 1)
	case op != comm.Sum || send.Count < 7:
	case send.DType == comm.Float32:
		return comm.NewWork(&corrupting{w: b.Communicator.AllReduce(send, recv, op), buf: recv}, 1)
	case send.DType == comm.Int32:
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
