//go:build cgo

package nccl

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/internal/testutil"
	"github.com/ddpgo/ddpgo/rendezvous"
)

// TestSPMD runs the conformance suite over the stand-in with one
// goroutine per rank, each rank as a process would: its own rendezvous
// Store (rank 0 serves it on a local port), and every newComm call a
// Connect that exchanges a fresh unique id through the store. The
// stand-in's device memory is host memory, so this checks the binding
// (marshalling, staging, ordering, errors), not a GPU.
func TestSPMD(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("%dranks", n), func(t *testing.T) {
			if si == nil && n > devices {
				t.Skipf("%d ranks need %d devices; this machine has %d", n, n, devices)
			}
			testutil.NoLeak(t)
			s0, err := rendezvous.Open(context.Background(), rendezvous.Options{Addr: "127.0.0.1:0", Rank: 0, Size: n, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			stores := []*rendezvous.Store{s0}
			for r := 1; r < n; r++ {
				s, err := rendezvous.Open(context.Background(), rendezvous.Options{Addr: s0.Addr(), Rank: r, Size: n, Timeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				stores = append(stores, s)
			}
			defer func() {
				for i := len(stores) - 1; i >= 0; i-- {
					stores[i].Close()
				}
			}()
			var wg sync.WaitGroup
			for r := range n {
				wg.Go(func() {
					t.Run(fmt.Sprintf("rank%d", r), func(t *testing.T) {
						calls := 0
						commtest.RunSPMD(t, func(t *testing.T) comm.Communicator {
							calls++
							cfg := testConfig(r, n, UniqueID{})
							ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
							defer cancel()
							c, err := lib.Connect(ctx, stores[r], fmt.Sprintf("comm/%d", calls), cfg)
							if err != nil {
								t.Fatal(err)
							}
							return c
						}, commtest.Large(1<<20), commtest.WaitTimeout(30*time.Second))
					})
				})
			}
			wg.Wait()
		})
	}
}
