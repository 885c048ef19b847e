package launch

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrEnv is wrapped by every error about the launcher's environment.
var ErrEnv = errors.New("launch: environment")

// ErrNoLauncher is wrapped (with ErrEnv) by FromEnv's error when no
// launcher's variables are set at all: the process was started by hand,
// which a program may take as a job of one process.
var ErrNoLauncher = errors.New("no launcher")

// Env is a process's place in its job, as its launcher told it.
type Env struct {
	// Launcher names where Rank and Size came from: "openmpi", "mpich",
	// "torchrun" or "slurm".
	Launcher string
	// Rank is the process's rank in the job, 0 <= Rank < Size.
	Rank, Size int
	// LocalRank and LocalSize are the rank among the job's processes on
	// this machine and their number; LocalSize is 0 where the launcher
	// does not say.
	LocalRank, LocalSize int
	// MasterAddr and MasterPort are the rendezvous address of torchrun's
	// convention (MASTER_ADDR, MASTER_PORT), where a backend that needs
	// one (NCCL's unique id, without MPI) meets its peers; empty and 0
	// when unset.
	MasterAddr string
	MasterPort int
}

// String describes e in one line, naming its source.
func (e Env) String() string {
	s := fmt.Sprintf("%s: rank %d of %d", e.Launcher, e.Rank, e.Size)
	if e.LocalSize > 0 {
		s += fmt.Sprintf(", local rank %d of %d", e.LocalRank, e.LocalSize)
	}
	if e.MasterAddr != "" {
		s += fmt.Sprintf(", master %s:%d", e.MasterAddr, e.MasterPort)
	}
	return s
}

// launcher is one launcher's variables, in order: rank, size, local rank,
// local size (either local name may be empty).
type launcher struct {
	name                          string
	rank, size, localRank, localN string
}

// launchers, innermost first: a process started by mpirun inside a Slurm
// allocation, or by torchrun inside one, also sees the allocation's
// SLURM_* variables, which describe the batch step rather than the job,
// so the first launcher found wins over Slurm.
var launchers = []launcher{
	{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
	{"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
	{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
	{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""},
}

// FromEnv reads the process's rank, size, local rank and local size from
// the variables that Open MPI's mpirun (OMPI_COMM_WORLD_*), MPICH's Hydra
// (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or
// Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the tasks per node)
// set. See Parse for the rules.
func FromEnv() (Env, error) { return Parse(os.LookupEnv) }

// Parse is FromEnv over the variables that lookup returns. The innermost
// launcher found decides (Open MPI, MPICH, torchrun, then Slurm); it is an
// error wrapping ErrEnv, naming the variables, when no launcher's rank
// and size are set, when only part of a launcher's set is, when a value is
// not a number or out of range, or when two launchers other than Slurm
// disagree (RANK left over from another job beside mpirun's variables, for
// one). Slurm's variables describe the allocation and may differ from an
// inner launcher's without error.
func Parse(lookup func(string) (string, bool)) (Env, error) {
	var found []Env
	for _, l := range launchers {
		e, ok, err := l.parse(lookup)
		if err != nil {
			return Env{}, err
		}
		if ok {
			found = append(found, e)
		}
	}
	if len(found) == 0 {
		var names []string
		for _, l := range launchers {
			names = append(names, l.rank+"/"+l.size)
		}
		return Env{}, fmt.Errorf("%w: %w: no launcher's rank and size are set (looked for %s): start the job with mpirun, mpiexec, srun or torchrun, or pass the environment explicitly", ErrEnv, ErrNoLauncher, strings.Join(names, ", "))
	}
	e := found[0]
	for _, o := range found[1:] {
		if o.Launcher == "slurm" {
			continue
		}
		if o.Rank != e.Rank || o.Size != e.Size {
			a, b := byName(e.Launcher), byName(o.Launcher)
			return Env{}, fmt.Errorf("%w: contradictory: %s=%d %s=%d (%s) but %s=%d %s=%d (%s); unset the stale ones",
				ErrEnv, a.rank, e.Rank, a.size, e.Size, e.Launcher, b.rank, o.Rank, b.size, o.Size, o.Launcher)
		}
	}
	addr, hasAddr := lookup("MASTER_ADDR")
	port, hasPort := lookup("MASTER_PORT")
	switch {
	case hasAddr != hasPort:
		return Env{}, fmt.Errorf("%w: MASTER_ADDR and MASTER_PORT go together; only %s is set", ErrEnv, map[bool]string{true: "MASTER_ADDR", false: "MASTER_PORT"}[hasAddr])
	case hasAddr:
		p, err := strconv.Atoi(strings.TrimSpace(port))
		if err != nil || p < 1 || p > 65535 {
			return Env{}, fmt.Errorf("%w: MASTER_PORT=%q: want a port number 1..65535", ErrEnv, port)
		}
		if strings.TrimSpace(addr) == "" {
			return Env{}, fmt.Errorf("%w: MASTER_ADDR is empty", ErrEnv)
		}
		e.MasterAddr, e.MasterPort = strings.TrimSpace(addr), p
	case e.Launcher == "torchrun":
		return Env{}, fmt.Errorf("%w: RANK and WORLD_SIZE are set (torchrun's convention) but MASTER_ADDR and MASTER_PORT are not", ErrEnv)
	}
	return e, nil
}

func byName(name string) launcher {
	for _, l := range launchers {
		if l.name == name {
			return l
		}
	}
	return launcher{}
}

// parse reads l's variables: ok reports whether its rank and size are set.
func (l launcher) parse(lookup func(string) (string, bool)) (e Env, ok bool, err error) {
	rank, hasRank := lookup(l.rank)
	size, hasSize := lookup(l.size)
	if !hasRank && !hasSize {
		return Env{}, false, nil
	}
	if hasRank != hasSize {
		set, unset := l.rank, l.size
		if hasSize {
			set, unset = unset, set
		}
		return Env{}, false, fmt.Errorf("%w: %s is set but %s is not (%s)", ErrEnv, set, unset, l.name)
	}
	e.Launcher = l.name
	if e.Size, err = number(l.size, size, 1); err != nil {
		return Env{}, false, err
	}
	if e.Rank, err = number(l.rank, rank, 0); err != nil {
		return Env{}, false, err
	}
	if e.Rank >= e.Size {
		return Env{}, false, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrEnv, l.rank, e.Rank, l.size, e.Size)
	}
	if v, has := lookup(l.localRank); has {
		if e.LocalRank, err = number(l.localRank, v, 0); err != nil {
			return Env{}, false, err
		}
	}
	switch {
	case l.localN != "":
		if v, has := lookup(l.localN); has {
			if e.LocalSize, err = number(l.localN, v, 1); err != nil {
				return Env{}, false, err
			}
		}
	case l.name == "slurm":
		if e.LocalSize, err = slurmLocalSize(lookup); err != nil {
			return Env{}, false, err
		}
	}
	switch {
	case e.LocalSize > 0 && e.LocalRank >= e.LocalSize:
		return Env{}, false, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrEnv, l.localRank, e.LocalRank, localSizeName(l), e.LocalSize)
	case e.LocalSize > e.Size:
		return Env{}, false, fmt.Errorf("%w: %s=%d exceeds %s=%d", ErrEnv, localSizeName(l), e.LocalSize, l.size, e.Size)
	}
	return e, true, nil
}

func localSizeName(l launcher) string {
	if l.localN == "" {
		return "SLURM_TASKS_PER_NODE"
	}
	return l.localN
}

// number parses variable name's value v as an integer >= lo.
func number(name, v string, lo int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < lo {
		return 0, fmt.Errorf("%w: %s=%q: want an integer >= %d", ErrEnv, name, v, lo)
	}
	return n, nil
}

// slurmLocalSize returns the number of tasks on this node:
// SLURM_NTASKS_PER_NODE when set, else this node's entry (SLURM_NODEID)
// of SLURM_TASKS_PER_NODE ("2(x3),1": three nodes of 2 tasks, then one of
// 1), or 0 when neither says.
func slurmLocalSize(lookup func(string) (string, bool)) (int, error) {
	if v, ok := lookup("SLURM_NTASKS_PER_NODE"); ok {
		return number("SLURM_NTASKS_PER_NODE", v, 1)
	}
	v, ok := lookup("SLURM_TASKS_PER_NODE")
	if !ok {
		return 0, nil
	}
	node := 0
	if id, ok := lookup("SLURM_NODEID"); ok {
		var err error
		if node, err = number("SLURM_NODEID", id, 0); err != nil {
			return 0, err
		}
	}
	bad := fmt.Errorf("%w: SLURM_TASKS_PER_NODE=%q: want a list such as 2(x3),1", ErrEnv, v)
	for _, part := range strings.Split(v, ",") {
		tasks, reps := part, "1"
		if i := strings.Index(part, "(x"); i >= 0 {
			if !strings.HasSuffix(part, ")") {
				return 0, bad
			}
			tasks, reps = part[:i], part[i+2:len(part)-1]
		}
		t, err1 := strconv.Atoi(tasks)
		r, err2 := strconv.Atoi(reps)
		if err1 != nil || err2 != nil || t < 1 || r < 1 {
			return 0, bad
		}
		if node < r {
			return t, nil
		}
		node -= r
	}
	return 0, fmt.Errorf("%w: SLURM_NODEID is beyond the nodes of SLURM_TASKS_PER_NODE=%q", ErrEnv, v)
}
