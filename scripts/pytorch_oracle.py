#!/usr/bin/python3
"""pytorch_oracle: what PyTorch's DDP reducer does with the built-in models, for ddpgo's tests.

    /usr/bin/python3 scripts/pytorch_oracle.py > testdata/pytorch/ddp_buckets.json

For each built-in manifest (models/manifests) and each configuration below, one process (gloo,
world size 1) wraps a module holding exactly the manifest's parameters in DDP, runs three
iterations whose backward makes every gradient ready in reverse registration order, and records
what DDP's logging data says: the bucket sizes before the first iteration, and the buckets it
rebuilt from the observed ready order (sizes and each bucket's parameter indices). ddpgo's
package bucket (Assign, Rebuild) and its Reducer are tested against this file.

  default        bucket_cap_mb=25 (first bucket 1 MiB, PyTorch's defaults)
  cap1, cap100   bucket_cap_mb=1, 100
  find_unused    find_unused_parameters=True: its initial buckets follow the caps from the start
"""
import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_ddp import ShapeModel  # the module of scripts/torch_ddp.py: the manifest's parameters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["resnet50", "bert-base", "gpt2-small"]
CONFIGS = {"default": dict(), "cap1": dict(bucket_cap_mb=1), "cap100": dict(bucket_cap_mb=100),
           "find_unused": dict(find_unused_parameters=True)}


def ints(s):
    return [int(v) for v in str(s).replace(",", " ").split()]


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    out = dict(source="scripts/pytorch_oracle.py: torch %s DistributedDataParallel logging data, gloo, world size 1"
               % torch.__version__, models={})
    for name in MODELS:
        with open(os.path.join(ROOT, "models", "manifests", name + ".json")) as f:
            shapes = [tuple(p["shape"]) for p in json.load(f)["params"]]
        cases = {}
        for key, kw in CONFIGS.items():
            ddp = DDP(ShapeModel(shapes), broadcast_buffers=False, **kw)
            before = ddp._get_ddp_logging_data()
            x = torch.tensor(1.0)
            for _ in range(3):
                ddp.zero_grad(set_to_none=True)
                ddp(x).backward()
            after = ddp._get_ddp_logging_data()
            case = dict(ddp_args=kw, initial_bucket_sizes=ints(before["bucket_sizes"]),
                        ready_order=ints(after.get("prev_iteration_grad_ready_order_indices", "")),
                        rebuilt=bool(int(after.get("has_rebuilt_buckets", 0))))
            if case["rebuilt"]:
                case["rebuilt_bucket_sizes"] = ints(after["rebuilt_bucket_sizes"])
                case["rebuilt_bucket_params"] = [ints(b) for b in after["rebuilt_per_bucket_param_indices"].split(",")]
            cases[key] = case
            del ddp
        out["models"][name] = cases
    dist.destroy_process_group()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
