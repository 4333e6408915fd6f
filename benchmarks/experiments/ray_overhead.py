"""What running a job through Ray costs: ``pycoll.ray.run`` against forked ranks.

On one host, a local Ray cluster (``ray.init(num_cpus=4)``): the wall time of one
``pycoll.ray.run`` of a job that does nothing but join (placement group, actors, bootstrap,
teardown), and the allreduce time inside the job at a few sizes, against the same job on
forked ranks (``pycoll.testing.run_ranks``). The collectives should not care who started the
processes (both use shared memory); the start-up is Ray's price.

    python benchmarks/experiments/ray_overhead.py --out benchmarks/out/NAME

Writes results.json and results.md to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SIZES = [1 << 12, 1 << 20, 1 << 24]      # bytes of float32


def allreduce_times(comm, sizes, iters):
    """Median seconds of one allreduce per size, after a warm-up call."""
    import statistics
    import time

    import numpy as np

    out = {}
    for nbytes in sizes:
        x = np.ones(nbytes // 4, dtype=np.float32)
        comm.allreduce(x)
        times = []
        for _ in range(iters):
            comm.barrier()
            start = time.perf_counter()
            comm.allreduce(x)
            times.append(time.perf_counter() - start)
        out[nbytes] = statistics.median(times)
    return out


def nothing(comm):
    return comm.rank


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--reps", type=int, default=5, help="run() calls per world size")
    ap.add_argument("--iters", type=int, default=20, help="allreduces per size")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import ray

    import pycoll.ray
    from pycoll.testing import run_ranks

    command = " ".join(["python", "benchmarks/experiments/ray_overhead.py",
                        *(argv or sys.argv[1:])])
    worlds = [int(n) for n in args.ranks.split(",")]
    results: dict = {"command": command, "worlds": {}}
    # forked first: a process that runs a Ray driver has gRPC threads, which fork does not carry
    forked = {n: run_ranks(allreduce_times, n, SIZES, args.iters, timeout=120)[0]
              for n in worlds}
    with tempfile.TemporaryDirectory(prefix="pycoll-ray-") as temp:
        start = time.perf_counter()
        ray.init(num_cpus=4, include_dashboard=False, object_store_memory=80 << 20,
                 _temp_dir=temp, log_to_driver=False)
        results["ray_init_s"] = time.perf_counter() - start
        try:
            for n in worlds:
                walls = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    pycoll.ray.run(nothing, n, num_cpus=4 / n, timeout=60)
                    walls.append(time.perf_counter() - start)
                in_ray = pycoll.ray.run(allreduce_times, n, args=(SIZES, args.iters),
                                        num_cpus=4 / n, timeout=60)[0]
                results["worlds"][n] = {"run_wall_s": walls, "allreduce_ray_s": in_ray,
                                        "allreduce_forked_s": forked[n]}
                print(f"n={n}: run() median {statistics.median(walls):.2f} s; " + ", ".join(
                    f"{b >> 10} KiB ray {in_ray[b] * 1e6:.0f} us / forked "
                    f"{forked[n][b] * 1e6:.0f} us" for b in SIZES), flush=True)
        finally:
            ray.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = [f"# pycoll.ray.run overhead\n\n`{command}`\n",
             f"ray.init (a new local cluster): {results['ray_init_s']:.2f} s\n",
             "| ranks | run() of an empty job, median (min-max) | allreduce size | in Ray actors "
             "| forked ranks |", "|---|---|---|---|---|"]
    for n, r in results["worlds"].items():
        walls = r["run_wall_s"]
        head = (f"{statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f})")
        for i, b in enumerate(SIZES):
            lines.append(f"| {n if i == 0 else ''} | {head if i == 0 else ''} | {b >> 10} KiB "
                         f"| {r['allreduce_ray_s'][b] * 1e6:.0f} us "
                         f"| {r['allreduce_forked_s'][b] * 1e6:.0f} us |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
