//go:build mpi && cgo

package mpi_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/mpi"
)

// TestLaunch opens the backend through package launch, from mpirun's
// variables (or, run alone, from an environment that says 1 rank), and
// broadcasts through the MPI bootstrap.
func TestLaunch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var o launch.Options
	if !underMpirun() {
		o.Env = &launch.Env{Launcher: "openmpi", Rank: 0, Size: 1}
	}
	o.Config = mpi.Options{}
	cs, err := launch.Open(ctx, "mpi", o)
	if err != nil {
		t.Fatal(err)
	}
	c := cs[0]
	defer c.Close()
	env, err := launch.FromEnv()
	if o.Env != nil {
		env, err = *o.Env, nil
	}
	if err != nil || env.Rank != c.Rank() || env.Size != c.Size() {
		t.Fatalf("FromEnv = %+v, %v; communicator rank %d of %d", env, err, c.Rank(), c.Size())
	}
	testutil.MustWaitAll(t, c.Barrier())

	wrong := env
	wrong.Size++
	if _, err := launch.Open(ctx, "mpi", launch.Options{Env: &wrong}); err == nil {
		t.Errorf("launch.Open with an environment of %d ranks in a world of %d succeeded", wrong.Size, c.Size())
	}

	b, err := launch.NewBootstrap(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for root := range c.Size() {
		id := bytes.Repeat([]byte(fmt.Sprintf("id of rank %d;", root)), 11) // 128+ bytes, as NCCL's unique id
		mine := id
		if c.Rank() != root {
			mine = nil
		}
		got, err := b.Broadcast(ctx, mine, root)
		if err != nil || !bytes.Equal(got, id) {
			t.Fatalf("rank %d: Broadcast from %d = %q, %v; want %q", c.Rank(), root, got, err, id)
		}
	}
	// As nccl's Connect uses a store: rank 0 sets, the others get.
	s := launch.BroadcastStore{B: b, Root: 0}
	want := []byte("unique id")
	if c.Rank() == 0 {
		if err := s.Set(ctx, "nccl/0", want); err != nil {
			t.Fatal(err)
		}
	} else if got, err := s.Get(ctx, "nccl/0"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("rank %d: Get = %q, %v; want %q", c.Rank(), got, err, want)
	}
}
