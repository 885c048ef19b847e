// Package bucket decides which gradients are reduced together and where each
// one lives inside its bucket. It is a pure, deterministic core: no
// goroutines, no I/O, no memory from the communication pool. The reducer
// calls Assign when it is built, Rebuild after the first iteration, and
// Encode/Decode to make every rank adopt rank 0's layout.
//
// # Assignment
//
// Assign reproduces PyTorch's compute_bucket_assignment_by_size
// (torch/csrc/distributed/c10d/reducer.cpp) rule for rule:
//
//   - Tensors are grouped by (DType, Device); a bucket never mixes groups and
//     a tensor is never split.
//   - Tensors are visited one by one (by index, or in the given order). The
//     visited tensor joins its group's open bucket; if the bucket's byte size
//     is then >= the limit in force, the bucket closes. A tensor at least as
//     large as the limit therefore closes whatever bucket it joins, and a
//     bucket may exceed its limit by up to one tensor.
//   - Each group walks the limits list on its own: its first bucket is built
//     under limits[0], the next under limits[1], and the last limit applies
//     to every later bucket. The limit recorded for a bucket (Bucket.Limit,
//     PyTorch's per_bucket_size_limits) is the one in force when its last
//     tensor was added.
//   - After the last tensor, each group's open bucket closes ("leftovers").
//   - Without an order, buckets are sorted by their smallest tensor index.
//     With an order, nothing is sorted: buckets come in the order they
//     closed, leftovers last.
//
// # Quirks matched, and where they come from
//
// Leftovers. PyTorch closes the leftover buckets while iterating a
// std::unordered_map keyed by (dtype, device). Without an order the final
// sort hides this. With an order (a rebuild) it decides the order of the
// last buckets of a mixed-type model. The map is filled in order of each
// group's first appearance, and libstdc++ links a new key in front of the
// node list (or in front of the keys already in its hash bucket), so with
// one or two groups the leftovers close in reverse order of first
// appearance. Assign does exactly that. With three or more groups PyTorch's
// order also depends on the c10 hash values of the keys modulo the map's
// bucket count (13 for fewer than 14 keys); reverse first appearance
// matches it whenever those do not collide.
//
// Zero limits. PyTorch accepts any size_t limit; a limit of 0 would close a
// bucket after every tensor. Assign rejects non-positive limits instead.
//
// Empty tensors. A tensor with Numel 0 joins a bucket without growing it.
// PyTorch refuses an empty tensor list, and so does Assign.
//
// Sparse gradients are not supported. In PyTorch a tensor whose
// expect_sparse_gradient flag is set (looked up by tensor index, not by
// visit position) gets a bucket of its own, recorded with limit 0, placed
// at the point it is visited; sparse tensors themselves are rejected. This
// package has no such flag: every tensor is dense.
//
// # What DDP passes in
//
// torch/nn/parallel/distributed.py (_ddp_init_helper) computes the initial
// buckets over the parameters in registration order, not reversed, and then
// reverses the list of buckets before handing it to the Reducer, so that
// the bucket holding the last layers comes first. Its limits are
// [sys.maxsize], one bucket for the whole model, unless
// find_unused_parameters is set and static_graph is not; then they are
// [_DEFAULT_FIRST_BUCKET_BYTES (1 MiB), bucket_cap] when bucket_cap_mb was
// left at its default, and [bucket_cap] when it was given explicitly.
//
// The Reducer rebuilds its buckets once, after the first iteration, only
// when find_unused_parameters is off or static_graph is on
// (Reducer::should_rebuild_buckets); with find_unused_parameters alone the
// initial layout stays. The rebuild (Reducer::rebuild_buckets) always uses
// [first_bucket_bytes_cap, bucket_bytes_cap] over the parameters in the
// order their gradients became ready, without sorting; Rebuild is that
// call. Rank 0's result is then broadcast (sync_bucket_indices); Encode and
// Decode carry it here.
//
// # Layout
//
// Within a bucket, tensors are packed densely in assignment order: Offsets[i]
// is the sum of the byte sizes of Tensors[:i] and Bytes is the total. The
// reducer adds alignment when it allocates the bucket, not here.
package bucket
