#!/usr/bin/python3
"""PyTorch DDP (CPU, gloo) step time for a model's parameter shapes, one process per rank.

The peer of `ddpbench run` across processes and hosts. Each rank is started separately, as
torchrun or mpirun would start it (scripts/netlab.sh starts one per test host):

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=198.18.0.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=eth0 \\
        /usr/bin/python3 scripts/torch_ddp.py --model models/manifests/resnet50.json [--hook fp16] [--compute-ms 80]

Model: a module holding exactly the manifest's parameter tensors (float32, registration order);
forward(x) = sum_i (p_i * x).sum(), so backward is almost free and makes the gradients ready in
reverse registration order. With --compute-ms T, backward is simulated as ddpbench's
`--compute sleep --compute-time T` does: before each parameter's gradient is handed to DDP, the
rank sleeps T * (its share of the parameters' elements), so gradients arrive spread over T.

Timed per step: the wall time of loss.backward() (under DDP it includes every bucket's all_reduce
and the final wait), max over ranks; printed as median / p10 / p90 over --steps steps after
--warmup steps (DDP rebuilds its buckets after the first iteration). --no-ddp times the bare
module's backward instead, without DDP (what backward costs by itself). --hook fp16 or bf16 registers
torch's default fp16_compress_hook / bf16_compress_hook; --hook powersgd registers powerSGD_hook with
a PowerSGDState of --powersgd-rank (matrix_approximation_rank), --powersgd-start-iter
(start_powerSGD_iter; torch refuses less than 2 with error feedback or warm start, which are on) and
--powersgd-min-compression-rate; --warmup must then pass the start, so that every timed step
compresses, the first (which allocates the state) excepted. --flat times one all_reduce of all the
gradients' elements in one tensor instead (the communication alone).

With --count-iface IFACE (eth0 on scripts/netlab.sh's hosts), each rank reads IFACE's tx_bytes
counter before and after the timed steps; the JSON's tx_bytes_per_step is their mean over ranks, per
timed step: the bytes that crossed the link, warmup (and PowerSGD's uncompressed first steps) apart.

Output: one line of JSON on rank 0 (and a table line on stderr).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class ShapeModel(nn.Module):
    def __init__(self, shapes, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.params = nn.ParameterList([nn.Parameter(torch.randn(s, generator=g) * 0.01) for s in shapes])

    def forward(self, x):
        loss = None
        for p in self.params:
            s = (p * x).sum()
            loss = s if loss is None else loss + s
        return loss


def quantiles(ts):
    ts = sorted(ts)
    n = len(ts)
    return dict(median_ms=statistics.median(ts) * 1e3, p10_ms=ts[int(0.1 * (n - 1))] * 1e3,
                p90_ms=ts[int(0.9 * (n - 1))] * 1e3, min_ms=ts[0] * 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a parameter manifest (JSON: params[].shape)")
    ap.add_argument("--hook", choices=["none", "fp16", "bf16", "powersgd"], default="none")
    ap.add_argument("--powersgd-rank", type=int, default=1, help="--hook powersgd: matrix_approximation_rank")
    ap.add_argument("--powersgd-start-iter", type=int, default=2, help="--hook powersgd: start_powerSGD_iter (at least 2)")
    ap.add_argument("--powersgd-min-compression-rate", type=float, default=2, help="--hook powersgd: min_compression_rate")
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--compute-ms", type=float, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--flat", action="store_true", help="time one all_reduce of every element instead")
    ap.add_argument("--no-ddp", action="store_true", help="time the bare module's backward, without DDP")
    ap.add_argument("--count-iface", default="", help="report the bytes IFACE sent per timed step")
    args = ap.parse_args()
    if args.warmup < 2:
        sys.exit("torch_ddp.py: --warmup must be at least 2 (DDP rebuilds its buckets after iteration 1)")
    if args.no_ddp and (args.hook != "none" or args.flat):
        sys.exit("torch_ddp.py: --no-ddp times the module alone: no --hook, no --flat")
    if args.hook == "powersgd" and args.warmup <= args.powersgd_start_iter:
        sys.exit("torch_ddp.py: --warmup must pass --powersgd-start-iter, so that the timed steps compress "
                 "(the first compressed step allocates the hook's state)")

    with open(args.model) as f:
        manifest = json.load(f)
    shapes = [tuple(p["shape"]) for p in manifest["params"]]
    numel = sum(int(torch.Size(s).numel()) for s in shapes)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def tx_bytes():
        if not args.count_iface:
            return 0
        with open("/sys/class/net/%s/statistics/tx_bytes" % args.count_iface) as f:
            return int(f.read())

    times = []
    tx0 = None
    if args.flat:
        t = torch.ones(numel)
        for i in range(args.warmup + args.steps):
            dist.barrier()
            a = time.perf_counter()
            dist.all_reduce(t)
            if i >= args.warmup:
                times.append(time.perf_counter() - a)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = ShapeModel(shapes)
        if args.compute_ms > 0:
            for p in model.params:
                delay = args.compute_ms / 1e3 * p.numel() / numel
                p.register_hook(lambda g, d=delay: (time.sleep(d), g)[1])
        ddp = model if args.no_ddp else DDP(model, bucket_cap_mb=args.bucket_cap_mb, broadcast_buffers=False)
        if args.hook == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
            state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                           start_powerSGD_iter=args.powersgd_start_iter,
                                           min_compression_rate=args.powersgd_min_compression_rate)
            ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
        elif args.hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook if args.hook == "fp16" else default_hooks.bf16_compress_hook)
        x = torch.tensor(1.0)
        for i in range(args.warmup + args.steps):
            ddp.zero_grad(set_to_none=True)
            loss = ddp(x)
            dist.barrier()
            if i == args.warmup:
                tx0 = tx_bytes()
            a = time.perf_counter()
            loss.backward()
            if i >= args.warmup:
                times.append(time.perf_counter() - a)
        # d loss / d p = x = 1 everywhere, on every rank, so the average is
        # 1 too, exactly, in fp16 and bf16 as well (PowerSGD approximates).
        if args.hook != "powersgd":
            bad = sum(int((p.grad != 1).sum()) for p in model.params)
            if bad:
                sys.exit("torch_ddp.py: rank %d: %d gradient elements are not the average, 1" % (rank, bad))

    dist.barrier()
    sent = torch.tensor([float(tx_bytes() - tx0) if tx0 is not None else 0.0], dtype=torch.float64)
    dist.all_reduce(sent)

    # The step time is the slowest rank's.
    mine = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if rank == 0:
        q = quantiles(mine.tolist())
        out = dict(peer="pytorch-ddp-gloo", torch=torch.__version__, model=manifest.get("model", args.model),
                   world=world, hook=args.hook, bucket_cap_mb=args.bucket_cap_mb, compute_ms=args.compute_ms,
                   flat=args.flat, ddp=not (args.flat or args.no_ddp), params=len(shapes), numel=numel, steps=args.steps, **q)
        if args.count_iface:
            out["tx_bytes_per_step"] = sent.item() / world / args.steps
        if args.hook == "powersgd":
            before, after = state.total_numel_before_compression, state.total_numel_after_compression
            out.update(powersgd_rank=args.powersgd_rank, powersgd_start_iter=args.powersgd_start_iter,
                       powersgd_min_compression_rate=args.powersgd_min_compression_rate,
                       compression_rate=before / after if after else 0)
        print(json.dumps(out))
        print("torch_ddp: %s world %d hook %s%s: step median %.2f ms (p10 %.2f, p90 %.2f)" %
              (out["model"], world, args.hook, " flat all_reduce" if args.flat else "", q["median_ms"], q["p10_ms"], q["p90_ms"]),
              file=sys.stderr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
