// Package mpi is the ddpgo backend over the system's MPI library (Open MPI
// 4.1 on Debian; MPICH should do), for one rank per process on one or many
// machines. Open returns this rank's comm.Communicator over a duplicate of
// MPI_COMM_WORLD. Building, launching, tuning and testing a job are in
// docs/guide/mpi.md.
//
// The backend needs cgo and the build tag mpi. Without the tag the package
// compiles to a stub whose Open fails with ErrNotBuilt, saying how to
// build it. Either way it registers the backend "mpi" with package launch,
// and a bootstrap for NCCL's unique id. Every process must call Finalize
// (or launch.Finalize) before it exits, as mpirun requires; MPI cannot be
// initialised again afterwards.
//
// # One goroutine makes the MPI calls
//
// The first Open initialises MPI, asking for MPI_THREAD_SERIALIZED, on a
// goroutine locked to its OS thread for MPI's whole life, which also runs
// MPI_Finalize. A host program that initialised MPI itself must have asked
// for MPI_THREAD_SERIALIZED (and not call MPI while the backend may) or
// MPI_THREAD_MULTIPLE; Open refuses a lower level.
//
// Every other MPI call is made by one owner goroutine, in issue order.
// Issuing a collective stores it in a preallocated slot of its
// communicator's ring (package comm/backend) and queues it for the owner;
// a Work is a (communicator, sequence number) pair, so issuing and waiting
// allocate nothing once warm. A communicator may have 256 operations
// issued and not completed; issuing one more waits for the oldest. The
// owner is not locked to an OS thread, so a hand-off is a goroutine switch,
// and neither it nor Wait spins on an operation MPI runs: a rank that
// spins takes the CPU its peer needs (docs/lab/mpi.md).
//
// # Blocking and non-blocking collectives
//
// Open MPI has no progress thread, so by default the owner posts
// non-blocking collectives (MPI_Iallreduce, ...) and polls them.
// Options.Blocking asks for the faster blocking calls, which break the
// contract's promise that communicators are independent: a rank whose
// owner is held in a blocking collective posts nothing else until its
// peers join it. Use it for a program that never waits for one
// communicator while a collective of another, issued before, is pending (a
// training loop over one communicator). A process runs at most one
// communicator in blocking mode; Open agrees across ranks on whether a new
// one may block. Send and Recv are always non-blocking (tag 0: messages
// between two ranks arrive in issue order). A communicator gives MPI one
// operation at a time, so a rank's operations run in the order it issued
// them; different communicators run at the same time.
//
// # Semantics
//
// In-place forms map to MPI_IN_PLACE (AllReduce, Reduce on the root,
// AllGather); an in-place ReduceScatter reduces into scratch memory from
// Options.Pool (or the backend's own) and copies the block out. A buffer
// of more than 2^31-1 elements is ErrInvalid (MPI counts are C ints).
//
// Where MPI carries a collective, Float16 and BFloat16 are reduced by
// operations in C that add each pair in float32 and round once: with 2
// ranks a sum is inproc's; with N it may differ from the single rounding
// of the exact sum by up to N-2 units in the last place. Max and Min
// compare as inproc does; every rank gets the same bits. Over two ranks,
// Avg of a floating type runs inside MPI's reduction pass (in*0.5 +
// inout*0.5, rounded once: inproc's bits, and it cannot overflow) and
// Caps.NativeAvg is true; over more, Avg is Sum and then a division in the
// element type (integers truncate), and Caps.NativeAvg is false.
//
// # Errors and failures
//
// An operation MPI fails completes with a *comm.OpError (rank, sequence
// number, operation, count, dtype) wrapping an *Error with MPI's code,
// class and text; later operations of the communicator fail with
// comm.ErrAborted wrapping it. MPI cannot tell which collective ranks
// disagree on (Caps.MismatchDetection is false): mismatched calls hang or
// fail in MPI, but a message shorter than its receive, and all-reduces in
// shared memory whose counts, dtypes or ops differ, fail with
// comm.ErrMismatch.
//
// When a process dies, Open MPI's runtime kills the rest of the job. When a
// peer stalls, Wait with a deadline returns the context's error (the
// operation stays in flight, its buffers the backend's); the watchdog
// reports the oldest incomplete operation every Options.StallInterval,
// saying that MPI cannot tell a missing peer from one that has closed its
// communicator, and adding how long this rank did not run when a tick is
// late; at Options.Timeout it writes the operation to standard error and
// ends the job with MPI_Abort, since MPI can neither cancel an operation
// nor stop it writing its buffers. In shared memory the reports and failed
// waits name the ranks that have not joined, or this rank when its own
// part is left, and a wait for a peer that has exited, closed its
// communicator or aborted fails within 50 ms with comm.ErrAborted naming
// it.
//
// Abort ends the job: it writes the cause to standard error and calls
// MPI_Abort with Options.AbortCode (itself after 200 ms if the owner is
// held in a blocking collective); if the process still runs 5 s later it
// exits with that code, and mpirun ends the others. No Work completes
// after Abort and no buffer is written. Close fails the operations MPI has
// not been given with comm.ErrClosed, waits for those it has (bounded by
// the timeout) and frees the communicator.
//
// # Memory
//
// Collectives take pool memory (package allocator) or memory the caller
// keeps alive and unmoved until they complete. Unless
// MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ is set, the backend
// raises both to 1 GiB with mallopt before it initialises MPI
// (Info.MallocTuned), keeping heap memory rather than mapping Open MPI's
// temporary buffers afresh on every large all-reduce; from 64 MiB up that
// takes MALLOC_ARENA_MAX=1 in the ranks' environment as well.
//
// # Shared memory
//
// A blocking communicator whose ranks all run on one host runs every
// collective but Send and Recv on the shared-memory engine, package
// comm/shm (its doc has the protocol); shm.go is the adapter. At Open rank
// 0 makes the segment and the others map it; if one cannot, the
// communicator has none (Info.SharedMemoryFailure says why). A collective
// whose input (each block of a ReduceScatter) is less than
// Info.SharedMemoryMin (16 KiB) is staged in the segment: ranks that disagree on it all fail it with comm.ErrMismatch
// naming the first that differs, and the communicator stays usable. One
// issued while nothing else of its communicator is pending is staged by
// the issuing goroutine and finished by the first to reach it: the issue
// itself when every peer has posted, a Test or Wait of its Work, or the
// owner. A larger collective runs in place where every rank's buffers lie
// in memory of HostSource (comm.HostSourcer: memfd slabs the peers keep
// mapped, which a ddp Reducer given no pool uses); if one rank's buffers
// are other memory, every rank leaves that call to MPI, and if one rank
// could not map a peer's, that call and every later one. Results are the
// engine's: inproc's bits, a reduce-scatter's block the all-reduce's bit
// for bit, and two ranks' float32 sums and averages MPI's too. Waits poll
// (DDPGO_MPI_SPIN, DDPGO_MPI_YIELD), then sleep on the segment's futex,
// watching the process they wait for. DDPGO_MPI_SHM=0 on any rank turns it
// off for all; Info.SharedMemory says whether the last Open has it.
//
// # Between hosts
//
// When it initialises MPI, with Open MPI 4, the backend sets
// btl_tcp_flags without "put", btl_tcp_eager_limit 300000 and (unless
// DDPGO_MPI_ALLREDUCE=mpi) coll_tuned_use_dynamic_rules 1, each unless set
// already (an mpirun --mca choice wins; a parameter file's is overridden);
// Info.TCPTuned, Info.TCPFlags and Info.TCPEagerLimit say what was set.
// Open counts the hosts (a name, a boot id and a network namespace, or
// DDPGO_MPI_HOST). A blocking communicator over two or more hosts runs its
// all-reduces of 1 MiB and more on Open MPI's segmented ring in 256 KiB
// segments, and its reduce-scatters of 1 MiB and more of input on Open
// MPI's recursive halving, through a second duplicate communicator; every
// rank decides from the same gathered facts, so all do or none: none when
// a rank set DDPGO_MPI_ALLREDUCE=mpi, turned dynamic rules off, chose an
// all-reduce or reduce-scatter algorithm, segment size or rules file, or
// runs another MPI (Info.Hosts, Info.LargeAllReduce). Why each setting: docs/guide/mpi.md.
//
// # Several ranks per host
//
// A blocking communicator over two or more hosts with several ranks on
// some host is hierarchical: Open splits the world by host and by local
// rank and returns package comm/hier's composite of the two levels (hosts
// of different sizes work; the flat communicator carries Sends and Recvs
// between ranks that share neither); a failed level aborts the others.
// DDPGO_MPI_HIER=0 on any rank keeps every rank flat; Info.Hierarchy says
// "2+2", "3+1". Its all-reduces are pipelined in 1 MiB chunks (comm/hier's
// Config.ChunkBytes); DDPGO_MPI_HIER_CHUNK (bytes, or K or M; 0 for none),
// the same on every rank, sets the chunk.
package mpi
