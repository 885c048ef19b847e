package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/mpi"
)

// rankHosts returns where each rank of g runs: gathered through the
// communicator in a launched job (a collective: every rank calls it), this
// process for ranks that are its goroutines.
func rankHosts(ctx context.Context, g *group) ([]bench.Host, error) {
	name, _ := os.Hostname()
	pid := os.Getpid()
	if g.launched {
		hs, err := bench.Hosts(ctx, g.comms[0], name, pid)
		if err != nil {
			return nil, fmt.Errorf("gathering the ranks' hosts: %w", err)
		}
		return hs, nil
	}
	hs := make([]bench.Host, len(g.comms))
	for i, c := range g.comms {
		hs[i] = bench.Host{Rank: c.Rank(), Name: name, PID: pid}
	}
	return hs, nil
}

// rankTable is the table's last part: each rank's host and process.
func rankTable(hs []bench.Host) string {
	if len(hs) == 0 {
		return ""
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "\n%4s  %8s  %s\n", "rank", "pid", "host")
	for _, h := range hs {
		fmt.Fprintf(b, "%4d  %8d  %s\n", h.Rank, h.PID, h.Name)
	}
	return b.String()
}

// rankHostJSON is one rank of the rank table in the JSON output.
type rankHostJSON struct {
	Rank int    `json:"rank"`
	Host string `json:"host"`
	PID  int    `json:"pid"`
}

func rankHostsJSON(hs []bench.Host) []rankHostJSON {
	out := make([]rankHostJSON, len(hs))
	for i, h := range hs {
		out[i] = rankHostJSON{Rank: h.Rank, Host: h.Name, PID: h.PID}
	}
	return out
}

// distinctHosts counts the host names of the rank table.
func distinctHosts(hs []bench.Host) int {
	seen := map[string]bool{}
	for _, h := range hs {
		seen[h.Name] = true
	}
	return len(seen)
}

// transportJSON is what the mpi backend chose for Open MPI, which the
// table's header says in words (mpiTuning).
type transportJSON struct {
	// Hosts is the number of hosts the backend found the ranks on (a
	// host name, a boot id and a network namespace, or DDPGO_MPI_HOST).
	Hosts int `json:"hosts"`
	// Hierarchy is how many ranks each host runs where the communicator
	// is hierarchical ("2+2"), "" where it is flat.
	Hierarchy string `json:"hierarchy,omitempty"`
	// HierarchyChunkBytes is the chunk its all-reduces are pipelined in
	// (DDPGO_MPI_HIER_CHUNK), absent where they are not cut.
	HierarchyChunkBytes int `json:"hierarchy_chunk_bytes,omitempty"`
	// LargeAllReduce is the algorithm of all-reduces of 1 MiB and more
	// between hosts, "" for Open MPI's own choice.
	LargeAllReduce string `json:"large_allreduce,omitempty"`
	// SharedMemory: all-reduces of SharedMemoryMinBytes and more run in
	// memory the ranks of one machine map into each other.
	SharedMemory         bool   `json:"shared_memory"`
	SharedMemoryMinBytes int    `json:"shared_memory_min_bytes,omitempty"`
	SharedMemoryFailure  string `json:"shared_memory_failure,omitempty"`
	// TCPTuned: the backend set Open MPI's TCP transport flags or eager
	// limit; TCPPut and TCPEagerLimit are what Open MPI then held.
	TCPTuned      bool   `json:"tcp_tuned"`
	TCPPut        *bool  `json:"tcp_put,omitempty"`
	TCPEagerLimit *int64 `json:"tcp_eager_limit,omitempty"`
}

// mpiTransport describes what the mpi backend chose, once MPI is
// initialised; nil before.
func mpiTransport(i mpi.Info) *transportJSON {
	if !i.Initialized {
		return nil
	}
	t := &transportJSON{Hosts: i.Hosts, Hierarchy: i.Hierarchy, HierarchyChunkBytes: i.HierarchyChunk, LargeAllReduce: i.LargeAllReduce, SharedMemory: i.SharedMemory,
		SharedMemoryFailure: i.SharedMemoryFailure, TCPTuned: i.TCPTuned}
	if i.SharedMemory {
		t.SharedMemoryMinBytes = i.SharedMemoryMin
	}
	if i.TCPFlags >= 0 {
		put := i.TCPFlags&mpi.TCPFlagPut != 0
		t.TCPPut = &put
	}
	if i.TCPEagerLimit >= 0 {
		t.TCPEagerLimit = &i.TCPEagerLimit
	}
	return t
}
