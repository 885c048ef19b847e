// Package launch is the one way into a ddpgo job from any launcher: it
// reads a process's rank, size, local rank and local size from the
// variables that Open MPI's mpirun, MPICH's Hydra (mpiexec), Slurm's srun
// or PyTorch's torchrun set (FromEnv), and opens the requested backend
// (Open). At the end of the program, Finalize ends the backends that need
// it: every process of an MPI job must reach MPI_Finalize before it exits.
//
//	import (
//		"github.com/ddpgo/ddpgo/launch"
//		_ "github.com/ddpgo/ddpgo/mpi" // registers "mpi"
//	)
//
//	cs, err := launch.Open(ctx, "mpi", launch.Options{})   // one rank per process
//	cs, err := launch.Open(ctx, "inproc", launch.Options{Ranks: 4}) // 4 ranks in this process
//	cs, err := launch.Open(ctx, "nccl", launch.Options{Ranks: 4})   // either: see below
//
// with `defer launch.Finalize()` before the first Open, so that it runs on
// every path out of the program, and last.
//
// A backend runs its ranks in this process (inproc), one rank per process
// started by a launcher (Backend.Launched: mpi), or either way
// (Backend.InProcess too: nccl, one GPU per rank in each case): one rank
// when a launcher started the process (or Options.Env is given), and
// Options.Ranks ranks when FromEnv finds no launcher at all. Job.Launched
// tells such a backend which.
//
// # Backends register themselves
//
// A backend package calls Register from its init function, and a program
// links the backends it imports, often with a blank import. Backend is the
// one description of a backend: how it runs its ranks (Launched,
// InProcess), what its collectives move (DeviceMemory, SharedMemory), a
// line saying how the ranks talk (About), and, in a binary that cannot run
// it, why (NotBuilt); Registered lists them, and programs (ddpbench's info
// and --backend) list the registry rather than a table of their own.
// launch itself imports comm, comm/checked and inproc, all pure Go, so a
// program that never mentions mpi or nccl links neither, and none of cgo.
// The alternative, build-tagged files in launch that import every backend,
// would make launch's own build depend on each backend's tags and
// libraries; the registry keeps that choice in the program (as
// database/sql drivers and image formats do). Package mpi registers "mpi"
// in every build: without its build tag, NotBuilt says how to build it,
// and opening it fails saying the same. Package nccl registers "nccl" in
// every build too; it needs no tag, and opening it without NCCL installed
// fails saying what to install.
//
// With DDPGO_DISTRIBUTED_DEBUG=DETAIL in the environment, Open wraps every
// communicator with package comm/checked (PyTorch's
// TORCH_DISTRIBUTED_DEBUG=DETAIL).
//
// Agree, before a job's first collective, tells every rank whether some
// rank failed to get ready (an output file it cannot create, a port it
// cannot bind), so that the job ends at once, naming that rank, rather
// than at a deadline with the ranks waiting for it.
//
// The package's five roles have a file each: env.go reads the launcher's
// environment, registry.go holds the backends and Open, bootstrap.go the
// bootstraps, detail.go the DETAIL wrapping, agree.go Agree; inproc.go
// registers the embedded backend.
//
// # Bootstrap
//
// A backend that needs a few bytes shared before its own communicator
// exists (NCCL's unique id) asks NewBootstrap: under an MPI launcher, with
// package mpi linked and built, it returns a Bootstrap over MPI; otherwise
// ErrNoBootstrap, and the backend meets its peers at the torchrun-style
// rendezvous address Env.MasterAddr:Env.MasterPort (package rendezvous's
// TCP store). BroadcastStore presents a Bootstrap as the Set/Get store
// that nccl's Connect takes, so both ways fit the same call.
package launch
