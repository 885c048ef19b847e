package launch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/launch"
)

// Open starts a job of the named backend. inproc runs Options.Ranks
// ranks as goroutines of this process, whatever launcher started it; with
// "mpi" (and its package linked) the same program runs one rank per
// process under mpirun.
func ExampleOpen() {
	defer launch.Finalize() // before Open, so that it runs on every path out
	ctx := context.Background()
	cs, err := launch.Open(ctx, "inproc", launch.Options{Ranks: 3})
	if err != nil {
		panic(err)
	}
	sums := make([][]int64, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		sums[r] = []int64{int64(c.Rank())}
		wg.Go(func() {
			defer c.Close()
			b := comm.Int64s(sums[r])
			if err := c.AllReduce(b, b, comm.Sum).Wait(ctx); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	for r, c := range cs {
		fmt.Printf("rank %d of %d: sum of ranks %d\n", c.Rank(), c.Size(), sums[r][0])
	}

	_, err = launch.Open(ctx, "nosuch", launch.Options{})
	fmt.Println(errors.Is(err, launch.ErrUnknownBackend))
	// Output:
	// rank 0 of 3: sum of ranks 3
	// rank 1 of 3: sum of ranks 3
	// rank 2 of 3: sum of ranks 3
	// true
}

// Parse is FromEnv over any variables: here those torchrun sets, those
// Open MPI's mpirun sets, and none at all, which is a process started by
// hand.
func ExampleParse() {
	lookup := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	env, err := launch.Parse(lookup(map[string]string{
		"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
		"MASTER_ADDR": "node0", "MASTER_PORT": "29500",
	}))
	fmt.Println(env, err)

	env, err = launch.Parse(lookup(map[string]string{
		"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
		"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
	}))
	fmt.Println(env, err)

	_, err = launch.Parse(lookup(nil))
	fmt.Println(errors.Is(err, launch.ErrEnv), errors.Is(err, launch.ErrNoLauncher))
	// Output:
	// torchrun: rank 5 of 8, local rank 1 of 4, master node0:29500 <nil>
	// openmpi: rank 1 of 2, local rank 1 of 2 <nil>
	// true true
}

// Agree, before the first collective, tells every rank that one of them
// could not get ready, so that all exit at once with its status instead
// of waiting for it until a deadline.
func ExampleAgree() {
	ctx := context.Background()
	cs, err := launch.Open(ctx, "inproc", launch.Options{Ranks: 3})
	if err != nil {
		panic(err)
	}
	status := []int{0, 0, 3} // rank 2 could not create its output file
	type answer struct{ failed, code int }
	answers := make([]answer, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() {
			defer c.Close()
			failed, code, err := launch.Agree(ctx, c, status[r])
			if err != nil {
				panic(err)
			}
			answers[r] = answer{failed, code}
		})
	}
	wg.Wait()
	for r, a := range answers {
		fmt.Printf("rank %d: rank %d failed with status %d\n", r, a.failed, a.code)
	}
	// Output:
	// rank 0: rank 2 failed with status 3
	// rank 1: rank 2 failed with status 3
	// rank 2: rank 2 failed with status 3
}

// Lookup returns a registered backend's description, as programs list
// them.
func ExampleLookup() {
	b, ok := launch.Lookup("inproc")
	fmt.Println(ok, b.Launched, b.SharedMemory)
	fmt.Println(b.About)
	// Output:
	// true false true
	// goroutines of this process sharing memory
}
