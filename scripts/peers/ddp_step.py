#!/usr/bin/python3
"""ddp_step: PyTorch DDP's step over gloo between 2 processes of this machine, the peer of ddpbench run.

    /usr/bin/python3 scripts/peers/ddp_step.py [--out ddp_step.csv] [--only abcdef]
                     [--model models/manifests/resnet50.json] [--steps 40] [--warmup 4]

Each row starts its processes afresh, through scripts/torch_ddp.py (its docstring has the
model and the timing), talking over TCP on the loopback interface, one compute thread each:

  a  DDP, bucket_cap_mb=25 (PyTorch's default)
  b  DDP, bucket_cap_mb=1
  c  DDP, bucket_cap_mb=100
  d  DDP, bucket_cap_mb=25 with default_hooks.fp16_compress_hook
  e  no DDP: one process, the same module's backward alone
  f  no DDP: one flat gloo all_reduce of a tensor holding every gradient element

The model holds exactly the manifest's parameter tensors (ResNet-50's 161, the manifest
ddpbench's --model resnet50 reads); its backward is almost free and makes the gradients ready
in reverse registration order. A step is the wall time of loss.backward() (for f, of the
all_reduce), the slowest rank's; each row is the median, p10 and p90 over --steps steps after
--warmup. Rows a-d check that every gradient element ends as the average over the ranks.
"""
import argparse
import csv
import json
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
COLUMNS = ["config", "desc", "world", "bucket_cap_mb", "hook", "steps", "median_ms", "p10_ms", "p90_ms", "min_ms"]

# config: (description, processes, torch_ddp.py arguments)
ROWS = {
    "a": ("ddp bucket_cap_mb=25 (default)", 2, ["--bucket-cap-mb", "25"]),
    "b": ("ddp bucket_cap_mb=1", 2, ["--bucket-cap-mb", "1"]),
    "c": ("ddp bucket_cap_mb=100", 2, ["--bucket-cap-mb", "100"]),
    "d": ("ddp bucket_cap_mb=25 + fp16_compress_hook", 2, ["--bucket-cap-mb", "25", "--hook", "fp16"]),
    "e": ("no DDP: one process, backward alone", 1, ["--no-ddp"]),
    "f": ("no DDP: one flat gloo all_reduce of every gradient", 2, ["--flat"]),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_row(config, args):
    """Starts the row's processes, as torchrun would, and returns rank 0's JSON."""
    desc, world, extra = ROWS[config]
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "torch_ddp.py"), "--model", args.model,
           "--steps", str(args.steps), "--warmup", str(args.warmup)] + extra
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL))
    out = procs[0].communicate()[0]
    failed = [r for r, p in enumerate(procs) if p.wait() != 0]
    if failed:
        raise SystemExit("ddp_step: row %s: rank(s) %s failed: %s" % (config, failed, " ".join(cmd)))
    res = json.loads(out.decode().strip().splitlines()[-1])
    return dict(config=config, desc=desc, world=world, bucket_cap_mb=res["bucket_cap_mb"] if res["ddp"] else "",
                hook="" if res["hook"] == "none" else res["hook"], steps=res["steps"], median_ms=res["median_ms"],
                p10_ms=res["p10_ms"], p90_ms=res["p90_ms"], min_ms=res["min_ms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="ddp_step.csv")
    ap.add_argument("--only", default="", help="the rows to run, e.g. af (default: all)")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "manifests", "resnet50.json"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=4)
    args = ap.parse_args()
    configs = sorted(set(args.only or ROWS))
    unknown = [c for c in configs if c not in ROWS]
    if unknown:
        ap.error("--only: no row %s (rows: %s)" % (", ".join(unknown), "".join(ROWS)))
    with open(args.out, "w", newline="") as out:
        w = csv.writer(out, lineterminator="\n")
        w.writerow(COLUMNS)
        for c in configs:
            row = run_row(c, args)
            w.writerow([("%.3f" % row[k]) if isinstance(row[k], float) else row[k] for k in COLUMNS])
            out.flush()
            print("%s  %-52s median %8.2f ms  p10 %8.2f  p90 %8.2f" % (c, row["desc"], row["median_ms"], row["p10_ms"],
                                                                        row["p90_ms"]), flush=True)


if __name__ == "__main__":
    main()
