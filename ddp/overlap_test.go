package ddp

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
)

// slowComm is a one-rank communicator whose all-reduce takes d of (fake)
// time, so that a synctest bubble gives the step an exact timeline.
type slowComm struct {
	commtest.Solo
	d time.Duration
}

func (c slowComm) AllReduce(_, _ comm.Buffer, _ comm.Op) comm.Work { return comm.NewWork(c, 0) }

func (c slowComm) WaitOp(ctx context.Context, _ uint64) error {
	t := time.NewTimer(c.d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c slowComm) TestOp(uint64) (bool, error) { return false, nil }

// TestOverlapTimeline runs a step in fake time: three buckets of one
// parameter each, gradients 10ms apart, all-reduces of 5ms. Buckets 0 and 1
// are reduced while backward still runs; bucket 2 after it.
func TestOverlapTimeline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		params := []Param{{Name: "a", Shape: []int{4}}, {Name: "b", Shape: []int{4}}, {Name: "c", Shape: []int{4}}}
		r, err := New(context.Background(), slowComm{d: 5 * time.Millisecond}, params, Options{BucketCap: 16, FirstBucketCap: 16, KeepLayout: true})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for range 2 {
			if err := r.Begin(Sync); err != nil {
				t.Fatal(err)
			}
			for i := 2; i >= 0; i-- {
				if err := r.Ready(i); err != nil {
					t.Fatal(err)
				}
				if i > 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if err := r.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			ms := time.Millisecond
			st := r.Stats()
			if st.FirstReady != 0 || st.LastReady != 20*ms || st.Compute != 20*ms || st.Wall != 25*ms {
				t.Errorf("first %v last %v compute %v wall %v; want 0, 20ms, 20ms, 25ms", st.FirstReady, st.LastReady, st.Compute, st.Wall)
			}
			if st.Comm != 15*ms || st.Overlap != 10*ms || st.OverlapRatio != 2.0/3 {
				t.Errorf("comm %v overlap %v ratio %v; want 15ms, 10ms, 2/3", st.Comm, st.Overlap, st.OverlapRatio)
			}
			for k, b := range st.Buckets {
				ready := time.Duration(k) * 10 * ms
				if b.Ready != ready || b.Launch != ready || b.CollectiveStart != ready || b.CollectiveEnd != ready+5*ms || b.Done != ready+5*ms || b.Latency() != 5*ms {
					t.Errorf("bucket %d: %+v; want ready and launch at %v, done 5ms later", k, b, ready)
				}
			}
			for i, want := range []time.Duration{20 * ms, 10 * ms, 0} {
				if st.ParamReady[i] != want {
					t.Errorf("param %d ready at %v, want %v", i, st.ParamReady[i], want)
				}
			}
		}
	})
}
