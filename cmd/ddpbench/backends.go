package main

import (
	"fmt"
	"strings"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// backend is a communicator implementation ddpbench can start.
type backend struct {
	name     string
	built    bool
	newGroup func(n int) ([]comm.Communicator, error) // nil when not built
	note     string                                   // why it is not built
	// sharedMemory: the ranks are goroutines of this process and a
	// collective moves no bytes over any wire, so compression only costs.
	sharedMemory bool
	what         string // how the ranks talk, for the configuration line
}

// backends lists every backend ddpgo knows, built or not, in the order
// info prints them.
var backends = []backend{
	{name: "inproc", built: true, newGroup: newInprocGroup, sharedMemory: true, what: "goroutines of this process sharing memory"},
	{name: "mpi", note: "not built: this release has no MPI backend yet (planned: cgo over Open MPI or MPICH)"},
	{name: "nccl", note: "not built: this release has no NCCL backend yet (planned: libnccl.so.2 opened at run time; needs a GPU)"},
}

func newInprocGroup(n int) ([]comm.Communicator, error) {
	g, err := inproc.NewGroup(n)
	if err != nil {
		return nil, err
	}
	out := make([]comm.Communicator, len(g))
	for i, c := range g {
		out[i] = c
	}
	return out, nil
}

// builtBackends returns the names of the built backends.
func builtBackends() []string {
	var out []string
	for _, b := range backends {
		if b.built {
			out = append(out, b.name)
		}
	}
	return out
}

// lookupBackend validates --backend.
func lookupBackend(name string) (backend, error) {
	for _, b := range backends {
		if b.name == name {
			if !b.built {
				return b, usagef("--backend %s: %s; built: %s", name, b.note, strings.Join(builtBackends(), ", "))
			}
			return b, nil
		}
	}
	return backend{}, usagef("--backend %q: unknown (built: %s)", name, strings.Join(builtBackends(), ", "))
}

// startGroup starts n ranks of backend b.
func startGroup(b backend, n int) ([]comm.Communicator, func(), error) {
	if n < 1 || n > 1024 {
		return nil, nil, usagef("--ranks %d: want 1..1024", n)
	}
	g, err := b.newGroup(n)
	if err != nil {
		return nil, nil, fmt.Errorf("starting %d %s ranks: %w", n, b.name, err)
	}
	closeAll := func() {
		for _, c := range g {
			c.Close()
		}
	}
	return g, closeAll, nil
}

func backendUsage() string {
	return "communication backend (built: " + strings.Join(builtBackends(), ", ") + ")"
}
