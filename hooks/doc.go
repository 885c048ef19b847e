// Package hooks decides how one bucket of gradients is reduced across
// ranks: PyTorch DDP's communication hooks.
//
// A Hook receives a bucket of gradients of one floating-point dtype (a
// comm.Buffer over CommPool memory, host or device) and must leave it
// holding the average over all ranks. Five hooks are built in (ByName
// finds them by name):
//
//   - Avg (the Reducer's default): one all-reduce with comm.Avg, which the
//     backend computes inside its reduction pass as a pre-multiplied sum;
//     where Avg is not native (comm.Caps), scale by 1/N then Sum.
//   - AllReduce: divide by the group size N in float32, then all-reduce with
//     Sum in place (PyTorch's allreduce_hook). No scratch.
//   - FP16: scale by 1/N in float32 and round once to IEEE binary16 into
//     scratch, all-reduce the scratch with Sum in float16, convert the sum
//     back into the bucket (fp16_compress_hook). Half the bytes on the wire.
//   - BF16: the same with bfloat16 (bf16_compress_hook).
//   - PowerSGD: a low-rank approximation of each gradient matrix, with
//     error feedback and warm start (powerSGD_hook; below). Its wire
//     carries a small fraction of the bytes, at the cost of matrix
//     products on the host and of an approximate average.
//
// # Dtypes
//
// What each hook does with a bucket of each dtype (Hook.Wire reports the
// wire dtype, 0 where a hook refuses the dtype):
//
//	bucket     Avg, AllReduce                FP16, BF16
//	float32    as above                      compressed to 16 bits as above
//	float64    comm.Avg in float64           refused (ErrDType)
//	float16    as above, in float16          reduced as AllReduce does, in float16
//	bfloat16   as above, in bfloat16         reduced as AllReduce does, in bfloat16
//
// A float64 bucket is always all-reduced with comm.Avg, which every
// backend computes in float64: scaling it first would multiply it by 1/N
// rounded to float32, comm.Kernels.Scale's factor. FP16 and BF16 refuse
// float64 rather than round a gradient the model keeps in float64 to 16
// bits; a half-precision bucket is already as narrow as their wire, so
// they reduce it in place in its own dtype, with no scratch. Overflows are
// counted for compressed (float32) buckets only.
//
// # Two phases
//
// A hook works in two phases so that several buckets can be on the wire at
// once: Launch compresses and issues the collective and returns its Work
// at once; Finish decompresses once that Work has completed. The Reducer
// runs Launch on one goroutine, in bucket order, and Finish on another, and
// keeps a window of buckets between the two (ddp.Options.MaxInFlight). It
// also times the phases itself. A custom hook (see the Example) implements
// the same interface; it must issue its collectives in Launch, or, where
// one collective needs another's result (PowerSGD), from a goroutine of its
// own that issues them in Launch order.
//
// # Reduce-scatter
//
// A bucket with Bucket.Scatter set (ddp.Options.Shard, ZeRO stage 1) is
// reduce-scattered instead of all-reduced: its Buf holds N equal blocks,
// and the hook leaves the average in this rank's block (Bucket.Part)
// only. Avg, AllReduce, FP16 and BF16 do it (Scatterer) with the same
// operations as their all-reduce, in place: the same prescaling or
// compression of the whole bucket, a ReduceScatter instead of the
// AllReduce, and FP16's and BF16's overflow count and decompression on
// this rank's block. Each step is elementwise, so the block holds the
// bits the all-reduce would leave there. PowerSGD is not a Scatterer.
//
// # Memory
//
// A Hook value belongs to one rank and is bound to its communicator and
// kernels once, by Setup. Scratch memory is the Reducer's: a hook says how
// much it needs per bucket (Scratch) and finds it in Bucket.Scratch, which
// no other bucket in flight shares and which is not returned to the pool
// while its collective may still write it. A hook touches bucket memory
// only through comm.Kernels (package fp16's SIMD kernels on the host, a
// backend's kernels on a device), never through Go slices, and allocates
// nothing on the Go heap per bucket.
//
// # Overflows
//
// FP16 and BF16 count, in Bucket.Overflows, the elements whose reduced
// value is Inf or NaN although this rank's float32 gradient was finite.
// That counts this rank's conversion overflows (a value beyond 65504 after
// scaling becomes ±Inf and makes the sum non-finite), overflows of the
// half-precision sum, and non-finite values contributed by other ranks.
// The common case (no non-finite value) costs one word-wise scan of the
// reduced half-precision buffer. A non-zero count means the gradients need
// scaling down before compression (or BF16).
//
// # PowerSGD
//
// PowerSGD (Vogels et al., NeurIPS 2019) is PyTorch's powerSGD_hook with
// the options of its PowerSGDState (PowerSGDOptions). It needs the shapes
// of a bucket's tensors (Bucket.Tensors, which the Reducer gives) and
// views each as a matrix M of n = shape[0] rows and m = numel/n columns.
// Tensors of fewer than two dimensions, and matrices for which (n + m) ·
// rank · MinCompressionRate is not below n · m, are reduced as they are.
// Per synced step, from step StartIter on (the steps before are averaged
// uncompressed), for every other matrix:
//
//  1. with error feedback, M += the error this rank kept from the last
//     step;
//  2. Q (m×rank) is the last step's averaged Q (warm start) or fresh
//     normal values from Seed, the parameter and the step, the same on
//     every rank; its columns are orthonormalized; P = M·Q;
//  3. one all-reduce (a Sum) carries the bucket's uncompressed tensors,
//     scaled by 1/N, and all its Ps;
//  4. each P is orthonormalized, and Q = Mᵀ·P;
//  5. a second all-reduce carries all the bucket's Qs; Q /= N;
//  6. M = P·Qᵀ, the same on every rank, and the error becomes what M lost.
//
// A NaN or an Inf in one element of one rank's gradient reaches every
// rank's P, Q and average in that step; error feedback and warm start
// would then carry it into every later step. So the hook keeps its state
// out of such a step: Launch computes from the error and Q without
// writing them (M += error is done in the gradient, Q is orthonormalized
// in the scratch), and Finish writes them only if every reduced value of
// the bucket (its uncompressed tensors, Ps and Qs) is finite. Otherwise
// the bucket's average is non-finite, for the caller (a loss scaler) to
// see and skip, every matrix of the bucket keeps the error and Q it had
// before the step, and NonFinite counts the bucket. The reduced values
// are the same bits on every rank, so every rank decides alike. Keeping
// the state rather than restarting it makes a skipped step as if it had
// not happened, for the buckets that saw the non-finite value; a bucket
// that did not cannot know, when it finishes, of a later one that did,
// and updates as in any step. Keeping it costs a scan of the reduced
// values: the new error is computed from the gradient (M plus the old
// error) in the pass that writes P·Qᵀ over it. That difference can
// overflow on one rank in a step whose reduced values are finite, and an
// Inf error would make every later step non-finite, so each element of
// the new error that is not finite is set to 0 (ErrorResets counts them):
// the error is the rank's own and Q comes only from reduced values, so the
// ranks still agree, and only what that element lost is forgotten.
//
// The second all-reduce needs the result of the first, and Launch must not
// wait for the network, so the hook issues its collectives from a
// goroutine of its own (started by Setup, stopped by Close), one bucket
// after the other in Launch order, which every rank shares; the Work that
// Launch returns completes once the Qs are reduced. This relies on the
// caller issuing no collective of its own on the communicator while a
// bucket is between Launch and Finish, which the Reducer guarantees. The
// first step also checks, with one all-gather, that every rank has the
// same options, and fails with ErrMismatch naming the first rank that
// differs, rather than reducing buffers of different sizes.
//
// The errors (one float32 per compressed element) and the Qs are kept per
// parameter, in pool memory (the Reducer's, PoolUser), so the Reducer's
// rebuild of the buckets after the first step changes nothing in them:
// unlike PyTorch, StartIter may be 0. The uncompressed tensors and the Ps
// and Qs travel in the bucket's scratch (TensorScratch). The products run
// on the host, in Go (package internal/lowrank: deterministic, so the
// ranks' averages agree bit for bit); the hook refuses device memory, for
// which it has no kernels. Three differences from PyTorch, none of which
// changes the average beyond rounding: 1-D tensors are never compressed
// (PyTorch compresses them as n×1 matrices when MinCompressionRate < 1,
// exactly); no error is kept for uncompressed tensors (PyTorch keeps one,
// whose sum over ranks is zero); and orthonormalization always returns
// orthonormal columns, where a single Gram-Schmidt pass (PyTorch's below
// rank 3) does not for a gradient of lower rank than the approximation.
//
// DefaultPowerSGDOptions, and so ByName("powersgd"), keep PyTorch's
// StartIter of 1000: the first 1000 synced steps (no-sync steps do not
// count) are averaged as Avg averages, and a run of fewer steps never
// compresses. Set StartIter to compress sooner (0: from the first step).
//
// # Accuracy
//
// With u the unit roundoff of the wire type (2^-24 float32, 2^-11 float16,
// 2^-8 bfloat16) and S = sum over ranks of |g_r|/N for one element, the
// value Avg, AllReduce, FP16 and BF16 reduce differs from the exact
// average by at most
//
//	(a + γ(N-1)·(1+a))·S + 2N·η,   a = u + 2·2^-24,  γ(k) = k·u/(1-k·u)
//
// where η is half the wire type's smallest subnormal (2^-25 for float16,
// 2^-134 for bfloat16, 2^-150 for float32): one rounding of g·(1/N) with
// 1/N itself rounded, one conversion to the wire type, and at most N-1
// roundings in the sum whatever order the backend adds in. Avg rounds as
// AllReduce does where the backend pre-multiplies, and in the other order
// (N-1 roundings in the sum, then one in the division by N) where it sums
// first; either way it stays within the same bound. The tests assert these
// on random gradients.
//
// PowerSGD's average has no such bound, elementwise or relative. Its
// steps before StartIter, and in later steps the tensors it does not
// compress, are averaged within the bound above (float32). A compressed
// matrix becomes, up to float32 rounding, P·Pᵀ·A: the orthogonal
// projection of A, the average over ranks of the gradients (plus, with
// error feedback, of the ranks' errors), onto the span of P, the
// orthonormalized sum of the ranks' M·Q (its rank columns, at most
// min(n, m)). So the result's Frobenius norm is at most A's; the result is
// A where A's columns lie in P's span (always at full rank); otherwise an
// element may be far from its exact average, even of the other sign. What
// holds:
//
//   - every rank holds the same bits, in every step;
//   - with error feedback, a rank's error is what the result lacks of its
//     gradient plus its previous error, and is added to its next gradient;
//     the ranks' errors average to what the projection left out of A. Over
//     the steps since compression began, the sum of the results is the sum
//     of the exact averages minus the average of the ranks' current
//     errors, up to rounding: what a step loses is carried into the next,
//     not accumulated. How large the errors stay depends on the gradients;
//     the hook does not bound them.
//
// docs/guide/powersgd.md ("Correctness") gives the error measured against the
// rank, and with and without error feedback.
package hooks
