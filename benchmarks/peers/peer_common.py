"""Shared command line and JSON-lines output of the peer runners (Gloo, MPI).

Each runner adapts one library to pycoll.bench's runner protocol and calls the same timing
loop as ``python -m pycoll.bench`` (pycoll/bench/runner.py), so all libraries are measured
the same way.  Rank 0 prints one JSON object per line:

    {"meta": {...}}                               once, first
    {"library": "gloo", "collective": ..., "size": ..., "avg_us": ..., "busbw_GBps": ...}
    {"error": "...", "library": ..., "collective": ...}   a collective that cannot run

The one-sided tests (put, put_bw, put_bibw, get, get_bw, accumulate) take a backend with the
window methods of the runner's protocol (the MPI runner: ``MPI.Win``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import traceback

from pycoll.bench import collectives as C
from pycoll.bench.options import OPS, message_sizes, normalize_dtype, parse_message_range
from pycoll.bench.runner import BenchError, run_sweep


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="peer benchmark runner (JSON lines)")
    p.add_argument("--collectives", default="allreduce",
                   help="comma-separated list (allreduce,broadcast,...)")
    p.add_argument("-m", "--sizes", default="8:1M", help="[MIN:]MAX, e.g. 8:16M")
    p.add_argument("-T", "--dtype", default="float32")
    p.add_argument("-o", "--op", default="sum", choices=OPS)
    p.add_argument("-i", "--iterations", type=int, default=None)
    p.add_argument("-x", "--warmup", type=int, default=None)
    p.add_argument("--time-budget", type=float, default=None)
    p.add_argument("--min-iterations", type=int, default=5)
    p.add_argument("--timing", default="osu", choices=("osu", "nccl"))
    p.add_argument("-k", "--root", type=int, default=0)
    p.add_argument("-c", "--validation", action="store_true")
    p.add_argument("-W", "--window-size", dest="window", type=int, default=64,
                   help="operations per round of the bw tests (bw, put_bw, get_bw, put_bibw)")
    p.add_argument("-w", "--window-type", default="allocate", choices=("allocate", "create"),
                   help="one-sided tests: the window's memory, as OSU's -w: allocate (the "
                        "library allocates it, MPI_Win_allocate / allocate_window; default) "
                        "or create (the benchmark's buffer, MPI_Win_create / window)")
    p.add_argument("--label", default=None)
    return p


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def peer_main(backend, args, extra_meta=None) -> int:
    """Run every requested collective on ``backend``; rank 0 prints JSON lines."""
    rank0 = backend.rank == 0
    mn, mx = parse_message_range(args.sizes, 1, 1 << 20)
    sizes = message_sizes(mn, mx)
    dtype = normalize_dtype(args.dtype)
    if rank0:
        meta = {"library": backend.name, "version": backend.version,
                "ranks": backend.world_size, "transport": backend.transport(),
                "python": platform.python_version(), "pid": os.getpid()}
        meta.update(extra_meta or {})
        emit({"meta": meta})
    backend.window_type = args.window_type
    rc = 0
    for coll in [c.strip() for c in args.collectives.split(",") if c.strip()]:
        if coll not in C.SPECS:
            if rank0:
                emit({"error": f"unknown collective {coll!r}", "library": backend.name,
                      "collective": coll})
            rc = 2
            continue
        csizes = [0] if coll == "barrier" else sizes

        def on_row(row, _coll=coll):
            if rank0:
                row["version"] = backend.version
                if args.label:
                    row["label"] = args.label
                emit(row)

        try:
            backend.check_supported(coll, dtype, args.op)
            run_sweep(backend, coll, csizes, dtype, args.op, on_row=on_row,
                      iters=args.iterations, warmup=args.warmup, timing=args.timing,
                      root=args.root, do_validate=args.validation,
                      time_budget=args.time_budget, min_iters=args.min_iterations,
                      window=args.window, stop_on_fail=False)
        except BenchError as e:
            # raised identically on every rank before any communication
            if rank0:
                emit({"error": str(e), "library": backend.name, "collective": coll})
            rc = rc or 3
        except Exception as e:   # a library error mid-sweep: report and stop this runner
            if rank0:
                emit({"error": f"{type(e).__name__}: {e}", "library": backend.name,
                      "collective": coll})
            traceback.print_exc()
            return 1
    return rc
