#!/usr/bin/env python3
"""A DDP training step on CUDA: backend "pycoll" against Gloo on the same CUDA tensors.

    python -m pycoll.run -n 2 benchmarks/ddp_cuda.py [--steps 20] [--width 4096] [--depth 6]

Every rank uses GPU ``local_rank % device_count`` (ranks may share one GPU). The same model
(same seed) is trained for ``--steps`` steps with DDP over the pycoll group and, from the
same initial parameters and the same batches, over a Gloo group of the same ranks. Printed
by rank 0: the median step time of each, and the largest parameter difference between the
two after the last step (the gradients are averaged in different orders, so equality is up
to float rounding). Exits non-zero if the parameters differ by more than ``--rtol``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import pycoll.torch  # noqa: F401  (registers the "pycoll" backend)


def train(group, device, args) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device], process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(1000 + dist.get_rank())
    times = []
    for step in range(args.steps + 2):
        x = torch.randn(args.batch, args.width, generator=gen).to(device)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ddp(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize(device)
        if step >= 2:                      # the first steps build buckets and caches
            times.append(time.perf_counter() - start)
    return times, [p.detach().clone() for p in model.parameters()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("ddp_cuda: no CUDA device is visible", file=sys.stderr)
        return 2
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    device = local % torch.cuda.device_count()
    torch.cuda.set_device(device)
    dist.init_process_group("pycoll")
    gloo = dist.new_group(backend="gloo")
    result: dict = {"world": dist.get_world_size(), "gpu": torch.cuda.get_device_name(device),
                    "params": None}
    pyc_times, pyc_params = train(dist.group.WORLD, device, args)
    gloo_times, gloo_params = train(gloo, device, args)
    worst = max(float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())
                for a, b in zip(pyc_params, gloo_params))
    result.update(pycoll_step_ms=1e3 * statistics.median(pyc_times),
                  gloo_step_ms=1e3 * statistics.median(gloo_times),
                  max_rel_param_diff=worst,
                  params=sum(p.numel() for p in pyc_params))
    result["speedup_vs_gloo"] = result["gloo_step_ms"] / result["pycoll_step_ms"]
    if dist.get_rank() == 0:
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if worst <= args.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
