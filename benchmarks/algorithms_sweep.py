"""Every algorithm of every collective, forced with ``algo=``, against the automatic choice.

    .venv/bin/python benchmarks/algorithms_sweep.py         # 8 B .. 256 MiB, 2 and 4 ranks
    .venv/bin/python benchmarks/algorithms_sweep.py --max-size 16M --ranks 4 --reps 5

For each collective, world size and message size it measures the latency of each algorithm
and of ``algo=None`` (what ``tuning.Selector`` picks), and reports busbw with the nccl-tests
formulas (docs/bench.md; nccl-tests' ``doc/PERFORMANCE.md``): the size is the largest buffer
of the operation (the whole array for allreduce/broadcast/reduce, the total over ranks for
allgather/reduce_scatter/gather/scatter/alltoall). It writes
``benchmarks/out/algorithms-<date>.md`` (and the raw numbers as ``.json`` next to it) and says,
per size, whether the automatic choice is within 10% of the best algorithm.

The machine is shared, so one timing means little: every (algorithm, size) is measured in
``--reps`` rounds that interleave the algorithms (a burst of load hits them all alike; the
order rotates from round to round, so none is always first), each
round timing enough back-to-back operations to fill ``--target-ms``; a round's time is the
slowest rank's mean, and the table shows the median over rounds.

The driver starts the ranks with ``pycoll.launch.launch`` (this same file with ``--worker``);
rank 0 writes the measurements to a JSON file the driver reads back.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

COLLECTIVES = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
               "gather", "scatter", "barrier"]
#: nccl-tests busbw factors (nccl-tests' doc/PERFORMANCE.md)
FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "barrier": lambda n: 1.0,
    **{c: (lambda n: (n - 1) / n)
       for c in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter")},
}
SPLIT = {"allgather", "reduce_scatter", "alltoall", "gather", "scatter"}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def sizes_between(lo: int, hi: int, step: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    if out[-1] != hi:
        out.append(hi)
    return out


def fmt_size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# -- the ranks -------------------------------------------------------------------------------
def _operation(comm: Any, coll: str, size: int, algo: str | None) -> Callable[[], None]:
    """One call of ``coll`` on ``size`` bytes (float32), with buffers allocated up front."""
    n = comm.size
    per = max(1, size // 4 // n) if coll in SPLIT else max(1, size // 4)
    f32 = np.float32
    if coll == "allreduce":
        a = np.zeros(per, f32)
        return lambda: comm.allreduce(a, "sum", algo=algo)
    if coll == "broadcast":
        a = np.zeros(per, f32)
        return lambda: comm.broadcast(a, 0, algo=algo)
    if coll == "reduce":
        a = np.zeros(per, f32)
        return lambda: comm.reduce(a, 0, "sum", algo=algo)
    if coll == "allgather":
        inp, out = np.zeros(per, f32), np.zeros(per * n, f32)
        return lambda: comm.allgather(out, inp, algo=algo)
    if coll == "reduce_scatter":
        inp, out = np.zeros(per * n, f32), np.zeros(per, f32)
        return lambda: comm.reduce_scatter(out, inp, "sum", algo=algo)
    if coll == "alltoall":
        inp, out = np.zeros(per * n, f32), np.zeros(per * n, f32)
        return lambda: comm.alltoall(out, inp, algo=algo)
    if coll == "gather":
        inp, out = np.zeros(per, f32), np.zeros(per * n, f32)
        return lambda: comm.gather(out, inp, 0, algo=algo)
    if coll == "scatter":
        inp, out = np.zeros(per * n, f32), np.zeros(per, f32)
        return lambda: comm.scatter(out, inp, 0, algo=algo)
    if coll == "barrier":
        return lambda: comm.barrier(algo=algo)
    raise ValueError(coll)


def _op_bytes(coll: str, size: int, n: int) -> int:
    """The byte count the communicator hands the selector (and nccl-tests' size S)."""
    if coll == "barrier":
        return 0
    if coll in SPLIT:
        return max(1, size // 4 // n) * 4 * n
    return max(1, size // 4) * 4


def _slowest(comm: Any, seconds: float) -> float:
    t = np.array([seconds])
    comm.allreduce(t, "max", algo="recursive_doubling")
    return float(t[0])


def _time(comm: Any, op: Callable[[], None], iters: int) -> float:
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    return _slowest(comm, (time.perf_counter() - t0) / iters)


def worker(args: argparse.Namespace) -> None:
    import pycoll
    from pycoll.algorithms import ALGORITHMS

    comm = pycoll.init()
    n = comm.size
    rows = []
    for coll in args.collectives:
        algos: list[str | None] = [name for name, a in ALGORITHMS[coll].items()
                                   if not a.compressed] + [None]     # (compress= only)
        for size in (args.sizes if coll != "barrier" else [0]):
            nbytes = _op_bytes(coll, size, n)
            ops = {a: _operation(comm, coll, size, a) for a in algos}
            iters = {}
            for a, op in ops.items():            # warm up (buffers, scratch) and size the runs
                op()
                once = _time(comm, op, 1)
                iters[a] = int(min(args.max_iters, max(1, args.target_ms * 1e-3 / max(once, 1e-7))))
            samples: dict[str | None, list[float]] = {a: [] for a in algos}
            order = list(ops)
            for rep in range(args.reps):     # rotate the order: no algorithm always goes first
                for a in order[rep % len(order):] + order[:rep % len(order)]:
                    samples[a].append(_time(comm, ops[a], iters[a]))
            del ops
            if comm.rank == 0:
                picked = comm.selected_algorithm(coll, nbytes)
                for a in algos:
                    rows.append({"collective": coll, "n": n, "size": nbytes, "algo": a or "auto",
                                 "picked": picked if a is None else a,
                                 "median_s": statistics.median(samples[a]),
                                 "samples_s": samples[a], "iters": iters[a]})
                print(f"[n={n}] {coll:15s} {fmt_size(nbytes):>10s} picked {picked}: "
                      + ", ".join(f"{a or 'auto'} {statistics.median(s) * 1e6:.0f}us"
                                  for a, s in samples.items()), flush=True)
    if comm.rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(rows, f)
    pycoll.finalize()


# -- the driver ------------------------------------------------------------------------------
def _table(rows: list[dict], coll: str, n: int) -> tuple[list[str], int, int]:
    """Markdown lines for one (collective, world size); (lines, sizes within 10%, sizes)."""
    mine = [r for r in rows if r["collective"] == coll and r["n"] == n]
    algos = [a for a in dict.fromkeys(r["algo"] for r in mine) if a != "auto"]
    sizes = sorted({r["size"] for r in mine})
    head = (["size"] + [f"{a} µs" for a in algos] + ["auto µs (picked)", "best",
                                                     "auto/best", "busbw best GB/s", "≤1.1×"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    good = 0
    for size in sizes:
        at = {r["algo"]: r for r in mine if r["size"] == size}
        best = min(algos, key=lambda a: at[a]["median_s"])
        t_best, auto = at[best]["median_s"], at["auto"]
        ratio = auto["median_s"] / t_best
        ok = ratio <= 1.10 or auto["picked"] == best
        good += ok
        busbw = size / t_best / 1e9 * FACTOR[coll](n) if size else 0.0
        lines.append("| " + " | ".join(
            [fmt_size(size)] + [f"{at[a]['median_s'] * 1e6:.1f}" for a in algos]
            + [f"{auto['median_s'] * 1e6:.1f} ({auto['picked']})", best, f"{ratio:.2f}",
               f"{busbw:.3f}", "yes" if ok else "**no**"]) + " |")
    return lines, good, len(sizes)


def report(rows: list[dict], meta: dict) -> str:
    out = [f"# Algorithm sweep, {meta['date']}", "",
           f"Machine: {meta['machine']}; load average at start {meta['load_start']}, at end "
           f"{meta['load_end']}.",
           f"Command: `{meta['command']}`", "",
           "Method: float32, sum; each cell is the median over "
           f"{meta['reps']} interleaved rounds of the slowest rank's mean time per operation "
           f"(each round ~{meta['target_ms']} ms of back-to-back calls). busbw uses the "
           "nccl-tests factors. `auto` is `algo=None` (the cost model: "
           "pycoll/algorithms/selection.py); "
           "'≤1.1×' is yes when auto is within 10% of the best forced algorithm or picked it "
           "(auto and the best differ only by noise then).", ""]
    summary = ["## Summary: automatic choice within 10% of the best", "",
               "| collective | ranks | sizes within 10% | sizes where auto was slower |",
               "|---|---|---|---|"]
    body = []
    for coll in meta["collectives"]:
        for n in meta["ranks"]:
            lines, good, total = _table(rows, coll, n)
            if not total:
                continue
            bad = [fmt_size(s) for s in sorted({r["size"] for r in rows
                                                 if r["collective"] == coll and r["n"] == n})
                   if not _ok(rows, coll, n, s)]
            summary.append(f"| {coll} | {n} | {good}/{total} | {', '.join(bad) or '-'} |")
            body += [f"## {coll}, {n} ranks", ""] + lines + [""]
    return "\n".join(out + summary + [""] + body)


def _ok(rows: list[dict], coll: str, n: int, size: int) -> bool:
    at = {r["algo"]: r for r in rows if r["collective"] == coll and r["n"] == n
          and r["size"] == size}
    best = min((a for a in at if a != "auto"), key=lambda a: at[a]["median_s"])
    return at["auto"]["median_s"] <= 1.10 * at[best]["median_s"] or at["auto"]["picked"] == best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4", help="world sizes, comma separated")
    p.add_argument("--min-size", default="8")
    p.add_argument("--max-size", default="256M")
    p.add_argument("--step", type=int, default=4, help="size multiplier between rows")
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--reps", type=int, default=5, help="interleaved rounds per cell (median)")
    p.add_argument("--target-ms", type=float, default=30.0, help="time per round and cell")
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--transport", default="", help="PYCOLL_TRANSPORTS for the ranks")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    args.sizes = sizes_between(parse_size(args.min_size), parse_size(args.max_size), args.step)
    if args.worker:
        worker(args)
        return 0

    from pycoll.launch import launch
    ranks = [int(x) for x in args.ranks.split(",")]
    date = datetime.date.today().isoformat()
    meta = {"date": date, "machine": f"{platform.node()} {platform.machine()}, "
                                     f"{os.cpu_count()} cores, Python {platform.python_version()}",
            "load_start": "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg()), "reps": args.reps,
            "target_ms": args.target_ms, "ranks": ranks, "collectives": args.collectives,
            "command": " ".join(["python", "benchmarks/algorithms_sweep.py"]
                                + (argv or sys.argv[1:]))}
    rows: list[dict] = []
    env = dict(os.environ)
    if args.transport:
        env["PYCOLL_TRANSPORTS"] = args.transport
    for n in ranks:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        try:
            passthrough = [a for a in (argv or sys.argv[1:])]
            code = launch([os.path.abspath(__file__), *passthrough, "--worker",
                           "--worker-out", path], n, env=env)
            if code != 0:
                print(f"sweep with {n} ranks failed (exit {code})", file=sys.stderr)
                return code
            with open(path) as f:
                rows += json.load(f)
        finally:
            os.unlink(path)
    meta["load_end"] = "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"algorithms-{date}")
    text = report(rows, meta)
    with open(base + ".md", "w") as f:
        f.write(text + "\n")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f)
    print(text.split("\n## ")[0] + "\n" + text.split("## Summary")[1].split("\n## ")[0])
    print(f"wrote {base}.md and {base}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
