package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCheckpointResume saves a checkpoint after one epoch of 2 ranks with
// -shard (the state consolidated on rank 0), and:
//   - resumes it on 1, 2 and 4 ranks, with and without -shard, and saves
//     again at once: the same bytes, so the state went to each rank's
//     parts and back whole;
//   - resumes it on 2 ranks, sharded and not, for a second epoch: the
//     weights of an uninterrupted 2-epoch run on 2 ranks, bit for bit;
//   - resumes it on 1 and 4 ranks for that epoch: sharded and unsharded
//     give the same bits. (Against the 2-rank run they differ in the last
//     bits: the average over 1 or 4 ranks' means is summed in another
//     order, as without a checkpoint.)
//
// With momentum and with Adam, whose step count the checkpoint carries.
func TestCheckpointResume(t *testing.T) {
	train, _ := testData(t)
	train = train.subset(seq(12 * 64))
	dir := t.TempDir()
	for _, opt := range []string{"momentum", "adam"} {
		t.Run(opt, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.Hidden, cfg.Optimizer = 32, opt
			if opt == "adam" {
				cfg.LR = 0.002
			}
			run := func(ranks int, shard bool, epochs int, resume, save string) *mlp {
				t.Helper()
				c := cfg
				c.Ranks, c.Shard, c.Epochs, c.Resume, c.Checkpoint = ranks, shard, epochs, resume, save
				models, err := trainGroup(context.Background(), train, c, observer{})
				if err != nil {
					t.Fatalf("%d ranks, shard %v, %d epochs, resume %q: %v", ranks, shard, epochs, resume, err)
				}
				return models[0]
			}
			ck := filepath.Join(dir, opt+".ck")
			run(2, true, 1, "", ck)
			saved, err := os.ReadFile(ck)
			if err != nil {
				t.Fatal(err)
			}
			for _, ranks := range []int{1, 2, 4} {
				for _, shard := range []bool{false, true} {
					again := filepath.Join(dir, fmt.Sprintf("%s-%d-%v.ck", opt, ranks, shard))
					run(ranks, shard, 1, ck, again)
					if b, err := os.ReadFile(again); err != nil || !bytes.Equal(b, saved) {
						t.Fatalf("resumed on %d ranks (shard %v) and saved at once: not the checkpoint's bytes (%v)", ranks, shard, err)
					}
				}
			}
			whole := run(2, true, 2, "", "")
			for _, ranks := range []int{1, 2, 4} {
				plain, sharded := run(ranks, false, 2, ck, ""), run(ranks, true, 2, ck, "")
				names, _ := plain.shapes()
				for p := range numParams {
					if !slices.Equal(bitsOf(sharded.w[p]), bitsOf(plain.w[p])) {
						t.Fatalf("resumed on %d ranks: %s differs between -shard and not", ranks, names[p])
					}
					if ranks == 2 && !slices.Equal(bitsOf(plain.w[p]), bitsOf(whole.w[p])) {
						t.Fatalf("resumed on 2 ranks: %s differs from the uninterrupted run's", names[p])
					}
				}
			}
		})
	}
}

// TestCheckpointRefused: a checkpoint of another model or optimizer, or
// not one, is refused naming why.
func TestCheckpointRefused(t *testing.T) {
	cfg := defaultConfig()
	cfg.Hidden = 8
	m := newMLP(1, Pixels, cfg.Hidden, Classes)
	opt := newOptimizer(cfg, wholeParts(m.values()))
	ck := checkpoint{epochs: 3, steps: 7, hidden: cfg.Hidden, weights: m.values()}
	st := shapedLike(m.values())
	opt.export(0, st)
	ck.state = append(ck.state, st)
	var buf bytes.Buffer
	if err := ck.write(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	if got, err := readCheckpoint(bytes.NewReader(good), cfg); err != nil || got.epochs != 3 || got.steps != 7 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		cfg  func(*config)
	}{
		{"other hidden units", good, func(c *config) { c.Hidden = 9 }},
		{"other optimizer", good, func(c *config) { c.Optimizer = "adam" }},
		{"more epochs than -epochs", good, func(c *config) { c.Epochs = 2 }},
		{"truncated", good[:len(good)-4], func(*config) {}},
		{"trailing bytes", append(slices.Clone(good), 0), func(*config) {}},
		{"not a checkpoint", []byte("weights"), func(*config) {}},
	} {
		c := cfg
		tc.cfg(&c)
		if _, err := readCheckpoint(bytes.NewReader(tc.data), c); !errors.Is(err, errCheckpoint) {
			t.Errorf("%s: %v, want errCheckpoint", tc.name, err)
		}
	}
}
