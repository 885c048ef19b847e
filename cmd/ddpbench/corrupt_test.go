package main

import (
	"context"
	"strings"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/launch"
)

// corruptComm is a communicator whose all-reduce results are damaged on
// rank 1: the last byte of each of the first two elements is flipped once
// the operation completes, as a faulty transport would.
type corruptComm struct{ comm.Communicator }

func (c corruptComm) AllReduce(send, buf comm.Buffer, op comm.Op) comm.Work {
	w := c.Communicator.AllReduce(send, buf, op)
	if c.Rank() != 1 || buf.Count == 0 {
		return w
	}
	return comm.NewWork(damage{w, buf}, 0)
}

type damage struct {
	w   comm.Work
	buf comm.Buffer
}

func (d damage) WaitOp(ctx context.Context, _ uint64) error {
	if err := d.w.Wait(ctx); err != nil {
		return err
	}
	b, es := d.buf.AsBytes(), d.buf.DType.Size()
	for i := range min(2, d.buf.Count) {
		b[(i+1)*es-1] ^= 0x7f
	}
	return nil
}

func (d damage) TestOp(uint64) (bool, error) { return d.w.Test() }

// TestCollectiveCountsCorruption runs the command end to end on a backend
// that damages two elements per all-reduce: every checked placement must
// count them, the footer must count the failed tests (as nccl-tests), and
// the exit status must be non-zero.
func TestCollectiveCountsCorruption(t *testing.T) {
	saved := backends
	defer func() { backends = saved }()
	backends = append([]backend{{Backend: launch.Backend{Name: "corrupt"}, open: func(n int) ([]comm.Communicator, error) {
		g, err := launch.Open(context.Background(), "inproc", launch.Options{Ranks: n})
		for i := range g {
			g[i] = corruptComm{g[i]}
		}
		return g, err
	}}}, saved...)

	code, stdout, stderr := run(t, "collective", "--backend", "corrupt", "-b", "1K", "-e", "16K", "-n", "1", "-w", "0")
	if code != 1 || !strings.Contains(stderr, "12 wrong elements in 6 of") {
		t.Errorf("exit status %d, stderr %q: want 1 and the wrong elements", code, stderr)
	}
	rows := 0
	for _, line := range strings.Split(stdout, "\n") {
		f := strings.Fields(line)
		if len(f) != 13 || strings.HasPrefix(line, "#") {
			continue
		}
		rows++
		if f[8] != "2" || f[12] != "2" {
			t.Errorf("row %q: #wrong %s and %s, want 2 and 2", line, f[8], f[12])
		}
	}
	if rows != 3 || !strings.Contains(stdout, "# Out of bounds values : 6 FAILED\n") {
		t.Errorf("%d rows; output:\n%s", rows, stdout)
	}

	// Without the check nothing is counted and nothing fails.
	code, stdout, stderr = run(t, "collective", "--backend", "corrupt", "-b", "1K", "-e", "4K", "-n", "1", "-w", "0", "-c", "0")
	if code != 0 || !strings.Contains(stdout, "# Out of bounds values : 0 OK\n") || !strings.Contains(stdout, "N/A") {
		t.Errorf("-c 0: exit status %d, stderr %q, output:\n%s", code, stderr, stdout)
	}
}
