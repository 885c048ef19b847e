#!/usr/bin/python3
"""gloo_allreduce: PyTorch's gloo all_reduce (SUM) between processes of this machine.

    /usr/bin/python3 scripts/peers/gloo_allreduce.py [--out gloo_allreduce.csv] [--budget 1.0]
                     [--dtypes float32,float16] [--world 2]

The processes talk over TCP on the loopback interface (GLOO_SOCKET_IFNAME=lo), one
compute thread each (torch.set_num_threads(1)); gloo adds its own I/O threads.

Timed as scripts/peers/mpi_allreduce.c times Open MPI: tensor sizes 4 KiB to 256 MiB in
steps of 4 (bytes, whatever the dtype); the result is checked first (rank r contributes
r+1; every element must be n(n+1)/2), the tensor is then zeroed so that repeated sums stay
finite; warmup calls, then 3 calls whose slowest rank sets the number of timed calls
(--budget seconds' worth, 5 to 2000); every call is timed on its own, its time is the
slowest rank's, and the median and minimum over the calls are reported.
algbw = bytes / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes. torch.distributed's
all_reduce is in place only, so every row is.
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [4096 << (2 * k) for k in range(9)]  # 4 KiB .. 256 MiB
COLUMNS = ["impl", "label", "dtype", "mode", "world", "bytes", "count", "iters", "median_us", "min_us",
           "algbw_GBps", "busbw_GBps"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slowest(value):
    """The maximum of value over the ranks (a collective)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def measure(rank, world, dtype, nbytes, budget):
    """One row for rank 0 (None elsewhere), or None on every rank if gloo lacks dtype."""
    count = nbytes // torch.tensor([], dtype=dtype).element_size()
    t = torch.full((count,), float(rank + 1), dtype=dtype)
    try:
        dist.all_reduce(t)
    except RuntimeError as e:  # every rank fails alike
        if rank == 0:
            print("# %s: gloo has no all_reduce for it (%s)" % (dtype, str(e).splitlines()[0]), flush=True)
        return "unsupported"
    want = world * (world + 1) / 2
    if not bool((t == want).all()):
        raise SystemExit("gloo_allreduce: rank %d, %s, %d bytes: wrong sum" % (rank, dtype, nbytes))
    t.zero_()
    for _ in range(2 if nbytes >= 64 << 20 else 10):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(t)
    est = slowest((time.perf_counter() - start) / 3)
    iters = min(2000, max(5, int(budget / est) if est > 0 else 2000))
    times = torch.empty(iters, dtype=torch.float64)
    dist.barrier()
    for i in range(iters):
        a = time.perf_counter()
        dist.all_reduce(t)
        times[i] = time.perf_counter() - a
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # each call's slowest rank
    if rank != 0:
        return None
    ts = times.tolist()
    med = statistics.median(ts)
    algbw = nbytes / med / 1e9
    return dict(impl="gloo", dtype=str(dtype).replace("torch.", ""), mode="inplace", world=world, bytes=nbytes,
                count=count, iters=iters, median_us=med * 1e6, min_us=min(ts) * 1e6, algbw_GBps=algbw,
                busbw_GBps=algbw * 2 * (world - 1) / world)


def rank_main(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = None
    if rank == 0:
        out = open(args.out, "w")
        out.write(",".join(COLUMNS) + "\n")
        print("# torch %s, gloo, %d processes, %.2f s of timed calls per size" % (torch.__version__, world, args.budget))
        print("%-8s %10s %10s %6s %11s %11s %10s %10s" % ("dtype", "bytes", "count", "iters", "median_us", "min_us",
                                                          "algbw_GB/s", "busbw_GB/s"), flush=True)
    for name in args.dtypes.split(","):
        for nbytes in SIZES:
            row = measure(rank, world, getattr(torch, name), nbytes, args.budget)
            if row == "unsupported":
                break
            if row is not None:
                row["label"] = args.label
                out.write(",".join(("%.4f" % row[c]) if isinstance(row[c], float) else str(row[c]) for c in COLUMNS) + "\n")
                out.flush()
                print("%-8s %10d %10d %6d %11.2f %11.2f %10.3f %10.3f" % (
                    row["dtype"], nbytes, row["count"], row["iters"], row["median_us"], row["min_us"],
                    row["algbw_GBps"], row["busbw_GBps"]), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if out:
        out.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gloo_allreduce.csv")
    ap.add_argument("--budget", type=float, default=1.0, help="timed seconds per size")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--label", default="default")
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    mp.start_processes(rank_main, args=(args.world, free_port(), args), nprocs=args.world, start_method="spawn")


if __name__ == "__main__":
    main()
