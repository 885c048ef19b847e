#!/usr/bin/python3
"""torch_manifest: write a PyTorch model's parameter manifest, for ddpbench run --model FILE.json.

    /usr/bin/python3 scripts/torch_manifest.py MODULE:FUNCTION [--name NAME] [--out FILE]

MODULE:FUNCTION names a function (or class) that returns an nn.Module when called with no
arguments: torchvision.models:resnet50, or mymodels:build for a build() in mymodels.py (the
current directory is on the path). No weights are read or written: the manifest lists each
trainable parameter's name and shape, in registration order, as DDP sees them
(model.named_parameters(): a tied parameter once, under its first name; parameters with
requires_grad=False left out). docs/guide/models.md describes the format.

From Python, manifest(model, name) returns the same dict:

    import json, torch_manifest
    json.dump(torch_manifest.manifest(model, "mymodel"), open("mymodel.json", "w"), indent=1)
"""
import argparse
import importlib
import json
import sys

import torch

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}


def manifest(model, name, source=None):
    """The manifest of model's trainable parameters (a dict ready for json.dump)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("%s has no trainable parameters" % name)
    dtypes = {p.dtype for _, p in params}
    if len(dtypes) != 1 or params[0][1].dtype not in DTYPES:
        raise ValueError("%s: a manifest has one floating-point dtype; the parameters have %s" % (
            name, ", ".join(sorted(str(d) for d in dtypes))))
    return {
        "model": name,
        "source": source or "%s named_parameters() (torch %s)" % (type(model).__name__, torch.__version__),
        "dtype": DTYPES[params[0][1].dtype],
        "order": "registration (forward) order",
        "params": [{"name": n, "shape": list(p.shape)} for n, p in params],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("factory", help="MODULE:FUNCTION returning an nn.Module, e.g. torchvision.models:resnet50")
    ap.add_argument("--name", help="the manifest's model name (default: FUNCTION)")
    ap.add_argument("--out", help="the file to write (default: standard output)")
    args = ap.parse_args()
    mod, sep, fn = args.factory.partition(":")
    if not sep or not mod or not fn:
        ap.error("%r: want MODULE:FUNCTION, e.g. torchvision.models:resnet50" % args.factory)
    sys.path.insert(0, "")
    model = getattr(importlib.import_module(mod), fn)()
    m = manifest(model, args.name or fn, source="%s() named_parameters() (torch %s)" % (args.factory, torch.__version__))
    text = json.dumps(m, indent=1) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    n = sum(torch.Size(p["shape"]).numel() for p in m["params"])
    print("torch_manifest: %s: %d parameters, %d elements" % (m["model"], len(m["params"]), n), file=sys.stderr)


if __name__ == "__main__":
    main()
