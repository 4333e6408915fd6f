#!/usr/bin/env python3
"""Where the torch layer's per-call time goes: ``dist.*`` on the pycoll group against the
same pycoll communicator called directly, and the part spent outside pycoll's own call.

    python -m pycoll.run -n 2 benchmarks/experiments/torch_overhead.py \\
        [--mib 1] [--iters 100] [--reps 5]

For each collective it times, on rank 0, ``--iters`` back-to-back calls per repetition
(after a barrier), alternating the two variants, and reports medians over repetitions:
``direct`` (the Communicator), ``torch`` (``torch.distributed``), and ``inside``, the
Communicator call as seen from within the torch call (it is wrapped with a timer), so
``torch - inside`` is what torch's dispatch and pycoll's torch adapter add. After a
collective of a MiB or more the CPU caches hold its data, not the interpreter's, so that
fixed cost is larger than the same Python measured in a warm loop.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, default=1.0, help="size of the operation (MiB)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("pycoll")
    comm = dist.group.WORLD.comm
    world = dist.get_world_size()
    count = int(args.mib * (1 << 20)) // 4 // world * world
    t, out, inp = torch.ones(count), torch.empty(count), torch.ones(count)
    part, shard = inp[:count // world], torch.empty(count // world)
    cases = {
        "allreduce": (lambda: dist.all_reduce(t), lambda: comm.allreduce(t)),
        "broadcast": (lambda: dist.broadcast(t, 0), lambda: comm.broadcast(t, 0)),
        "allgather": (lambda: dist.all_gather_single(out, part), lambda: comm.allgather(out, part)),
        "reduce_scatter": (lambda: dist.reduce_scatter_single(shard, inp),
                           lambda: comm.reduce_scatter(shard, inp)),
        "alltoall": (lambda: dist.all_to_all_single(out, inp), lambda: comm.alltoall(out, inp)),
    }
    clock = time.perf_counter_ns
    if dist.get_rank() == 0:
        print(f"{world} ranks, {args.mib:g} MiB float32; per call, medians of {args.reps} x "
              f"{args.iters} calls (us)")
        print(f"  {'collective':<15}{'direct':>9}{'torch':>9}{'inside':>9}{'added':>9}{'ratio':>8}")
    for name, (through_torch, direct) in cases.items():
        real = getattr(comm, name)
        inside: list[int] = []

        def timed(*a, _real=real, _inside=inside, **k):
            t0 = clock()
            try:
                return _real(*a, **k)
            finally:
                _inside.append(clock() - t0)

        res: dict[str, list[float]] = {"direct": [], "torch": [], "inside": []}
        for _ in range(args.reps):
            for variant, fn in (("torch", through_torch), ("direct", direct)):
                setattr(comm, name, timed if variant == "torch" else real)
                inside.clear()
                fn()
                dist.barrier()
                t0 = clock()
                for _ in range(args.iters):
                    fn()
                res[variant].append((clock() - t0) / args.iters / 1e3)
                if variant == "torch":
                    res["inside"].append(sum(inside[1:]) / len(inside[1:]) / 1e3)
        setattr(comm, name, real)
        if dist.get_rank() == 0:
            d, tt, ins = (statistics.median(res[k]) for k in ("direct", "torch", "inside"))
            print(f"  {name:<15}{d:9.1f}{tt:9.1f}{ins:9.1f}{tt - ins:9.1f}{d / tt:8.2f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
