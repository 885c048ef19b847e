package ddp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

var bnBuffers = []Param{
	{Name: "bn.running_mean", Shape: []int{4}},
	{Name: "bn.running_var", Shape: []int{3}, DType: comm.Float64},
	{Name: "bn.num_batches_tracked", Shape: []int{}, DType: comm.Int64},
	{Name: "bn2.running_mean", Shape: []int{2}},
}

// bnForward is rank's forward pass at step s: it moves every buffer to
// values of its own, as BatchNorm's running statistics diverge on ranks
// that see different data.
func bnForward(r *Reducer, rank, s int) (want [][]float64, err error) {
	for i := range bnBuffers {
		b, err := r.Buffer(i)
		if err != nil {
			return nil, err
		}
		vals := make([]float64, b.Count)
		for j := range b.Count {
			v := float64(1000*rank + 10*s + j)
			switch b.DType {
			case comm.Int64:
				b.AsInt64()[j] += int64(rank + 1)
				vals[j] = float64(b.AsInt64()[j])
				continue
			case comm.Float64:
				v += 0.1
				b.AsFloat64()[j] = v
			default:
				b.AsFloat32()[j] = float32(v)
			}
			vals[j] = v
		}
		want = append(want, vals)
	}
	return want, nil
}

func bnValues(r *Reducer) [][]float64 {
	var out [][]float64
	for i := range bnBuffers {
		b, _ := r.Buffer(i)
		vals := make([]float64, b.Count)
		for j := range b.Count {
			switch b.DType {
			case comm.Int64:
				vals[j] = float64(b.AsInt64()[j])
			case comm.Float64:
				vals[j] = b.AsFloat64()[j]
			default:
				vals[j] = float64(b.AsFloat32()[j])
			}
		}
		out = append(out, vals)
	}
	return out
}

// TestBuffers: ranks whose buffers diverge in forward end every synced
// step with rank 0's values, of every dtype; a no-sync step leaves each
// rank's own.
func TestBuffers(t *testing.T) {
	testutil.NoLeak(t)
	for name, mod := range map[string]func(*Options){
		"default":      nil,
		"window1-copy": func(o *Options) { o.MaxInFlight = 1; o.CopyGrads = true },
	} {
		t.Run(name, func(t *testing.T) {
			const n = 3
			cs := newTestGroup(t, n)
			rank0 := make(chan [][]float64, 1)
			errs := withReducers(t, cs, threeParams, func() Options {
				o := Options{Buffers: bnBuffers, BucketCap: 24, FirstBucketCap: 24, Timeout: time.Minute}
				if mod != nil {
					mod(&o)
				}
				return o
			}, func(rank int, r *Reducer) error {
				for s, mode := range []SyncMode{Sync, NoSync, Sync, Sync, NoSync, Sync} {
					mine, err := bnForward(r, rank, s)
					if err != nil {
						return err
					}
					if err := r.Begin(mode); err != nil {
						return err
					}
					for i := len(threeParams) - 1; i >= 0; i-- {
						if err := r.Ready(i); err != nil {
							return err
						}
					}
					if err := r.Wait(context.Background()); err != nil {
						return err
					}
					want := mine
					if mode == Sync {
						if rank == 0 {
							for range n - 1 {
								rank0 <- mine
							}
						} else {
							want = <-rank0
						}
					}
					if got := fmt.Sprint(bnValues(r)); got != fmt.Sprint(want) {
						return fmt.Errorf("step %d (%v): buffers %s, want %v", s+1, mode, got, want)
					}
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBufferErrors(t *testing.T) {
	testutil.NoLeak(t)
	r, err := New(context.Background(), commtest.Solo{}, threeParams, Options{Buffers: append(bnBuffers, Param{Name: "bn.running_mean"})})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Buffer(len(bnBuffers) + 1)
	wantErr(t, err, ErrIndex, "Buffer(5)", "5 buffers")
	if i, err := r.BufferIndex("bn.running_var"); i != 1 || err != nil {
		t.Errorf("BufferIndex = %d, %v", i, err)
	}
	_, err = r.BufferIndex("bn.running_mean")
	wantErr(t, err, ErrIndex, "several buffers")
	r.Close()
	_, err = r.Buffer(0)
	wantErr(t, err, ErrClosed)

	cs := newTestGroup(t, 2)
	errs := runRanks(cs, func(rank int, c comm.Communicator) error {
		bufs := bnBuffers[:2+rank]
		r, err := New(context.Background(), c, threeParams, Options{Buffers: bufs})
		if err == nil {
			r.Close()
		}
		return err
	})
	for _, err := range errs {
		wantErr(t, err, ErrParamMismatch, "Options.Buffers differ between rank 0 and rank 1")
	}
}
