#!/usr/bin/env python3
"""The "pycoll" torch backend measured against Gloo and against pycoll called directly.

    python -m pycoll.run -n 2 benchmarks/torch_backend.py [--reps 15] [--rounds 4] [--json out.json]

Two parts, in one run (one set of processes), interleaved so that the noise of this shared
machine hits every variant alike; every number is a median (the machine is noisy):

1. DDP step time of examples/ddp_train.py's model on the pycoll group and on a Gloo group
   over the same ranks, and the same DDP step with a communication hook that returns every
   bucket as it is (``ddp_train.train(sync=False)``: bucketing and copies, no allreduce;
   the step no backend can beat, so gloo/no_allreduce is the most any backend could gain
   over Gloo on this model and machine), rotating the order every round.
2. Per-op bus bandwidth (nccl-tests definitions) at 1..64 MiB of three variants, rotating
   their order every repetition: ``torch`` = ``torch.distributed`` on the pycoll process group;
   ``direct`` = the same pycoll communicator called directly (``pg.comm``), i.e. what the
   torch layer costs; ``gloo`` = ``torch.distributed`` on Gloo. Each timed repetition is a
   barrier, then the op back to back for about ``--op-budget`` seconds (OSU style: a single
   op of 1 MiB takes ~0.1 ms, within the noise of who leaves the barrier first); rank 0's
   mean time per op is reported.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("ddp_train", ROOT / "examples" / "ddp_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def ddp_part(args, pyc, gloo) -> dict:
    ex = load_example()
    times: dict[str, list[float]] = {"pycoll": [], "gloo": [], "no_allreduce": []}
    sums: dict[str, float] = {}
    variants = [("pycoll", pyc), ("gloo", gloo), ("no_allreduce", pyc)]
    for rnd in range(args.rounds):
        order = variants[rnd % 3:] + variants[:rnd % 3]     # rotated: each goes first
        for name, group in order:
            t, checksum = ex.train(group, steps=args.steps, warmup=3, width=args.width,
                                   depth=args.depth, batch=args.batch, bucket_cap_mb=25.0,
                                   sync=name != "no_allreduce")
            times[name] += t
            sums[name] = checksum
    return {name: {"median_ms": statistics.median(t) * 1e3,
                   "p10_ms": statistics.quantiles(t, n=10)[0] * 1e3,
                   "p90_ms": statistics.quantiles(t, n=10)[-1] * 1e3,
                   "steps": len(t), "checksum": sums[name]} for name, t in times.items()}


def busbw_factor(op: str, n: int) -> float:
    return {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n, "alltoall": (n - 1) / n, "broadcast": 1.0}[op]


def make_ops(op: str, nbytes: int, world: int, pyc, gloo):
    """Return {variant: callable} running one ``op`` of ``nbytes`` (the busbw "size")."""
    count = nbytes // 4
    comm = pyc.comm
    if op == "allreduce":
        t = torch.ones(count)
        return {"torch": lambda: dist.all_reduce(t, group=pyc),
                "direct": lambda: comm.allreduce(t),
                "gloo": lambda: dist.all_reduce(t, group=gloo)}
    if op == "broadcast":
        t = torch.ones(count)
        return {"torch": lambda: dist.broadcast(t, 0, group=pyc),
                "direct": lambda: comm.broadcast(t, 0),
                "gloo": lambda: dist.broadcast(t, 0, group=gloo)}
    if op == "allgather":     # size = the gathered output
        out, inp = torch.empty(count), torch.ones(count // world)
        return {"torch": lambda: dist.all_gather_single(out, inp, group=pyc),
                "direct": lambda: comm.allgather(out, inp),
                "gloo": lambda: dist.all_gather_single(out, inp, group=gloo)}
    if op == "reduce_scatter":  # size = the input
        out, inp = torch.empty(count // world), torch.ones(count)
        return {"torch": lambda: dist.reduce_scatter_single(out, inp, group=pyc),
                "direct": lambda: comm.reduce_scatter(out, inp),
                "gloo": lambda: dist.reduce_scatter_single(out, inp, group=gloo)}
    if op == "alltoall":
        out, inp = torch.empty(count), torch.ones(count)
        return {"torch": lambda: dist.all_to_all_single(out, inp, group=pyc),
                "direct": lambda: comm.alltoall(out, inp),
                "gloo": lambda: dist.all_to_all_single(out, inp, group=gloo)}
    raise ValueError(op)


def op_part(args, pyc, gloo) -> list[dict]:
    world = dist.get_world_size()
    rows = []
    for op in args.ops:
        for mib in args.sizes:
            nbytes = mib << 20
            fns = make_ops(op, nbytes, world, pyc, gloo)
            names = list(fns)
            times: dict[str, list[float]] = {n: [] for n in names}
            iters: dict[str, int] = {}
            for rep in range(args.reps + 1):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    n_ops = iters.get(name, 3)
                    if not rep:       # a first call pays one-time setup: keep it out of the
                        fns[name]()   # sizing, or the loops come out a few ops long and the
                    dist.barrier(group=pyc)   # barrier's exit skew dominates them
                    t0 = time.perf_counter()
                    for _ in range(n_ops):
                        fns[name]()
                    dt = (time.perf_counter() - t0) / n_ops
                    if rep:            # repetition 0 is warm-up (and sizes the loops)
                        times[name].append(dt)
                    else:   # OSU-style: back-to-back ops for about --op-budget seconds, the
                        # same count on every rank (rank 0 decides), so one late start or a
                        # scheduler tick does not decide a point
                        want = torch.tensor([max(1, min(50, int(args.op_budget / dt)))])
                        dist.broadcast(want, 0, group=pyc)
                        iters[name] = int(want.item())
            f = busbw_factor(op, world)
            row = {"op": op, "MiB": mib}
            for name in names:
                med = statistics.median(times[name])
                row[f"{name}_ms"] = med * 1e3
                row[f"{name}_busbw_GBps"] = f * nbytes / med / 1e9
            row["torch_vs_direct"] = row["torch_busbw_GBps"] / row["direct_busbw_GBps"]
            row["pycoll_vs_gloo"] = row["torch_busbw_GBps"] / row["gloo_busbw_GBps"]
            rows.append(row)
            if dist.get_rank() == 0:
                print(f"  {op:<15}{mib:>4} MiB  torch {row['torch_busbw_GBps']:6.2f}  direct "
                      f"{row['direct_busbw_GBps']:6.2f}  ratio {row['torch_vs_direct']:5.2f}  "
                      f"gloo {row['gloo_busbw_GBps']:6.2f} GB/s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions per op and size")
    ap.add_argument("--rounds", type=int, default=6, help="DDP rounds per variant")
    ap.add_argument("--steps", type=int, default=10, help="timed DDP steps per round")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 4, 16, 64],
                    help="MiB, comma separated (default 1,4,16,64)")
    ap.add_argument("--ops", type=lambda s: s.split(","),
                    default=["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"])
    ap.add_argument("--skip-ddp", action="store_true")
    ap.add_argument("--op-budget", type=float, default=0.02,
                    help="seconds of back-to-back ops per timed repetition (OSU style)")
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    dist.init_process_group("pycoll")
    gloo = dist.new_group(backend="gloo")
    pyc = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {"world": world, "cpus": os.cpu_count(), "torch": torch.__version__,
                    "transport": pyc.comm.transport_summary()}
    if rank == 0:
        print(f"pycoll torch backend bench: {world} ranks, {os.cpu_count()} CPUs, transport "
              f"{result['transport']}; medians (this machine is shared and noisy)", flush=True)
    if not args.skip_ddp:
        ddp = ddp_part(args, pyc, gloo)
        result["ddp"] = ddp
        if rank == 0:
            p, g = ddp["pycoll"], ddp["gloo"]
            print(f"DDP step time (median of {p['steps']} steps, {args.rounds} alternating "
                  f"rounds): pycoll {p['median_ms']:.1f} ms (p10 {p['p10_ms']:.1f}, p90 "
                  f"{p['p90_ms']:.1f}), gloo {g['median_ms']:.1f} ms (p10 {g['p10_ms']:.1f}, "
                  f"p90 {g['p90_ms']:.1f}); gloo/pycoll = {g['median_ms'] / p['median_ms']:.2f}x;"
                  f" checksums equal: {p['checksum'] == g['checksum']}", flush=True)
            c = ddp["no_allreduce"]
            print("DDP step without the gradient allreduce (a hook that returns each bucket as it "
                  "is, same processes and "
                  f"rounds): {c['median_ms']:.1f} ms (p10 {c['p10_ms']:.1f}, p90 "
                  f"{c['p90_ms']:.1f}); the ceiling of any backend, gloo/no_allreduce = "
                  f"{g['median_ms'] / c['median_ms']:.2f}x; pycoll removes "
                  f"{(g['median_ms'] - p['median_ms']) / (g['median_ms'] - c['median_ms']):.0%}"
                  " of what Gloo's allreduce adds to the step", flush=True)
    if rank == 0:
        print(f"busbw (GB/s, median of {args.reps}): torch = dist.* on pycoll, direct = pycoll "
              "Communicator, gloo = dist.* on Gloo", flush=True)
    result["ops"] = op_part(args, pyc, gloo)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
