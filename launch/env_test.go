package launch

import (
	"errors"
	"strings"
	"testing"
)

func lookupIn(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		vars map[string]string
		want Env
		err  []string // substrings of the error; nil: no error
	}{
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
			Env{Launcher: "openmpi", Rank: 1, Size: 4, LocalRank: 1, LocalSize: 2}, nil},
		{"mpich", map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
			Env{Launcher: "mpich", Rank: 3, Size: 4, LocalRank: 0, LocalSize: 1}, nil},
		{"mpich without local size", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"},
			Env{Launcher: "mpich", Rank: 0, Size: 2}, nil},
		{"torchrun", map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
			Env{Launcher: "torchrun", Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, MasterAddr: "10.0.0.1", MasterPort: 29500}, nil},
		{"slurm", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x2),3", "SLURM_NODEID": "2"},
			Env{Launcher: "slurm", Rank: 5, Size: 7, LocalRank: 1, LocalSize: 3}, nil},
		{"slurm ntasks per node", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "garbage"},
			Env{Launcher: "slurm", Rank: 1, Size: 4, LocalRank: 1, LocalSize: 2}, nil},
		{"mpirun inside a slurm allocation", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
			Env{Launcher: "openmpi", Rank: 3, Size: 4}, nil},
		{"mpirun with an agreeing RANK", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			Env{Launcher: "openmpi", Rank: 1, Size: 2, MasterAddr: "h", MasterPort: 1}, nil},
		{"mpirun with a master address", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": " host1 ", "MASTER_PORT": "29500"},
			Env{Launcher: "openmpi", Rank: 0, Size: 2, MasterAddr: "host1", MasterPort: 29500}, nil},

		{"nothing", map[string]string{"HOME": "/"}, Env{}, []string{"OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE", "PMI_RANK/PMI_SIZE", "RANK/WORLD_SIZE", "SLURM_PROCID/SLURM_NTASKS"}},
		{"rank without size", map[string]string{"RANK": "0"}, Env{}, []string{"RANK is set but WORLD_SIZE is not"}},
		{"size without rank", map[string]string{"OMPI_COMM_WORLD_SIZE": "2"}, Env{}, []string{"OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"}},
		{"rank not a number", map[string]string{"PMI_RANK": "one", "PMI_SIZE": "2"}, Env{}, []string{`PMI_RANK="one"`}},
		{"size zero", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "0"}, Env{}, []string{`PMI_SIZE="0"`, ">= 1"}},
		{"rank beyond size", map[string]string{"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, Env{}, []string{"SLURM_PROCID=4 is not below SLURM_NTASKS=4"}},
		{"local rank beyond local size", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
			Env{}, []string{"OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2"}},
		{"local size beyond size", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			Env{}, []string{"LOCAL_WORLD_SIZE=3 exceeds WORLD_SIZE=2"}},
		{"stale RANK beside mpirun", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "1"},
			Env{}, []string{"contradictory", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "RANK=0", "WORLD_SIZE=1"}},
		{"openmpi and mpich disagree", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMI_RANK": "0", "PMI_SIZE": "2"},
			Env{}, []string{"contradictory", "PMI_RANK=0"}},
		{"torchrun without master", map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, Env{}, []string{"MASTER_ADDR and MASTER_PORT are not"}},
		{"master address alone", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "h"}, Env{}, []string{"only MASTER_ADDR is set"}},
		{"master port alone", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_PORT": "1"}, Env{}, []string{"only MASTER_PORT is set"}},
		{"master port out of range", map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, Env{}, []string{`MASTER_PORT="70000"`}},
		{"slurm tasks per node malformed", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2(x"}, Env{}, []string{`SLURM_TASKS_PER_NODE="2(x"`}},
		{"slurm node beyond the list", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "2"}, Env{}, []string{"SLURM_NODEID is beyond"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(lookupIn(tc.vars))
			if tc.err == nil {
				if err != nil || got != tc.want {
					t.Fatalf("Parse = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrEnv) {
				t.Fatalf("Parse = %+v, %v; want an error wrapping ErrEnv", got, err)
			}
			for _, s := range tc.err {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestEnvString(t *testing.T) {
	e := Env{Launcher: "torchrun", Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, MasterAddr: "h", MasterPort: 29500}
	if got, want := e.String(), "torchrun: rank 1 of 2, local rank 1 of 2, master h:29500"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestNoLauncher: with none of the launchers' variables set, the error
// says so as ErrNoLauncher (a program may run as a job of one process);
// a contradictory environment is not that error.
func TestNoLauncher(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	if _, err := Parse(none); !errors.Is(err, ErrNoLauncher) || !errors.Is(err, ErrEnv) {
		t.Errorf("no launcher: %v; want ErrEnv and ErrNoLauncher", err)
	}
	env := map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "RANK": "1", "WORLD_SIZE": "2",
		"MASTER_ADDR": "198.18.0.1", "MASTER_PORT": "29500"}
	_, err := Parse(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err == nil || errors.Is(err, ErrNoLauncher) {
		t.Errorf("contradictory launchers: %v; want an error other than ErrNoLauncher", err)
	}
}
