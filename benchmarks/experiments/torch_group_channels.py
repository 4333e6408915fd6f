"""Channels, sockets and shared-memory segments per rank before and after torch groups.

    python -m pycoll.run -n 4 benchmarks/experiments/torch_group_channels.py [--mib 4]

The default group first opens a channel to every peer (an all_to_all); then ``new_group()``,
``new_subgroups(2)`` and ``init_device_mesh("cpu", (2, 2))`` each run one all_reduce of
``--mib`` MiB. Each rank prints one JSON line: the counts before and after (the counting is
the torch tests' own, ``tests/torch_backend/mesh_checks.counts``). Set PYCOLL_TRANSPORTS to
compare transports; run it with PYTHONPATH at an older checkout to compare versions.
"""
from __future__ import annotations

import argparse
import json
from datetime import timedelta

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401  (registers "pycoll")
from pycoll.testing import held_counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=4.0)
    args = parser.parse_args()
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("pycoll", timeout=timedelta(seconds=120))
    size = dist.get_world_size()
    dist.all_to_all_single(torch.zeros(size * 4), torch.ones(size * 4))
    before = held_counts(dist.group.WORLD.comm)
    n = int(args.mib * (1 << 20) / 4)
    groups = [dist.new_group(), dist.new_subgroups(2)[0]]
    mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("dp", "tp"))
    groups += [mesh["dp"].get_group(), mesh["tp"].get_group()]
    for group in groups:
        dist.all_reduce(torch.ones(n), group=group)
    after = held_counts(dist.group.WORLD.comm)
    print(json.dumps({"rank": dist.get_rank(), "groups": len(groups), "before": before,
                      "after": after}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
