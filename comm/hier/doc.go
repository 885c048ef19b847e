// Package hier composes one communicator for a job whose ranks span hosts
// with several ranks per host, out of two communicators per rank: Local,
// over the ranks of its host, and Cross, over the ranks of the other hosts
// with the same local rank. Collectives move most bytes inside the hosts
// (shared memory) and send each host's share across the network once,
// split between its local ranks, which is what NCCL's intra-node and
// inter-node split, Horovod's hierarchical all-reduce and Open MPI's
// coll/han do.
//
// # The model
//
// A Layout gives every global rank its Place: a host index, 0 to H-1, and
// a local rank. Host h has L_h ranks, local ranks 0 to L_h-1; L_h may differ from
// host to host (3 ranks on one, 1 on another), and the global numbering
// is free. Local rank j's cross group is local rank j of every host that
// has one, ranked in host order. New checks that each level's rank and
// size are the layout's, and the Comm it returns meets the comm contract
// over the global numbering: the conformance suite in comm/commtest runs
// over it. An optional third level, World (the whole job), carries the
// Sends and Recvs between ranks that share neither host nor local rank;
// no pair of the two levels can reach each other without a third rank's
// help.
//
// Let S be the smallest L_h. A buffer of n elements is cut into S shards
// of q = n/S elements, the last one taking the n - S·q left over too. The
// cut depends on n and S alone, so every host cuts a buffer at the same
// places, and shard j lives on local rank j, which every host has (j < S
// <= L_h): the cross group of local rank j holds one rank of every host.
// So an exchange of shard j in that cross group combines every host's
// part of it exactly once, on every layout. Local ranks S and up take no
// part in the cross exchanges of collectives: on a 3+1 layout, S is 1,
// local rank 0 of each host carries the whole buffer, and the other ranks
// of the first host only reduce and receive inside it. That is the
// uneven-host rule: correct on any layout, and as parallel as the
// smallest host allows.
//
// # The algorithms
//
// AllReduce: the host reduces its ranks' buffers into the shards
// (collect: one reduce-scatter of the S·q elements and a reduce of the
// leftover to local rank S-1 on a host of S ranks; one reduce per shard on
// a larger host), local rank j all-reduces shard j in its cross group,
// and the host spreads the shards back to all its ranks (spread: an
// all-gather and a broadcast of the leftover, or a broadcast per shard).
// Counts that S does not divide are handled exactly by that uneven last
// shard, without padding or copies. With Config.ChunkBytes set, an all-reduce
// of more than twice that is cut into chunks that go through the same three
// phases as a pipeline: while chunk i crosses the hosts, the host
// collects chunk i+1 and spreads chunk i-1 (on the host's level in that
// order, the same on every rank), so that the work inside the hosts
// overlaps the network's. Avg is summed on both levels and
// divided by the job's size once, by the shard's owner (in the element
// type's arithmetic; integers truncate; half-precision elements are
// multiplied by 1/size in float32 and rounded), since the levels' own
// averages would weigh hosts alike whatever their number of ranks.
// Each element of the result is computed once, by the cross all-reduce of
// its shard and the owner's division, and copied from there, so every rank
// has the same bits. A float32 sum is a sum of the same Size values in
// another order than a flat all-reduce's, so each is within
// γ(Size-1)·Σ|x_i| of the exact sum, with γ(k) = k·u/(1-k·u) and u = 2^-24,
// and the two within twice that of each other; integer sums, Max and Min
// are exact. Float16 and BFloat16 sums round once per level (in each
// level's own accumulation), so they may differ from the single rounding
// of the exact sum: Caps.HalfPrecision is false.
//
// Broadcast: root's host broadcasts the buffer inside, local rank j
// broadcasts shard j from root's host in its cross group, and every other
// host spreads the shards. Reduce: as AllReduce, with the cross step a
// reduce to root's host, where root takes the shards it does not hold by
// a broadcast from each owner; ranks other than root work in scratch
// memory, since their recv is not theirs to write. Barrier: a barrier
// inside each host, one in the cross group of local rank 0 (every host),
// and one more inside each host. ReduceScatter on hosts of equal size L:
// each rank copies its send so that local rank j's share of the host's
// reduce-scatter is local rank j's blocks of every host, in host order;
// local rank j then reduce-scatters that share in its cross group and
// keeps its own block, so each rank sends (H-1)·count elements between
// hosts, as with one rank per host. On uneven hosts it is an AllReduce
// into scratch memory, of which each rank keeps its block (a full
// all-reduce's traffic). AllGather on hosts of equal size is the inverse:
// local rank j gathers local rank j's blocks of every host in its cross
// group, the host gathers the shares, and the blocks are copied to their
// ranks' places. On uneven hosts each host gathers its ranks' blocks, the
// local ranks 0 (every host's) broadcast their host's blocks to each other
// in turn, and each local rank 0 broadcasts the other hosts' blocks inside
// its host; with a numbering that is not host-major it gathers in scratch
// memory and copies the blocks to their ranks' places. Send and
// Recv go over the level the two ranks share, else over World. When one
// level is the whole job (one host, or one rank per host) every operation
// goes to it whole, but AllGather and ReduceScatter when the numbering is
// not that level's.
//
// # Order and asynchrony
//
// Every call returns a comm.Work at once (package comm/backend's Ring). A
// worker goroutine per rank runs the rank's operations in issue order,
// each phase issued once the phase before it has completed, so each
// level's sequence of inner collectives is a function of the rank's calls
// alone and is the same on every rank of that level. Consecutive
// operations do not overlap their phases (only the chunks of one
// all-reduce do): the next one's local phase could otherwise be issued
// before or after this one's last local phase depending on timing, and
// the ranks of a host would disagree; and the next one may read what this
// one writes. Scratch
// memory comes from Config.Pool (or a private host pool) and goes back
// once every inner operation that used it has completed.
//
// # Failure
//
// An inner operation that fails fails the operation with an error naming
// the rank, the level and the inner operation and wrapping the inner
// error, and fails the Comm for good: every later operation fails with
// that error. The levels are then out of step, so the Comm aborts every
// level with the cause; a peer waiting on this rank on another level fails
// too (at once where that level's Abort reaches its peers, as inproc's
// does, and aborts its own levels in turn) instead of waiting for its
// deadline. A rank does not watch its idle levels: one that waits on its
// cross group while a peer aborts its host's level learns of it from the
// cross group's peers (which fail in turn when they use a failed level of
// theirs), or when its next phase uses the host's level, or at the cross
// level's deadline. Abort aborts the levels the same way, with an error wrapping
// comm.ErrAborted and the cause; Close closes them. The bound within which
// a pending operation completes after Abort or Close is therefore that of
// the levels', and the Comm writes no buffer after an operation's Work has
// completed, since it waits for every inner operation to complete first.
package hier
