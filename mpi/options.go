package mpi

import (
	"errors"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// ErrNotBuilt is returned by Open in a binary built without the mpi build
// tag or without cgo.
var ErrNotBuilt = errors.New("mpi: backend not built")

// ErrFinalized is returned by Open after Finalize: MPI cannot be
// initialised twice in one process.
var ErrFinalized = errors.New("mpi: MPI was finalized in this process")

// Options configures one communicator.
type Options struct {
	// Blocking asks for the communicator's collectives to be blocking MPI
	// calls (MPI_Allreduce, ...), and on one host for the shared-memory
	// engine, rather than non-blocking ones that the owner goroutine
	// progresses, which libnbc's schedules slow (docs/lab/mpi.md). It is
	// for a program in which no rank waits for another communicator's operation
	// while one of this communicator's collectives, issued before it, is
	// incomplete (a training program with one communicator). A process
	// runs at most one communicator in blocking mode; see the package
	// documentation.
	Blocking bool

	// Timeout bounds how long an operation may stay incomplete; when it
	// passes, the backend reports the operation on standard error and
	// ends the job with MPI_Abort, since MPI can neither cancel the
	// operation nor stop writing its buffers. Zero means
	// comm.DefaultTimeout; a negative value never times out.
	Timeout time.Duration

	// StallInterval is how long an operation may stay incomplete before
	// it is reported as a stall, and how often the report is repeated.
	// Zero means comm.DefaultStallInterval; a negative value turns
	// reports off. The schedule is comm.Watchdog's, the same as every
	// other wait in ddpgo.
	StallInterval time.Duration

	// OnStall receives stall reports. Nil writes them to the standard
	// logger. It runs on the communicator's watchdog goroutine and must
	// not block. MPI cannot tell which ranks have not joined an
	// operation, so a report's Missing is nil (and says so), but for an
	// all-reduce in shared memory, whose report names the ranks and their
	// processes (see "Errors and failures" in the package documentation).
	OnStall func(comm.Stall)

	// Pool provides the scratch memory of the operations that need it (an
	// in-place ReduceScatter). Nil means a pool of the communicator's
	// own, with allocator's default limit.
	Pool *allocator.Pool

	// AbortCode is the error code Abort and the timeout pass to MPI_Abort,
	// which mpirun usually turns into its exit status. Zero means 1.
	AbortCode int
}

// Info describes the MPI library a binary was built against, for tools
// that report the environment (ddpbench info).
type Info struct {
	// Built reports whether the backend is compiled in (build tag mpi,
	// cgo); when it is not, Note says how to build it.
	Built bool
	Note  string
	// Library is MPI_Get_library_version's first line.
	Library string
	// Requested is the thread level the backend asks for; Provided the
	// level MPI granted, once initialised ("" before).
	Requested, Provided string
	// Initialized reports whether MPI has been initialised in this
	// process; OwnInit whether the backend did it (rather than the host
	// program).
	Initialized, OwnInit bool
	// WorldRank and WorldSize are MPI_COMM_WORLD's, once initialised.
	WorldRank, WorldSize int
	// MallocTuned reports whether the backend raised glibc's mmap and trim
	// thresholds at initialisation (see the package documentation).
	MallocTuned bool
	// TCPTuned reports whether the backend took "put" out of Open MPI's
	// TCP transport flags (btl_tcp_flags) or raised its eager limit
	// (btl_tcp_eager_limit) before it initialised MPI (see the package
	// documentation).
	TCPTuned bool
	// TCPFlags is btl_tcp_flags as Open MPI holds it once initialised (a
	// bit set: TCPFlagPut is "put"), or -1 where MPI does not expose it
	// (the tcp transport excluded, or another MPI); 0 before.
	TCPFlags int
	// TCPEagerLimit is btl_tcp_eager_limit as Open MPI holds it once
	// initialised, or -1 where MPI does not expose it.
	TCPEagerLimit int64
	// Hosts is the number of hosts the ranks of the last communicator
	// opened run on (a host: a name, a boot id and a network namespace),
	// and
	// LargeAllReduce the Open MPI algorithm that communicator runs its
	// blocking all-reduces of 1 MiB and more on, "segmented ring (256 KiB
	// segments)", or "" for Open MPI's own choice (see the package
	// documentation).
	Hosts          int
	LargeAllReduce string
	// SharedMemory reports whether the last communicator opened runs its
	// all-reduces in memory its ranks map into each other (blocking mode,
	// every rank on one machine; see the package documentation): those
	// below SharedMemoryMin bytes staged in its segment, larger
	// ones in place where every rank's buffers come from its HostSource.
	// SharedMemoryFailure is why an all-reduce of this process could not
	// map a peer's memory and left the call to MPI, once one could not.
	SharedMemory        bool
	SharedMemoryMin     int
	SharedMemoryFailure string
	// Hierarchy is how many ranks each host runs, "2+2" or "3+1", where
	// the last communicator opened is hierarchical (its SharedMemory is
	// then its host level's, its LargeAllReduce its cross-host level's);
	// "" where it is flat.
	Hierarchy string
	// HierarchyChunk is the chunk in bytes of that communicator's
	// pipelined all-reduces (DDPGO_MPI_HIER_CHUNK; see the package
	// documentation), 0 where they are not cut.
	HierarchyChunk int
	// F16C reports whether the 16-bit sums use the CPU's F16C
	// conversions.
	F16C bool
}

// TCPFlagPut is the "put" bit of Open MPI's btl_tcp_flags (Info.TCPFlags).
const TCPFlagPut = 0x2

// watchdog returns the comm.Watchdog that schedules the communicator's
// stall reports and deadline, and whether each is on.
func (o Options) watchdog() (d comm.Watchdog, stalls, deadline bool) {
	d = comm.Watchdog{StallInterval: max(o.StallInterval, 0), Timeout: max(o.Timeout, 0), OnStall: o.OnStall}
	return d.WithDefaults(), o.StallInterval >= 0, o.Timeout >= 0
}

func (o Options) abortCode() int {
	if o.AbortCode == 0 {
		return 1
	}
	return o.AbortCode
}
