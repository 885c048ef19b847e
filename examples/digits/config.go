package main

// trainFraction is the share of the data set used for training; the rest
// is the test set.
const trainFraction = 0.8

// config is what the command-line flags set.
type config struct {
	Backend  string  // inproc (ranks as goroutines) or mpi (a rank per process)
	Ranks    int     // data-parallel replicas (with mpi: the job's size)
	Epochs   int     // passes over the training set
	Batch    int     // global batch size; a multiple of Ranks
	Hidden   int     // hidden units
	LR       float64 // learning rate
	Momentum float64 // SGD momentum
	Hook     string  // gradient reduction: none, allreduce, fp16, bf16, powersgd
	Seed     uint64  // split, initialisation and shuffling
	Data     string  // CSV(.gz) path; "" = the embedded copy
	Stats    bool    // print step timings per epoch
	Trace    string  // timeline file; "" = none
	Save     string  // final weights file (rank 0); "" = none
	// RanksSet says that -ranks was given: with mpi it must then equal
	// the job's size.
	RanksSet bool
	// PowerSGD's rank and start step (-hook powersgd).
	PowerSGDRank, PowerSGDStart int
	// Optimizer is momentum (SGD with Momentum) or adam.
	Optimizer string
	// Shard keeps each rank's optimizer state for its part of each
	// bucket only (ddp.Options.Shard, ZeRO stage 1).
	Shard bool
	// Checkpoint is where rank 0 writes the checkpoint after the last
	// epoch (checkpoint.go); "" = none. Resume is a checkpoint to start
	// from, whatever the number of ranks that wrote it.
	Checkpoint, Resume string
}

func defaultConfig() config {
	return config{Backend: "inproc", Ranks: 4, Epochs: 20, Batch: 64, Hidden: 128, LR: 0.05, Momentum: 0.9, Optimizer: "momentum", Hook: "none", Seed: 1, PowerSGDRank: 4, PowerSGDStart: 10}
}
