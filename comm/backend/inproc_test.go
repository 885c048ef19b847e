package backend_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// TestInprocHugeBlocks issues, on 4 in-process ranks, a ReduceScatter
// whose recv has 2^62 float32 elements and whose send has none, and an
// AllGather the other way round: 4·2^62 wraps to 0 in an int, and a check
// that multiplied let inproc slice 2^64 bytes from a nil pointer (a
// panic). Every rank's Work must fail with comm.ErrInvalid instead.
func TestInprocHugeBlocks(t *testing.T) {
	const n = 4
	cs, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	mem := make([]float32, n)
	huge := func(r int) comm.Buffer {
		b := comm.Float32s(mem[r : r+1])
		b.Count = 1 << 62
		return b
	}
	none := comm.Buffer{DType: comm.Float32}
	for _, tc := range []struct {
		name  string
		issue func(c comm.Communicator) comm.Work
		want  string
	}{
		{"reduce_scatter", func(c comm.Communicator) comm.Work { return c.ReduceScatter(none, huge(c.Rank()), comm.Sum) }, "recv has count 4611686018427387904"},
		{"all_gather", func(c comm.Communicator) comm.Work { return c.AllGather(huge(c.Rank()), none) }, "send has count 4611686018427387904"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r, c := range cs {
				wg.Go(func() { errs[r] = tc.issue(c).Wait(context.Background()) })
			}
			wg.Wait()
			for r, err := range errs {
				if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: %v; want comm.ErrInvalid saying %q", r, err, tc.want)
				}
			}
		})
	}
}
