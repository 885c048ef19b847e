package ddp

import (
	"context"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/hooks"
	"github.com/ddpgo/ddpgo/internal/testutil"
)

// TestMismatchKinds builds three ranks of which rank 2 has a different
// model or options, one kind of difference per case: every rank fails in
// New with ErrParamMismatch, naming the parameter (or option) and the
// ranks, before any gradient is reduced. Names alone may differ, as in
// PyTorch (the last case).
func TestMismatchKinds(t *testing.T) {
	testutil.NoLeak(t)
	params := func(f func([]Param) []Param) []Param {
		ps := append([]Param(nil), threeParams...)
		return f(ps)
	}
	same := func(ps []Param) []Param { return ps }
	buffers := []Param{{Name: "bn.running_mean", Shape: []int{3}}}
	tests := []struct {
		name   string
		rank2  []Param
		o2     Options
		substr []string // nil: New succeeds everywhere
	}{
		{"shape", params(func(p []Param) []Param { p[1] = Param{Name: "fc.weight", Shape: []int{3, 3}}; return p }), Options{},
			[]string{"parameter 1", "rank 2", `"fc.weight" [2 3]`, `"fc.weight" [3 3]`}},
		{"same numel, other shape", params(func(p []Param) []Param { p[0].Shape = []int{12}; return p }), Options{},
			[]string{"parameter 0", "rank 2", "[4 3]", "[12]"}},
		{"an extra unit dimension", params(func(p []Param) []Param { p[2].Shape = []int{2, 1}; return p }), Options{},
			[]string{"parameter 2", "rank 2", "[2]", "[2 1]"}},
		{"fewer parameters", params(func(p []Param) []Param { return p[:2] }), Options{},
			[]string{"parameter 2", "rank 2 has no parameter 2", "rank 0 has 3 parameters, rank 2 has 2"}},
		{"more parameters", params(func(p []Param) []Param { return append(p, Param{Name: "head.bias", Shape: []int{5}}) }), Options{},
			[]string{"parameter 3", "rank 0 has no parameter 3", `rank 2 has "head.bias" [5]`}},
		{"dtype", params(func(p []Param) []Param { p[1].DType = comm.Float64; return p }), Options{},
			[]string{"parameter 1", "rank 2", "[2 3] float,", "[2 3] double"}},
		{"order", params(func(p []Param) []Param { p[0], p[1] = p[1], p[0]; return p }), Options{},
			[]string{"parameter 0", "rank 2", `rank 0 has "embed.weight" [4 3]`, `rank 2 has "fc.weight" [2 3]`}},
		{"hook", same(threeParams), Options{Hook: hooks.FP16()},
			[]string{"rank 2", `rank 0 has hook "avg"`, `rank 2 has hook "fp16"`}},
		{"bucket cap", same(threeParams), Options{BucketCap: 1 << 20},
			[]string{"rank 2", "bucket caps [1048576 26214400]", "bucket caps [1048576 1048576]"}},
		{"first bucket cap", same(threeParams), Options{FirstBucketCap: 4 << 20},
			[]string{"rank 2", "bucket caps [1048576 26214400]", "bucket caps [4194304 26214400]"}},
		{"KeepLayout", same(threeParams), Options{KeepLayout: true},
			[]string{"rank 2", "KeepLayout false", "KeepLayout true"}},
		{"Join", same(threeParams), Options{Join: JoinWorld},
			[]string{"rank 2", "Join JoinOff", "Join JoinWorld"}},
		{"buffers", same(threeParams), Options{Buffers: buffers},
			[]string{"rank 2", "Options.Buffers differ"}},
		{"one rank's parameters are invalid", params(func(p []Param) []Param { p[1].Shape = []int{2, -3}; return p }), Options{},
			[]string{"rank 2 could not build its reducer"}},
		{"names only", params(func(p []Param) []Param { p[0].Name = "encoder.embed.weight"; return p }), Options{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := newTestGroup(t, 3)
			errs := runRanks(cs, func(rank int, c comm.Communicator) error {
				ps, o := threeParams, Options{}
				if rank == 2 {
					ps, o = tt.rank2, tt.o2
				}
				r, err := New(context.Background(), c, ps, o)
				if err == nil {
					r.Close()
				}
				return err
			})
			for rank, err := range errs {
				if tt.substr == nil {
					if err != nil {
						t.Errorf("rank %d: %v; names alone may differ", rank, err)
					}
					continue
				}
				if rank == 2 && tt.name == "one rank's parameters are invalid" {
					if err == nil {
						t.Fatalf("rank 2: New accepted a negative dimension")
					}
					continue // its own error says what is wrong with it
				}
				if err == nil {
					t.Fatalf("rank %d: New succeeded", rank)
				}
				wantErr(t, err, ErrParamMismatch, tt.substr...)
			}
		})
	}
}
