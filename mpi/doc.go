// Package mpi is the ddpgo backend over the system's MPI library (Open MPI
// 4.1 on Debian; MPICH should do), for one rank per process on one or many
// machines. Open returns this rank's comm.Communicator over a duplicate of
// MPI_COMM_WORLD.
//
// The backend needs cgo and the build tag mpi:
//
//	apt-get install libopenmpi-dev openmpi-bin   # Debian; pkg-config must find ompi-c
//	go build -tags mpi ./...
//	mpirun -np 2 ./train
//
// Without the tag (the default build) the package compiles to a stub whose
// Open fails with ErrNotBuilt, saying how to build it, so the module builds
// and tests on machines without MPI. Either way the package registers the
// backend "mpi" with package launch, and a bootstrap for NCCL's unique id.
//
// Every process must call Finalize before it exits (mpirun treats an exit
// without MPI_Finalize as a failure), or launch.Finalize, which calls it,
// where the program reaches the backend only through launch.Open; MPI
// cannot be initialised again afterwards.
//
// # One goroutine makes the MPI calls
//
// The first Open initialises MPI, asking for MPI_THREAD_SERIALIZED, on a
// goroutine locked to its OS thread for MPI's whole life, which also runs
// MPI_Finalize (the standard wants both on the same thread). A host program
// that initialised MPI itself must have asked for MPI_THREAD_SERIALIZED or
// MPI_THREAD_MULTIPLE and must not call MPI while the backend may (or use
// MPI_THREAD_MULTIPLE); Open refuses a lower level.
//
// Every other MPI call of the process is made by one owner goroutine, in
// the order the calls were issued. Issuing a collective stores it in a
// preallocated slot of its communicator's ring (package comm/backend,
// which also keeps the results, the failure log and the waiters) and
// queues it for the owner; a Work is a (communicator, sequence number)
// pair, so issuing and waiting allocate nothing once warm. A communicator
// may have 256 operations issued and not completed; issuing one more waits
// for the oldest. The owner is not locked to an OS thread,
// which MPI_THREAD_SERIALIZED allows: when it is idle it parks, the
// goroutine that issues next finds it runnable on its own processor, and
// the hand-off in both directions is a goroutine switch, where a locked
// thread would need an operating-system wake-up for each; the owner does
// not spin, nor does Wait for an operation MPI runs, since a rank that
// spins takes the CPU its peer needs (docs/lab/mpi.md has the measurements).
// Waits in shared memory (below) are another matter: they poll the
// segment for up to 50 us, which covers a peer that runs (CPU-bound
// neighbours included), and then sleep on a futex of the segment, which
// the last rank to arrive wakes; where the ranks outnumber the machine's
// processors, they call sched_yield between looks for up to 200 us
// instead, handing the processor to the peer they wait for, before they
// sleep (DDPGO_MPI_SPIN and DDPGO_MPI_YIELD, durations, set the two).
//
// # Blocking and non-blocking collectives
//
// Open MPI has no asynchronous progress thread: a non-blocking collective
// moves only while some MPI call runs. The owner can either post the
// non-blocking collective (MPI_Iallreduce, ...) and poll it with
// MPI_Testsome, or call the blocking one (MPI_Allreduce, ...), as Horovod
// does. The blocking calls are faster (libnbc's schedules cost the
// non-blocking ones; docs/lab/mpi.md).
//
// Blocking calls are not the default, because they break the contract's
// promise that communicators are independent: a rank whose owner is held
// in a blocking collective posts nothing else until a peer joins it, and a
// peer that first waits for a collective of another communicator, which
// this rank issued after the blocked one, never does. The conformance
// suite does exactly that (its ranks meet on a control communicator while
// a collective of the one under test is pending). So collectives are
// non-blocking by default, and Options.Blocking asks for blocking calls
// for a program that never waits like that, a training loop over one
// communicator for one. A process runs at most one communicator in
// blocking mode, since two of them deadlock as soon as ranks interleave
// their collectives differently: Open agrees across ranks (an all-reduce)
// on whether the new one may block. Send and Recv are always non-blocking
// (MPI_Isend, MPI_Irecv, tag 0: messages between two ranks arrive in
// issue order).
//
// A communicator gives MPI one operation at a time: the next starts when
// the one before it has completed. MPI starts a communicator's
// non-blocking collectives in order but may run them at the same time,
// and the contract wants a rank's operations run in the order it issued
// them (a reduce whose result the next broadcast sends must be complete
// first). Different communicators run at the same time.
//
// # Semantics
//
// In-place forms map to MPI_IN_PLACE (AllReduce, Reduce on the root,
// AllGather); an in-place ReduceScatter reduces into scratch memory from
// Options.Pool (or a pool of the backend's own) and copies the block out,
// since MPI_IN_PLACE would leave it at the start of the buffer. Counts
// are C ints in MPI: a buffer of more than 2^31-1 elements is ErrInvalid.
//
// Where MPI carries a collective (every one between hosts, and Send and
// Recv everywhere; below), Float16 and BFloat16 are reduced by user-defined MPI
// operations written in C (F16C for binary16 where the CPU has it): each pairwise addition is
// computed in float32 and rounded once to the element type, as package
// fp16 and inproc round, and Max and Min compare as inproc does. With 2
// ranks a sum is therefore the same as inproc's; with N ranks MPI adds
// N-1 times, so a result may differ from the single rounding of the exact
// sum by up to N-2 units in the last place. Every rank gets the same bits.
// MPI has no MPI_AVG. Over two ranks, Avg of a floating type is done
// inside MPI's reduction pass by a user-defined operation that averages
// its two operands (in*0.5 + inout*0.5, rounded once: bit for bit
// inproc's pre-multiplied Avg, and it cannot overflow). A user-defined
// operation has no identity element to start from, so MPI can only combine
// the two contributions of an element once; the conformance suite checks
// the result under mpirun -np 2. It saves a whole pass over the buffer.
// Caps.NativeAvg is true there. Over more ranks an operation cannot tell
// a partial sum from a contribution, so Avg runs Sum and then divides each
// element by the group size, in the element type's arithmetic (integers
// truncate): it overflows where Sum does, and Caps.NativeAvg is false, so
// the hooks pre-scale instead.
//
// # Errors and failures
//
// Communicators return MPI errors (MPI_ERRORS_RETURN): an operation MPI
// fails completes with a *comm.OpError (rank, sequence number, operation,
// count, dtype) wrapping an *Error that carries MPI's code, class and
// text. The communicator is unusable afterwards: later operations fail
// with comm.ErrAborted wrapping that first error. MPI cannot tell which
// collective ranks disagree on, so Caps.MismatchDetection is false;
// mismatched calls hang, or fail in MPI (MPI_ERR_TRUNCATE), or, for a
// message shorter than its receive, fail with comm.ErrMismatch, as do
// all-reduces in shared memory (below) whose counts, dtypes or ops
// differ, of any size.
//
// When a process dies, Open MPI 4.1's runtime (mpirun and its daemons)
// sees it and kills every other process of the job; they see no error of
// their own ("mpirun noticed that process rank 1 ... exited on signal 9").
// When a peer only stalls, a rank sees, in order: Wait with a deadline
// returns the context's error (the operation stays in flight, its buffers
// the backend's); the communicator's watchdog reports the oldest
// incomplete operation every Options.StallInterval (default 60 s; MPI
// cannot say which ranks are missing); at Options.Timeout (default 10 min)
// the watchdog writes the operation to standard error and ends the job
// with MPI_Abort. A communicator with an operation stuck in MPI cannot be
// used again: MPI can neither cancel the operation nor stop it writing
// its buffers. MPI cannot tell a peer that has not issued the operation
// yet from one that has closed its communicator, and the reports say so;
// a watchdog tick that comes seconds late (the process was stopped, as
// mpirun's teardown continues a stopped rank before it ends it) adds how
// long this rank did not run.
//
// An all-reduce in shared memory (below) knows more: its stall reports
// and failed waits name the ranks that have not joined it, stopped or
// not; when every rank has posted it, they name this rank, whose own part
// is left; and they name the peers that have exited or closed their
// communicator. A wait for a peer that has exited, closed its
// communicator (Close marks it in the segment) or aborted the job
// fails within 50 ms with comm.ErrAborted naming it.
//
// So Abort ends the job: it writes the cause to standard error and calls
// MPI_Abort with Options.AbortCode, as PyTorch's NCCL error handling tears
// the process down. It asks the owner to call MPI_Abort, and calls it
// itself after 200 ms if the owner is held in a blocking collective; Open
// MPI then kills every process of the job, usually within a second. If
// MPI_Abort has not ended the process 5 s later (it blocks when the
// runtime is out of reach, as on a host whose link is cut), the process
// exits by itself with the same code, and mpirun, seeing a rank gone
// without MPI_Finalize, ends the others. No
// Work of the rank completes after Abort and no buffer is written: the
// process is gone. Close fails the operations MPI has not been given yet
// with comm.ErrClosed, waits for those it has (bounded by the timeout)
// and frees the communicator.
//
// # Memory
//
// Collectives take pool memory (package allocator) or memory the caller
// keeps alive and unmoved, as the comm contract requires: MPI holds the
// addresses until the operation completes.
//
// Open MPI allocates a temporary buffer as large as the message for a
// large all-reduce, and glibc maps a block above its mmap threshold (which
// it adjusts itself up to 32 MiB) afresh on every call and faults it in.
// Where page faults are slow that collapses large all-reduces. So, unless
// MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is set (the user's
// choice wins), the backend raises both thresholds to 1 GiB with mallopt
// before it initialises MPI (Info.MallocTuned), at the cost of heap memory
// not returned to the system. That is not enough from 64 MiB up: the
// owner's calls run on threads that have arenas of their own, whose heaps
// hold at most 64 MiB, and glibc maps anything larger whatever the
// threshold; only MALLOC_ARENA_MAX=1 in the environment at start-up, which
// a Go program cannot set for itself, sends every thread to the main
// arena. For all-reduces of 64 MiB and more, start the ranks with it:
//
//	mpirun -np 2 -x MALLOC_ARENA_MAX=1 ./train
//
// # Shared memory
//
// On one machine the ranks read each other's memory instead of copying
// it through MPI. A blocking communicator whose ranks all run on one
// machine (the host count below is 1) runs every collective but Send and
// Recv on the shared-memory engine, package comm/shm, the one package
// inproc runs on: its doc.go has the protocol, its state table and why it
// is safe. This package is the engine's adapter for processes (shm.go):
//
//   - At Open, rank 0 makes the segment (a memfd), MPI broadcasts where it
//     lies, the others map it through /proc/<pid>/fd, and MPI gathers every
//     rank's process and whether it could; if one could not, the
//     communicator has no shared memory (Info.SharedMemoryFailure says
//     why).
//   - A collective whose input (every block of a ReduceScatter) is less
//     than Info.SharedMemoryMin bytes (16 KiB) is staged: each rank
//     publishes its call with a copy of its input and computes its own
//     result from every rank's. Ranks that disagree on the call all fail
//     it with comm.ErrMismatch, naming the first rank that differs; the
//     communicator stays usable.
//   - A larger one runs in place (the engine's direct path), where every
//     rank's buffers lie in memory of HostSource (comm.HostSourcer): slabs
//     of memfds that the peers map through /proc and keep mapped (package
//     comm/shm's Slabs and PeerMaps), which a ddp Reducer given no pool
//     and ddpbench take their buckets from. If one rank's buffers are
//     other memory, every rank leaves that call to MPI; if one
//     rank could not map a peer's, every rank leaves it and every later
//     one of the communicator to MPI (Info.SharedMemoryFailure says why,
//     on that rank).
//   - When a staged collective is issued while nothing else of its communicator
//     is pending, the issuing goroutine stages it itself (no hand-off to
//     the owner), and the first of these finishes it: the issue itself,
//     when every peer has posted it already (it is then published
//     complete); a Test or Wait of its Work; or the owner when a later
//     operation of the communicator (or Close) reaches it. Otherwise the
//     owner runs it in turn.
//
// Results are the engine's: every rank reduces in rank order with the
// kernels of package internal/reduce and fp16, so collectives in shared
// memory have inproc's bits (16-bit sums rounded once, Avg as package
// internal/reduce computes it), a reduce-scatter's block is the
// all-reduce's bit for bit, and two ranks' float32 sums and averages are
// MPI's too. Waits poll, yield and then sleep on the
// segment's futex (shm.Futex; DDPGO_MPI_SPIN and DDPGO_MPI_YIELD set the
// first two), and watch the process they wait for. Only blocking mode
// takes this path. Between machines it is off: the host count is more
// than 1, and the boot ids keep ranks wrongly named one host
// (DDPGO_MPI_HOST) apart. DDPGO_MPI_SHM=0 on any rank turns it off for
// all; Info.SharedMemory says whether the last communicator opened has
// it.
//
// # Between hosts
//
// Between hosts Open MPI carries messages over TCP, and with its defaults
// an all-reduce loses much of the link's rate. So, when it initialises MPI
// itself and with Open MPI 4 only, the backend sets three MCA parameters
// in its environment before MPI_Init, each unless it is set already (an
// mpirun --mca choice of the user's wins; a parameter file's is
// overridden): btl_tcp_flags without "put" (Open MPI 4's default flags
// otherwise), btl_tcp_eager_limit 300000, and, unless
// DDPGO_MPI_ALLREDUCE=mpi, coll_tuned_use_dynamic_rules 1. A host program
// that initialises MPI itself sets them the same way to have the same.
// Info.TCPTuned, Info.TCPFlags and Info.TCPEagerLimit say what was set and
// what MPI holds; shared memory uses none of them.
//
// Open counts the hosts its ranks run on (a host: a name, a boot id and a
// network namespace, or DDPGO_MPI_HOST where set). A blocking communicator
// whose ranks span two or more hosts gets a second duplicate of its
// MPI communicator whose all-reduce is Open MPI's segmented ring in 256 KiB
// segments (set through MPI's tool interface), and its all-reduces of 1
// MiB and more run on it; smaller ones keep Open MPI's choice. Every rank
// decides from the same gathered facts, so all take it or none: none when
// any rank set DDPGO_MPI_ALLREDUCE=mpi, turned dynamic rules off, chose
// an all-reduce algorithm, segment size or rules file of its own, or runs
// another MPI than Open MPI 4. Info.Hosts and Info.LargeAllReduce say what
// the last Open found and chose. On one host the algorithm stays Open
// MPI's, and all-reduces run in shared memory instead (above). Why each
// setting, with the measurements: docs/guide/mpi.md.
//
// # Several ranks per host
//
// A blocking communicator whose ranks span two or more hosts, with more
// than one rank on some host, is hierarchical: Open splits the world by
// host (MPI_Comm_split; its collectives run in shared memory, above) and
// by local rank across the hosts (its large all-reduces on the segmented
// ring, below), and returns the composite of package comm/hier, whose doc
// has the algorithms: an all-reduce reduces inside each host, each local
// rank all-reduces its shard across the hosts, and each host spreads the
// result, so a host's link carries what it carries with one rank per host.
// Hosts of different sizes work (the shards follow the smallest host).
// The flat communicator over the world carries the Sends and Recvs
// between ranks that share neither host nor local rank. DDPGO_MPI_HIER=0
// on any rank keeps every rank flat; Info.Hierarchy says "2+2", "3+1".
// Failures end the job as everywhere in this package: a failed level
// aborts the others, and Abort is MPI_Abort.
//
// # Testing
//
// The tests are SPMD: go test -tags mpi ./mpi/ runs them in one process
// (a 1-rank world) and then, in TestUnderMpirun, under mpirun with 2 and 3
// ranks (DDPGO_MPI_NP=1,2,3,4 to choose), and TestHierarchyUnderMpirun
// runs 4 ranks named onto two hosts (2+2, 3+1) through DDPGO_MPI_HOST. A
// test binary runs under mpirun directly too:
//
//	go test -c -tags mpi -o mpi.test ./mpi/
//	mpirun -np 4 --oversubscribe ./mpi.test
package mpi
