package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/bench"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/mpi"  // registers "mpi" with launch; built with -tags mpi
	"github.com/ddpgo/ddpgo/nccl" // registers "nccl" with launch; opened at run time
)

// backend is a registered backend: its one description (launch.Backend,
// from the registry) and what this run of ddpbench made of it.
type backend struct {
	launch.Backend
	// launched: this run has one rank per process, started by a
	// launcher (mpirun); the ranks' count comes from the launcher, not
	// from --ranks. lookupBackend decides it for an InProcess backend.
	launched bool
	// library describes the library loaded (nccl), and standIn is not
	// empty when it is the test stand-in: every output says so.
	library, standIn string
	lib              *nccl.Library // what the backend's setup loaded (nccl)
	devices          []string      // the devices' names, by ordinal (nccl)
	// open, if set, starts n in-process ranks instead of launch.Open
	// (tests use it to put a faulty backend under the CLI).
	open func(n int) ([]comm.Communicator, error)
}

// built reports whether this binary can run b.
func (b backend) built() bool { return b.NotBuilt == "" }

// setup is what ddpbench does for one backend beyond launch.Open: what
// it loads before the run, and the Config it passes.
type setup struct {
	// prepare loads what the backend needs, filling b's library lines.
	prepare func(b *backend) error
	// config is launch.Options.Config for a run whose operations each
	// have timeout.
	config func(b backend, timeout time.Duration) any
	// library describes the library the backend runs on, for info.
	library func() string
}

var setups = map[string]setup{
	// One communicator per process: blocking collectives are the faster
	// mode (see package mpi).
	"mpi": {
		config:  func(_ backend, timeout time.Duration) any { return mpi.Options{Blocking: true, Timeout: timeout} },
		library: mpiLibrary,
	},
	"nccl": {
		prepare: prepareNCCL,
		// Under mpirun with package mpi built, the unique id travels over
		// MPI (launch.NewBootstrap), which Finalize then ends too.
		config:  func(b backend, timeout time.Duration) any { return ncclJob(b.lib, timeout) },
		library: ncclLibrary,
	},
}

// backends lists the registered backends, in the order info prints them.
var backends = registered()

func registered() []backend {
	var out []backend
	for _, b := range launch.Registered() {
		out = append(out, backend{Backend: b})
	}
	return out
}

// builtBackends returns the names of the backends ddpbench can run.
func builtBackends() []string {
	var out []string
	for _, b := range backends {
		if b.built() {
			out = append(out, b.Name)
		}
	}
	return out
}

// lookupBackend validates --backend, runs the backend's setup and decides,
// for an InProcess backend, from the environment whether this process is
// one rank of a launched job.
func lookupBackend(name string) (backend, error) {
	for _, b := range backends {
		if b.Name != name {
			continue
		}
		if !b.built() {
			return b, usagef("--backend %s: %s; built: %s", name, b.NotBuilt, strings.Join(builtBackends(), ", "))
		}
		b.launched = b.Launched
		if !b.Launched {
			if err := oneProcessOnly(name); err != nil {
				return b, err
			}
		}
		if b.InProcess {
			_, err := launch.FromEnv()
			b.launched = !errors.Is(err, launch.ErrNoLauncher)
		}
		if p := setups[name].prepare; p != nil {
			if err := p(&b); err != nil {
				return b, fmt.Errorf("--backend %s: %w", name, err)
			}
		}
		return b, nil
	}
	return backend{}, usagef("--backend %q: unknown (built: %s)", name, strings.Join(builtBackends(), ", "))
}

// oneProcessOnly refuses backend name, whose ranks are all goroutines of
// one process (inproc), in a process that a launcher started as one of
// several: each process would run a job of its own and print its results
// as if it were alone, as torchrun's users would not expect. Slurm's
// variables alone do not refuse it: a batch script sees its allocation's
// task count and is one process.
func oneProcessOnly(name string) error {
	env, err := launch.FromEnv()
	if err != nil || env.Size < 2 || env.Launcher == "slurm" {
		return nil
	}
	return usagef("--backend %s runs every rank in this process, but %s started %d processes (this is rank %d): "+
		"each would run a job of its own; use --backend mpi (or nccl), one rank per process", name, env.Launcher, env.Size, env.Rank)
}

// config is launch.Options.Config for b: its setup's, or nil.
func (b backend) config(timeout time.Duration) any {
	if c := setups[b.Name].config; c != nil {
		return c(b, timeout)
	}
	return nil
}

// prepareNCCL loads the libraries (DDPGO_NCCL_LIBRARY and
// DDPGO_CUDA_LIBRARY, else the standard names), failing with nccl's
// error, which says what to install.
func prepareNCCL(b *backend) error {
	lib, err := nccl.Open(nccl.Libraries{})
	if err != nil {
		return err
	}
	b.lib = lib
	info := lib.Info()
	b.library, b.standIn = ncclLibraryLine(info), info.StandIn
	for _, d := range info.Devices {
		b.devices = append(b.devices, d.Name)
	}
	return nil
}

// worldRanks returns the number of ranks of the job for backend b: the
// launcher's world size for a launched backend (1 when no launcher started
// this process), else --ranks. A launched backend refuses a --ranks that
// says otherwise.
func worldRanks(b backend, ranks int, ranksSet bool) (int, error) {
	if !b.launched {
		if ranks < 1 || ranks > 1024 {
			return 0, usagef("--ranks %d: want 1..1024", ranks)
		}
		return ranks, nil
	}
	env, err := launchEnv()
	if err != nil {
		return 0, usageError{err}
	}
	if ranksSet && ranks != env.Size {
		return 0, usagef("--ranks %d with --backend %s: the launcher started %d processes (%s), one rank each; leave --ranks out or make it %d",
			ranks, b.Name, env.Size, env, env.Size)
	}
	return env.Size, nil
}

// launchEnv is the launcher's environment, or a job of one process when
// no launcher started this one (MPI then runs as a singleton).
func launchEnv() (launch.Env, error) {
	env, err := launch.FromEnv()
	if errors.Is(err, launch.ErrNoLauncher) {
		return launch.Env{Launcher: "none (a single process)", Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}, nil
	}
	return env, err
}

// group is the ranks this process runs.
type group struct {
	comms []comm.Communicator
	size  int // ranks in the whole job
	rank  int // the first rank this process runs
	local int // this process's local rank on its machine (launched backends)
	// launched: one rank per process; only rank 0 prints results.
	launched bool
	pools    []*allocator.Pool // device pools (devicePools), or nil
	close    func()
}

// startGroup starts the ranks of backend b that this process runs: n
// goroutine ranks for inproc, this process's rank for a launched backend.
// timeout is the command's --timeout: a launched backend's own deadline
// for every operation, so that a rank waiting outside the reducer (in the
// statistics exchange between steps) ends the job too when a peer is gone.
func startGroup(ctx context.Context, b backend, n int, timeout time.Duration) (*group, error) {
	if !b.launched {
		var cs []comm.Communicator
		var err error
		if b.open != nil {
			cs, err = b.open(n)
		} else {
			cs, err = launch.Open(ctx, b.Name, launch.Options{Ranks: n, Config: b.config(timeout)})
		}
		if err != nil {
			return nil, fmt.Errorf("starting %d %s ranks: %w", n, b.Name, err)
		}
		g := &group{comms: cs, size: n}
		g.close = func() {
			g.closePools()
			closeAll(cs)
		}
		return g, nil
	}
	env, err := launchEnv()
	if err != nil {
		return nil, err
	}
	cs, err := launch.Open(ctx, b.Name, launch.Options{Env: &env, Config: b.config(timeout)})
	if err != nil {
		mpi.Finalize()
		return nil, fmt.Errorf("starting rank %d of %d (%s): %w", env.Rank, env.Size, b.Name, err)
	}
	g := &group{comms: cs, size: env.Size, rank: env.Rank, local: env.LocalRank, launched: true}
	g.close = func() {
		g.closePools()
		closeAll(cs)
		mpi.Finalize()
	}
	return g, nil
}

// ncclJob is the nccl backend's configuration: the libraries lookupBackend
// loaded, and --timeout as every operation's deadline.
func ncclJob(lib *nccl.Library, timeout time.Duration) nccl.JobOptions {
	return nccl.JobOptions{Library: lib, Config: nccl.Config{Timeout: timeout}}
}

// ncclLibraryLine describes the NCCL and CUDA libraries info loaded.
func ncclLibraryLine(i nccl.Info) string {
	s := fmt.Sprintf("NCCL %s (%s)", nccl.VersionString(i.NCCLVersion), i.NCCL)
	if i.DriverVersion > 0 {
		s += fmt.Sprintf(", CUDA driver API %s (%s)", nccl.DriverVersionString(i.DriverVersion), i.CUDA)
	}
	s += fmt.Sprintf(", %d device(s)", len(i.Devices))
	if i.Err != nil {
		s += ": " + i.Err.Error()
	}
	return s
}

// devicePools returns one CommPool per rank of this process over its
// communicator's device memory, sized for gradBytes of gradients as
// ddp.New sizes the pools it makes; made once, closed with the group.
func (g *group) devicePools(gradBytes int64) ([]*allocator.Pool, error) {
	if g.pools != nil {
		return g.pools, nil
	}
	pools := make([]*allocator.Pool, len(g.comms))
	for r, c := range g.comms {
		dm, ok := c.(bench.DeviceMemory)
		if !ok {
			closePools(pools)
			return nil, fmt.Errorf("rank %d: the communicator has no device memory to reduce in (DDPGO_DISTRIBUTED_DEBUG=DETAIL hides it)", c.Rank())
		}
		p, err := allocator.New(allocator.Options{Source: dm.Source(), Limit: poolLimit(gradBytes)})
		if err != nil {
			closePools(pools)
			return nil, fmt.Errorf("rank %d device CommPool: %w", c.Rank(), err)
		}
		pools[r] = p
	}
	g.pools = pools
	return pools, nil
}

func (g *group) closePools() {
	closePools(g.pools)
	g.pools = nil
}

func closeAll(cs []comm.Communicator) {
	for _, c := range cs {
		c.Close()
	}
}

// quietRank reports whether this process runs a rank other than 0 of a
// launched job: it prints only errors.
func (g *group) quietRank() bool { return g.launched && g.rank != 0 }

// rankPath returns path for a launched job's rank: "t.json" becomes
// "t.rank1.json", one file per process; path itself elsewhere.
func (g *group) rankPath(path string) string {
	if !g.launched || g.size == 1 {
		return path
	}
	dot := strings.LastIndex(path, ".")
	if dot <= strings.LastIndex(path, string(os.PathSeparator)) {
		return path + ".rank" + strconv.Itoa(g.rank)
	}
	return path[:dot] + ".rank" + strconv.Itoa(g.rank) + path[dot:]
}

// rankAddr returns the metrics address for this process: a launched job's
// ranks on one machine listen on the port plus their local rank.
func (g *group) rankAddr(addr string) string {
	if !g.launched || g.local == 0 {
		return addr
	}
	host, port, err := net.SplitHostPort(addr)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil || p == 0 {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(p+g.local))
}

func backendUsage() string {
	return "communication backend (built: " + strings.Join(builtBackends(), ", ") + "); mpi runs one rank per process under mpirun " +
		"(go build -tags mpi ./cmd/ddpbench); nccl one rank per GPU, one process per rank under mpirun or torchrun, else --ranks " +
		"ranks of this process (libnccl.so.2 from " + nccl.EnvNCCL + " or the loader's path)"
}

// standInBanner is the line every output of a run over the test stand-in
// carries, so that none of its figures passes for a GPU's.
func (b backend) standInBanner() string {
	return "STAND-IN: " + b.standIn + "; these figures are not NCCL's and not a GPU's"
}

// launchesJSON counts a process's NCCL launches over a run, warmup
// included: the groups or single operations handed to NCCL, and those
// that answered ncclInProgress (nccl.Library.Launches).
type launchesJSON struct {
	Launches   uint64 `json:"launches"`
	InProgress uint64 `json:"in_progress"`
}

// launchesSince returns a function that counts b's NCCL launches from
// now; it returns nil for a backend other than nccl.
func (b backend) launchesSince() func() *launchesJSON {
	if b.lib == nil {
		return func() *launchesJSON { return nil }
	}
	l0, p0 := b.lib.Launches()
	return func() *launchesJSON {
		l, p := b.lib.Launches()
		return &launchesJSON{Launches: l - l0, InProgress: p - p0}
	}
}
