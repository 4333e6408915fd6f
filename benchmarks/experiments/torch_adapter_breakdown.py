#!/usr/bin/env python3
"""Where a synchronous ``dist.all_reduce`` spends its time on the pycoll group, in layers.

    python -m pycoll.run -n 2 benchmarks/experiments/torch_adapter_breakdown.py \\
        [--bytes 8] [--reps 7]

Rank 0 times four ways of making the same allreduce, each ``--iters`` calls back to back per
repetition (after a barrier), rotating their order, and reports the median per call (us):

* ``direct``: ``pg.comm.allreduce(t)``, pycoll called directly;
* ``adapter``: ``pg.allreduce([t], opts).wait()`` with synchronous options, i.e. what torch's
  C++/Python calls into: ``adapter - direct`` is what pycoll's torch adapter adds;
* ``dist``: ``dist.all_reduce(t)``: ``dist - adapter`` is torch's own Python around it.

Then, without communication, the cost of single steps the adapter takes (warm loops).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

import pycoll.buffers.tensors
import pycoll.torch
from pycoll.torch.work import PycollWork


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--iters", type=int, default=2000, help="calls per repetition (8 B)")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    dist.init_process_group("pycoll")
    pg = dist.group.WORLD
    comm = pg.comm
    t = torch.ones(max(1, args.bytes // 4))
    opts = _c10d.AllreduceOptions()
    opts.asyncOp = False
    clock = time.perf_counter_ns
    cases = {
        "direct": lambda: comm.allreduce(t),
        "adapter": lambda: pg.allreduce([t], opts).wait(),
        "dist": lambda: dist.all_reduce(t),
    }
    iters = max(20, min(args.iters, args.iters * 64 // max(64, args.bytes)))
    res: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for rep in range(args.reps):
        for name in names[rep % 3:] + names[:rep % 3]:
            fn = cases[name]
            fn()
            dist.barrier()
            t0 = clock()
            for _ in range(iters):
                fn()
            res[name].append((clock() - t0) / iters / 1e3)

    def micro(fn, n=20000) -> float:
        got = []
        for _ in range(5):
            t0 = clock()
            for _ in range(n):
                fn()
            got.append((clock() - t0) / n / 1e3)
        return statistics.median(got)

    steps = {
        "AllreduceOptions() (torch)": lambda: _c10d.AllreduceOptions(),
        "opts.reduceOp == SUM": lambda: opts.reduceOp == dist.ReduceOp.SUM,
        "opts.asyncOp": lambda: opts.asyncOp,
        "opts.timeout": lambda: opts.timeout,
        "torch_host_view(t) (pycoll)": lambda: pycoll.buffers.tensors.torch_host_view(t),
        "PycollWork(finished=True)": lambda: PycollWork("allreduce", [t], 0, finished=True),
        "empty lambda": lambda: None,
    }
    if hasattr(pg, "_views"):        # the trees since the synchronous lane
        steps["pg._inline_now()"] = pg._inline_now
        steps["pg._views.get(t)"] = lambda: pg._views.get(t)
        steps["done(op, outputs)"] = lambda: pycoll.torch.work.done("allreduce", [t])
    micro_us = {k: micro(fn) for k, fn in steps.items()}
    if dist.get_rank() == 0:
        med = {k: statistics.median(v) for k, v in res.items()}
        print(f"{args.bytes} B allreduce, {dist.get_world_size()} ranks; per call, medians of "
              f"{args.reps} x {iters} calls (us)")
        print(f"  {'layer':<28}{'median':>9}{'min':>9}{'max':>9}")
        for k, v in res.items():
            print(f"  {k:<28}{med[k]:9.2f}{min(v):9.2f}{max(v):9.2f}")
        print(f"  {'adapter - direct':<28}{med['adapter'] - med['direct']:9.2f}")
        print(f"  {'dist - adapter':<28}{med['dist'] - med['adapter']:9.2f}")
        print("single steps, warm loops (us, each includes a lambda call)")
        for k, v in micro_us.items():
            print(f"  {k:<28}{v:9.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
