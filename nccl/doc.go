// Package nccl is the ddpgo backend over NVIDIA's NCCL: one rank per GPU,
// collectives on device memory, as PyTorch's ProcessGroupNCCL.
//
// # Binding
//
// libnccl.so.2 and libcuda.so.1 are opened with dlopen at run time
// (Open, Default) and their functions called through a C dispatch table
// filled by dlsym, so building needs neither CUDA nor NCCL headers, nor a
// GPU; the few types and enum values used are declared in
// binding.h, checked against NCCL's src/nccl.h.in (ncclConfig_t in
// its 2.17 layout: NCCL copies min(size, its own sizeof) and defaults the
// newer fields) and CUDA 12.6's cuda.h (the _v2 symbols its macros name).
// Only the driver API is used; no libcudart. Libraries' empty fields
// mean the paths in DDPGO_NCCL_LIBRARY and DDPGO_CUDA_LIBRARY when set
// (pip's nvidia-nccl-cu12 keeps libnccl.so.2 in a directory the loader
// does not search), else the standard names. A missing library or
// required symbol is a *LoadError (ErrNotFound) saying what to install;
// NCCL older than MinVersion (2.14) is ErrVersion; optional symbols
// (ncclMemAlloc and ncclCommRegister, 2.19; ncclGetLastError, 2.13) may
// be absent. Built with CGO_ENABLED=0 the package compiles and Open
// returns ErrNoCgo. GetInfo reports the NCCL version (ncclGetVersion
// needs no GPU), the driver's version and the devices.
//
// # Communicators
//
// Rank 0 makes the unique id (NewUniqueID) and every rank gets it, through
// a Store (Connect; package rendezvous serves one at MASTER_ADDR:
// MASTER_PORT) or otherwise (NewComm takes the id in Config). NewComms
// initialises several ranks' communicators from one goroutine, one device
// each, inside one ncclGroupStart/End, on one locked OS thread until NCCL
// has finished. Communicators are non-blocking (ncclConfig_t.blocking =
// 0) unless Config.Blocking.
//
// Every call into NCCL for a communicator, and every call that puts work
// on its stream (collectives, kernels, copies), holds the communicator's
// call lock on an OS thread locked for the call (the calls of
// communicators on one device also take turns): NCCL forbids overlapping
// calls. When a launch answers ncclInProgress (on NCCL 2.23 and newer
// nearly every launch of a communicator of several ranks does: NCCL's
// group job enqueues it from another thread; Library.Launches counts
// them) the launching call polls ncclCommGetAsyncError until it reports
// success, as PyTorch's ProcessGroupNCCL does, and then calls
// ncclCommCount on the same thread, before it lets go: nothing reaches
// NCCL or the stream meanwhile, so a Download or a kernel issued after a
// collective runs after it, a group is launched as one group, and no
// group job outlives the call on the thread that launched it (NCCL 2.14
// to 2.26 keep it in thread-local storage; 2.23 to 2.25 join it only in
// the communicator's next call, which ncclCommCount is). The wait is for
// NCCL's enqueue, not for the collective, and it ends at Abort, Close or
// Config.Timeout.
//
// Each Comm owns a CUDA stream (non-blocking with respect to the legacy
// default stream) on which its collectives and kernels run in issue order.
// Operations live in the backend kit's ring (comm/backend.Ring: sequence
// numbers, results, failures), each slot with a CUDA event recorded after
// its operation. Test queries the events and completes, in order, what
// has completed; Wait tests, spins briefly and parks, and while a Wait is
// parked the watchdog polls the events for it (every 5 µs, backing off to
// 200 µs); Wait returns at its context's end, also while another call
// holds the call lock. An operation is called successful only after an
// ncclCommGetAsyncError check made once its event completed: NCCL's
// kernels exit early on an error, and their events then complete over
// wrong data. Issuing allocates nothing in steady state (the events stay
// in their slots). A rank with backend.RingSize operations pending waits,
// to issue one more, until the oldest completes (Config.Timeout bounds
// that); a group holds at most backend.RingSize operations, and the one
// after fails with comm.ErrInvalid.
//
// WaitStream makes the communicator's stream wait for the work issued so
// far on a stream of the caller's (a gradient is ready only once the
// kernel that wrote it has run), WaitEvent for an event of the caller's,
// and StreamWait makes a caller's stream wait for a Work; none blocks the
// host. GroupStart and GroupEnd (comm.Grouper) launch several operations
// in one ncclGroupStart/End; each cgo call makes the device's primary
// context current on its thread first.
//
// # Launching
//
// The package registers "nccl" with package launch (import it, blank or
// not, and launch.Open(ctx, "nccl", ...) opens it), which runs it either
// way. Under a launcher (mpirun, srun, torchrun: launch.FromEnv finds
// one, or Options.Env is given) the process runs one rank, on the device
// of its local rank unless JobOptions.Devices says otherwise, and rank 0's
// unique id reaches the others through launch.NewBootstrap (MPI, where
// mpirun started the job and package mpi is built in) or else through the
// rendezvous store rank 0 serves at MASTER_ADDR:MASTER_PORT. Started by
// hand, the process runs Options.Ranks ranks, rank r on device r, made
// together by NewComms. JobOptions (launch.Options.Config) also chooses
// the libraries and every rank's Config.
//
// # Failure
//
// A watchdog goroutine per communicator polls ncclCommGetAsyncError (when
// no other call holds the lock) and the deadline of the oldest pending
// operation (comm/backend.Oldest) every Config.PollInterval. A stall (Config.StallInterval) is
// reported to Config.OnStall as a comm.Stall, on comm.Watchdog's schedule
// like every wait in ddpgo (NCCL cannot say which ranks are missing, so
// its Missing is nil); an asynchronous error, or an operation pending past
// Config.Timeout, aborts the communicator: ncclCommAbort, then up to
// AbortDrain for the stream to drain, then every pending Work fails with a
// *comm.OpError naming the rank, the operation and its sequence number,
// wrapping comm.ErrAborted and NCCL's result and ncclGetLastError text (or
// comm.ErrTimeout). Abort does the same on demand; it is local, as
// ncclCommAbort is, and asks nothing else of a communicator that may have
// failed (ncclCommAbort releases its registrations). Close destroys the
// communicator (ncclCommDestroy, after deregistering what Source
// registered), or aborts it when work is pending or a launch is still
// settling (which then fails with comm.ErrClosed); it is idempotent.
// Nothing calls into a communicator after ncclCommDestroy or
// ncclCommAbort. If the stream does not drain within AbortDrain (a long
// kernel of the caller's, say), the memory it may still write is
// quarantined: the pending operations' staging memory is never reused,
// and neither Close nor Source's pool frees anything the stream may touch
// until the stream is seen idle; the bytes kept are counted in the error.
//
// # Memory
//
// Device buffers (comm.Buffer with Loc == comm.Device and the
// communicator's device) go to NCCL as they are. Source returns an
// allocator.Source for a device CommPool: slabs from ncclMemAlloc (else
// cuMemAlloc), 512-byte-aligned blocks, each slab registered once with
// ncclCommRegister and deregistered when freed or when the communicator
// closes. Host buffers are accepted too (Caps.HostMemory), staged in
// stream order: a host function (cuLaunchHostFunc) copies them into
// pinned memory, which is copied to device staging memory before the
// collective; the result comes back the same way after it. The issuer
// never blocks, and consecutive operations on one host buffer see each
// other's results; it costs two copies each way, so the reducer should
// use a device pool.
//
// Kernels (comm.KernelSource) returns the element-wise kernels for device
// memory on the communicator's stream: zero and copy with cuMemsetD8Async
// and cuMemcpyAsync; add, scale, fp16/bf16 compression and decompression,
// and the overflow count as PTX (kernels.ptx, loaded with
// cuModuleLoadData, so no CUDA compiler is needed to build), rounding
// exactly as package fp16 does. Avg is ncclAvg (Caps.NativeAvg).
//
// # Testing without a GPU
//
// The tests build a stand-in for libnccl.so.2 and libcuda.so.1
// (testdata/standin/standin.c, compiled with gcc into a temporary
// directory once per test binary) and load it by path. It is not NCCL and
// not CUDA: device memory is host memory, streams are threads running
// queues in order, collectives run across the communicators of the test
// process. It follows the completion rule of the NCCL that
// DDPGO_STANDIN_NCCL names by version: 2.21 (2.14 to 2.22: a launch
// enqueues at once), 2.25 (2.23 to 2.25: every launch of a non-blocking
// communicator of several ranks answers ncclInProgress and a group job,
// kept in the launching thread's storage, enqueues it later; the
// communicator's next call joins the job), 2.26 (the default: as 2.25, but
// ncclCommGetAsyncError joins it) or 2.28 (2.27 and newer: the job no
// longer lives in the thread's storage); make test runs the package under
// each. It records what real NCCL would not survive (overlapping calls
// into one communicator, a call after destroy, a communicator used or
// work put on its stream while its enqueue is in progress, a thread's
// group job overwritten, memory freed while queued work still uses it),
// and the tests fail on any. It can also inject ncclInProgress, an
// asynchronous error and a stalled rank, and count allocations,
// registrations and launches. It cannot run PTX: a
// kernel launched through it runs a C emulation chosen by its name, which
// checks the launch's marshalling, not the PTX. Nothing measured over it
// says anything about a GPU. It exports ddpgo_standin, which no real
// library has: Library.StandIn and Info.StandIn report it, and ddpbench
// prints it beside every figure measured over it.
//
// With DDPGO_NCCL_DEVICE=1 the same tests run over the real libraries on
// the machine's GPUs, skipping those that need the stand-in's controls
// and groups larger than the device count; scripts/gpu-check.sh runs them
// with ddpbench's checks from binaries built elsewhere (make
// gpu-check-bin). docs/lab/nccl-gpu.md says what ran on which GPU.
package nccl
