// Command digits trains a small neural network to read handwritten digits,
// data-parallel over several ranks with the ddp Reducer, in one process or
// one process per rank under mpirun: the usage example of ddpgo.
//
// The data are the 1797 8x8 images of the UCI "Optical Recognition of
// Handwritten Digits" set (embedded from the repository's testdata/digits;
// see its README.md), split 80/20 into training and test sets by a seeded
// shuffle. The model is a perceptron with one hidden ReLU layer
// (64-128-10) trained with softmax cross-entropy and SGD with momentum.
//
// Every rank holds a replica of the model and takes its shard of every
// epoch from package sampler (PyTorch's DistributedSampler): the ranks'
// batches of one step together make up one global batch. Its backward pass is written by
// hand and marks each layer's gradients ready as soon as they are
// computed, last layer first, so the all-reduce of the last layer runs
// while the first layer is still being differentiated. Each rank's loss is
// the mean over its own shard and the Reducer averages over ranks, so with
// equal shards the averaged gradient is exactly the gradient of the mean
// loss over the global batch: N ranks follow the trajectory of one process
// on the whole batch, up to floating-point rounding. That is why the batch
// size must be a multiple of the number of ranks, and why each epoch drops
// its last partial batch.
//
// Usage:
//
//	go run ./examples/digits [-ranks 4] [-epochs 20] [-batch 64] [-hidden 128] [-lr 0.05] [-momentum 0.9] [-opt momentum|adam] [-shard] [-hook none|fp16|bf16|powersgd] [-powersgd-rank 4] [-powersgd-start 10] [-seed 1] [-data file.csv.gz] [-stats] [-trace out.json] [-save weights.bin] [-checkpoint ck.bin] [-resume ck.bin]
//
// -opt adam trains with Adam instead of SGD with momentum (try -lr
// 0.002). -shard shards the optimizer state (ddp.Options.Shard, ZeRO
// stage 1): the gradients are reduce-scattered, each rank steps only its
// part of each bucket, keeping a quarter of the state with 4 ranks, and
// publishes it with Gather as soon as it is stepped; WaitGather gives
// every rank the whole model. The losses and weights are the same bits as
// without -shard (TestShardMatchesUnsharded).
//
// -checkpoint writes the weights, the epochs done and the optimizer's
// state after the last epoch; with -shard the state is consolidated on
// rank 0 first (ddp.Reducer.Consolidate). -resume starts from such a file
// on any number of ranks, with -shard or without, each rank taking its
// parts of the state; -epochs counts the epochs done before. Resumed on
// the rank count that wrote it, training continues with the bits of an
// uninterrupted run (TestCheckpointResume):
//
//	go run ./examples/digits -ranks 2 -shard -opt adam -lr 0.002 -epochs 5 -checkpoint ck.bin
//	go run ./examples/digits -ranks 4 -opt adam -lr 0.002 -epochs 10 -resume ck.bin
//
// Across processes, one rank each, over Open MPI (the job's size is the
// number of ranks; rank 0 prints):
//
//	go build -tags mpi -o digits ./examples/digits
//	mpirun -np 4 ./digits -backend mpi
//	mpirun -np 4 -H host1:2,host2:2 ./digits -backend mpi
//
// The processes shard the data by their rank exactly as the goroutines of
// an in-process run do, so a job of N processes computes what -ranks N
// computes: its test (TestMPIMatchesInproc) finds the same losses and
// accuracies, and final weights equal with 2 processes and within 1.5e-7
// with 4 (the backend sums 4 contributions in rank order, in shared
// memory, or in MPI's order, not inproc's). -save writes rank
// 0's final weights, every parameter in order (W1, b1, W2, b2), as
// little-endian float32. Before training, the processes agree with one
// all-reduce that each has created its files (-trace, rank 0's -save): a
// bad path on one rank fails the whole job at once instead of leaving the
// others waiting for it. Every process finalizes MPI before it exits, on
// errors too. Open MPI binds each process to a core by default, so
// GOMAXPROCS is 1 in each and -stats shows little overlap.
//
// It prints the loss and accuracy on the training and test sets after
// every epoch; with -stats, also rank 0's mean step time, backward time,
// communication time and the share of communication hidden behind
// backward, from the Reducer's step statistics. -trace writes a timeline
// of steps 2 to 4 of every rank (ddp.WriteTimeline) that ui.perfetto.dev
// opens. Overlap needs each rank's communication goroutine to get a core
// while backward runs: on a machine with fewer free cores than ranks, a
// complete bucket may not launch until the training goroutine blocks in
// Wait, which shows as a small hidden share and as long bucket waits in
// the trace.
package main
