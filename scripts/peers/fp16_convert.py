#!/usr/bin/python3
"""fp16_convert: numpy's float32 <-> float16 conversion, one thread, the peer of package fp16.

    /usr/bin/python3 scripts/peers/fp16_convert.py [--out fp16_convert.csv] [--reps 15] [--torch]

The float32 side is 64 MiB (16 Mi elements of randn * 0.1: normal, finite values) and every
rate is that side's bytes per second, GB = 1e9 bytes, whichever the direction, as
`go test -bench Float32ToHalf ./fp16/` reports it. "astype" allocates its result (the page
faults of a fresh buffer included), "copyto" writes into a buffer allocated once. One more
float32 -> float16 row converts uniformly random bit patterns (subnormals, overflows, NaNs).
Each figure is the median (and best) of --reps runs after 2 warmup runs. --torch adds
PyTorch's conversions (Tensor.half(), Tensor.float(), copy_) for reference, on one thread.
"""
import argparse
import statistics
import time

import numpy as np

ELEMENTS = 16 << 20
COLUMNS = ["lib", "op", "elements", "f32_bytes", "median_ms", "best_ms", "GBps_median", "GBps_best"]


def timed(fn, reps):
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        a = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - a)
    return statistics.median(ts), min(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fp16_convert.csv")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--torch", action="store_true", help="add PyTorch's conversions")
    args = ap.parse_args()

    rng = np.random.default_rng(1)
    f32 = rng.standard_normal(ELEMENTS, dtype=np.float32) * np.float32(0.1)
    f16 = f32.astype(np.float16)
    bits = rng.integers(0, 1 << 32, ELEMENTS, dtype=np.uint32).view(np.float32)
    into16 = np.empty(ELEMENTS, np.float16)
    into32 = np.empty(ELEMENTS, np.float32)
    side = ELEMENTS * 4

    cases = [
        ("numpy", "f32->f16 alloc (astype)", lambda: f32.astype(np.float16)),
        ("numpy", "f32->f16 conv (copyto)", lambda: np.copyto(into16, f32, casting="unsafe")),
        ("numpy", "f16->f32 alloc (astype)", lambda: f16.astype(np.float32)),
        ("numpy", "f16->f32 conv (copyto)", lambda: np.copyto(into32, f16, casting="unsafe")),
        ("numpy", "f32->f16 conv, random bit patterns", lambda: np.copyto(into16, bits, casting="unsafe")),
    ]
    if args.torch:
        import torch
        torch.set_num_threads(1)
        t32, t16, tbits = torch.from_numpy(f32), torch.from_numpy(f16), torch.from_numpy(bits)
        o16, o32 = torch.empty(ELEMENTS, dtype=torch.float16), torch.empty(ELEMENTS, dtype=torch.float32)
        cases += [
            ("torch", "f32->f16 alloc (.half())", lambda: t32.half()),
            ("torch", "f32->f16 conv (copy_)", lambda: o16.copy_(t32)),
            ("torch", "f16->f32 alloc (.float())", lambda: t16.float()),
            ("torch", "f16->f32 conv (copy_)", lambda: o32.copy_(t16)),
            ("torch", "f32->f16 conv, random bit patterns", lambda: o16.copy_(tbits)),
        ]

    print("# numpy %s, %d MiB of float32, GB/s of the float32 side, median (best) of %d" % (
        np.__version__, side >> 20, args.reps))
    with open(args.out, "w") as out, np.errstate(all="ignore"):
        out.write(",".join(COLUMNS) + "\n")
        for lib, op, fn in cases:
            med, best = timed(fn, args.reps)
            row = dict(lib=lib, op=op, elements=ELEMENTS, f32_bytes=side, median_ms=med * 1e3, best_ms=best * 1e3,
                       GBps_median=side / med / 1e9, GBps_best=side / best / 1e9)
            out.write(",".join(("%.4f" % row[c]) if isinstance(row[c], float) else str(row[c]) for c in COLUMNS) + "\n")
            print("%-6s %-36s %9.2f ms %8.3f GB/s (%.3f)" % (lib, op, med * 1e3, row["GBps_median"], row["GBps_best"]),
                  flush=True)


if __name__ == "__main__":
    main()
