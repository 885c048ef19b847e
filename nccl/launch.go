package nccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/launch"
	"github.com/ddpgo/ddpgo/rendezvous"
)

// The backend registers itself with package launch in every build
// (without cgo, opening it fails with ErrNoCgo). It runs either way: one
// rank per process under a launcher, or Options.Ranks ranks of this
// process, one device each.
func init() {
	launch.Register(launch.Backend{Name: "nccl", Launched: true, InProcess: true, DeviceMemory: true,
		About: "one GPU per rank, NCCL; one process per rank under mpirun or torchrun, else --ranks ranks of this process",
		Open:  openJob})
}

// JobOptions is the Config that launch.Open passes to the "nccl" backend;
// nil means the zero value.
type JobOptions struct {
	// Libraries to load; empty fields mean DDPGO_NCCL_LIBRARY and
	// DDPGO_CUDA_LIBRARY when set, else the standard names.
	Libraries Libraries
	// Library, if not nil, is a pair already loaded (Open), used instead
	// of Libraries.
	Library *Library
	// Config is every rank's Config; Rank, Size, Device and ID are set
	// per rank.
	Config Config
	// Devices chooses the devices. In this process, rank r uses
	// Devices[r] (nil: device r). Under a launcher, the process uses
	// Devices[0] when given, else its local rank, as torchrun's
	// LOCAL_RANK and mpirun's local rank number the GPUs of a machine.
	Devices []int
	// Key is the rendezvous key of the unique id under a launcher
	// without an MPI bootstrap; "" means "ddpgo/nccl/unique-id".
	Key string
}

// openJob is launch.Open's entry.
func openJob(ctx context.Context, job launch.Job) ([]comm.Communicator, error) {
	var o JobOptions
	switch cfg := job.Config.(type) {
	case nil:
	case JobOptions:
		o = cfg
	default:
		return nil, fmt.Errorf("%w: nccl takes nccl.JobOptions as Config, not %T", comm.ErrInvalid, job.Config)
	}
	lib := o.Library
	if lib == nil {
		var err error
		if lib, err = Open(o.Libraries); err != nil {
			return nil, err
		}
	}
	if job.Launched {
		c, err := openLaunched(ctx, lib, job.Env, o)
		if err != nil {
			return nil, err
		}
		return []comm.Communicator{c}, nil
	}
	n := job.Ranks
	if o.Devices != nil && len(o.Devices) != n {
		return nil, fmt.Errorf("%w: nccl: %d ranks in this process but %d Devices", comm.ErrInvalid, n, len(o.Devices))
	}
	id, err := lib.NewUniqueID()
	if err != nil {
		return nil, err
	}
	cfgs := make([]Config, n)
	for r := range cfgs {
		cfgs[r] = o.Config
		cfgs[r].Rank, cfgs[r].Size, cfgs[r].ID, cfgs[r].Device = r, n, id, r
		if o.Devices != nil {
			cfgs[r].Device = o.Devices[r]
		}
	}
	cs, err := lib.NewComms(ctx, cfgs)
	if err != nil {
		return nil, fmt.Errorf("%w (in this process, one device per rank: %d ranks need %d devices)", err, n, n)
	}
	out := make([]comm.Communicator, n)
	for r, c := range cs {
		out[r] = c
	}
	return out, nil
}

// openLaunched makes this process's communicator: the unique id comes
// through MPI where launch has a bootstrap for the job (mpirun with
// package mpi built), else through the rendezvous store that rank 0
// serves at MASTER_ADDR:MASTER_PORT.
func openLaunched(ctx context.Context, lib *Library, env launch.Env, o JobOptions) (*Comm, error) {
	cfg := o.Config
	cfg.Rank, cfg.Size, cfg.Device = env.Rank, env.Size, env.LocalRank
	if len(o.Devices) > 0 {
		cfg.Device = o.Devices[0]
	}
	key := o.Key
	if key == "" {
		key = "ddpgo/nccl/unique-id"
	}
	var store Store
	b, err := launch.NewBootstrap(ctx, env)
	switch {
	case err == nil:
		defer b.Close()
		store = launch.BroadcastStore{B: b, Root: 0}
	case !errors.Is(err, launch.ErrNoBootstrap):
		return nil, err
	case env.MasterAddr == "":
		return nil, fmt.Errorf("nccl: rank %d of %d (%s): no way to share NCCL's unique id: %w; set MASTER_ADDR and MASTER_PORT (rank 0 then serves the id there)",
			env.Rank, env.Size, env.Launcher, err)
	default:
		timeout := cfg.Timeout
		if timeout == 0 {
			timeout = DefaultTimeout
		}
		s, err := rendezvous.Open(ctx, rendezvous.Options{Addr: net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort)),
			Rank: env.Rank, Size: env.Size, Timeout: timeout})
		if err != nil {
			return nil, fmt.Errorf("nccl: rank %d of %d: the rendezvous store at %s:%d: %w", env.Rank, env.Size, env.MasterAddr, env.MasterPort, err)
		}
		// Connect returns once every rank has joined the communicator,
		// having read the id: the store has served its purpose.
		defer s.Close()
		store = s
	}
	c, err := lib.Connect(ctx, store, key, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w (launcher %s, local rank %d)", err, env.Launcher, env.LocalRank)
	}
	return c, nil
}

// Library returns the Library c was made from: its paths, version and
// whether it is the test stand-in.
func (c *Comm) Library() *Library { return c.lib }
