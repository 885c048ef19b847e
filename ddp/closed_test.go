package ddp

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm/commtest"
)

// TestGradAfterClose: a gradient slice used after Close (of a Reducer with
// its own pool of host memory) is harmless: it reads zeros and takes
// writes, instead of faulting, which no recover could catch. In a child
// process, since before the fix the fault killed it.
func TestGradAfterClose(t *testing.T) {
	if os.Getenv("DDPGO_TEST_GRAD_AFTER_CLOSE") == "1" {
		r, err := New(context.Background(), commtest.Solo{}, threeParams, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Begin(Sync); err != nil {
			t.Fatal(err)
		}
		g := mustGrad(r, 0)
		for i := range g {
			g[i] = 1
		}
		if err := r.Ready(0); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		for i, x := range g {
			if x != 0 {
				t.Fatalf("after Close, element %d of a Grad slice reads %v, want 0", i, x)
			}
			g[i] = 2
		}
		if g[0] != 2 {
			t.Fatalf("after Close, a write into a Grad slice reads back %v", g[0])
		}
		os.Stdout.WriteString("survived\n")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGradAfterClose$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "DDPGO_TEST_GRAD_AFTER_CLOSE=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "survived") {
		t.Fatalf("a Grad slice used after Close: %v\n%s", err, out)
	}
}
