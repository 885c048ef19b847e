// Package hooks decides how one bucket of gradients is reduced across
// ranks: PyTorch DDP's communication hooks.
//
// A Hook receives a bucket of float32 gradients (a comm.Buffer over CommPool
// memory) and must leave it holding the average over all ranks. Three hooks
// are built in, and one more for speed:
//
//   - AllReduce: divide by the group size N in float32, then all-reduce with
//     Sum in place (PyTorch's allreduce_hook). No scratch.
//   - Avg: one all-reduce with comm.Avg, so the backend divides inside its
//     reduction pass instead of in a separate pass over the bucket (the
//     rounded sum divided by N; unlike AllReduce the sum may overflow).
//   - FP16: scale by 1/N in float32 and round once to IEEE binary16 into
//     scratch, all-reduce the scratch with Sum in float16, convert the sum
//     back into the bucket (fp16_compress_hook). Half the bytes on the wire.
//   - BF16: the same with bfloat16 (bf16_compress_hook).
//
// # Memory and goroutines
//
// A Hook value belongs to one rank. Setup is told the element count of
// every bucket and takes scratch from the pool once, sized for the largest
// bucket; Reduce reuses it and allocates nothing on the Go heap. The Reducer
// calls Reduce from the rank's communication goroutine, one bucket at a
// time, so the training goroutine never waits for the network.
//
// # Statistics
//
// Reduce records its phases in Bucket.Times as offsets from Bucket.Start:
// compress (scaling and conversion), collective, decompress, the payload
// bytes handed to the collective, and, for FP16 and BF16, Overflows: the
// elements whose reduced value is Inf or NaN although this rank's float32
// gradient was finite. That counts this rank's conversion overflows (a
// value beyond 65504 after scaling becomes ±Inf and makes the sum
// non-finite), overflows of the half-precision sum, and non-finite values
// contributed by other ranks. The common case (no non-finite value) costs
// one word-wise scan of the reduced half-precision buffer. A non-zero
// count means the gradients need scaling down before compression (or
// BF16).
//
// # Accuracy
//
// With u the unit roundoff of the wire type (2^-24 float32, 2^-11 float16,
// 2^-8 bfloat16) and S = sum over ranks of |g_r|/N for one element, the
// reduced value differs from the exact average by at most
//
//	(a + γ(N-1)·(1+a))·S + 2N·η,   a = u + 2·2^-24,  γ(k) = k·u/(1-k·u)
//
// where η is half the wire type's smallest subnormal (2^-25 for float16,
// 2^-134 for bfloat16, 2^-150 for float32): one rounding of g·(1/N) with
// 1/N itself rounded, one conversion to the wire type, and at most N-1
// roundings in the sum whatever order the backend adds in. Avg rounds in
// the other order (N-1 roundings in the sum, then one in the division by
// N) and stays within the same bound; for N a power of two it gives
// AllReduce's bits exactly. The tests assert these on random gradients.
package hooks
