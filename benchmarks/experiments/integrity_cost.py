#!/usr/bin/env python3
"""What the end-to-end integrity checks cost: allreduce (float32 sum) and broadcast (or the
``--collectives`` given: also reduce, reduce_scatter), off against
``PYCOLL_INTEGRITY=sample:100`` against ``sample:1``, 8 B to 64 MiB.

    python benchmarks/experiments/integrity_cost.py [--transport shm] [--ranks 2] [--max-bytes 64M]
                                        [--reps 5] [--json out.jsonl]
                                        [--collectives allreduce,broadcast]

It starts the job itself (``python -m pycoll.run``), each rank running this file with
``--rank-body``. The three settings are three communicators of the same ranks, made with
``PYCOLL_INTEGRITY`` unset, ``sample:100`` and ``sample:1`` (the variable is read when a
communicator is made), and measured interleaved: for each size, every repetition runs the
three in a rotated order, so the shared machine's noise hits them alike. Rank 0 prints the
median and the best time per call of each over the repetitions, and the ratios to off of
the best (the least disturbed by other work on a shared machine).

A sampled setting is measured over whole multiples of 100 calls up to 1 MiB. Above, 100
calls would take minutes on a shared machine: there ``sample:100`` is derived from the two
measured ones as (99 off + 1 sample:1) / 100, which is what it is by construction (one call
in a hundred is a checked one), and marked so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SETTINGS = ("off", "sample:100", "sample:1")
SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def _parse_bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


def _calls(nbytes: int) -> int:
    """Calls per measurement: about 20 ms of work, whole hundreds up to 1 MiB."""
    if nbytes <= 1 << 20:
        return 200 if nbytes <= 64 << 10 else 100
    return max(3, int(2e8 // nbytes))


def _call(comm, collective: str, arr: np.ndarray):
    """One call of ``collective`` on ``arr`` (the whole input: reduce_scatter leaves
    1/ranks of it in its output)."""
    if collective == "allreduce":
        return comm.allreduce
    if collective == "broadcast":
        return lambda x: comm.broadcast(x, 0)
    if collective == "reduce":
        return lambda x: comm.reduce(x, 0)
    if collective == "reduce_scatter":
        out = np.empty(len(arr) // comm.size, arr.dtype)
        return lambda x: comm.reduce_scatter(out, x[:len(out) * comm.size])
    raise SystemExit(f"--collectives: unknown {collective!r}")


def rank_body(a: argparse.Namespace) -> None:
    import pycoll

    os.environ.pop("PYCOLL_INTEGRITY", None)
    world = pycoll.init()
    comms = {"off": world}
    for setting in SETTINGS[1:]:
        os.environ["PYCOLL_INTEGRITY"] = setting
        comms[setting] = world.new_group(list(range(world.size)))
    os.environ.pop("PYCOLL_INTEGRITY", None)
    perf = time.perf_counter
    rows = []
    for nbytes in [s for s in SIZES if s <= a.max_bytes]:
        arr = np.ones(max(1, nbytes // 4), dtype=np.float32)
        calls = _calls(nbytes)
        derived = nbytes > 1 << 20
        for collective in a.collectives.split(","):
            times: dict[str, list[float]] = {s: [] for s in SETTINGS}
            for rep in range(a.reps + 1):                  # the first is a warm-up
                order = SETTINGS[rep % 3:] + SETTINGS[:rep % 3]
                for setting in order:
                    if derived and setting == "sample:100":
                        continue
                    comm = comms[setting]
                    call = _call(comm, collective, arr)
                    arr[:] = 0.0      # sums stay finite (ones would double each call)
                    comm.barrier()
                    t0 = perf()
                    for _ in range(calls):
                        call(arr)
                    dt = (perf() - t0) / calls
                    if rep:
                        times[setting].append(dt)
            med = {s: statistics.median(t) for s, t in times.items() if t}
            best = {s: min(t) for s, t in times.items() if t}
            if derived:
                for stat in (med, best):
                    stat["sample:100"] = (99 * stat["off"] + stat["sample:1"]) / 100
            rows.append({"collective": collective, "bytes": nbytes, "calls": calls,
                         "transport": a.transport, "ranks": world.size,
                         "sample:100 derived": derived,
                         **{f"{s} us": med[s] * 1e6 for s in SETTINGS},
                         **{f"{s} best us": best[s] * 1e6 for s in SETTINGS}})
    if world.rank == 0:
        out = open(a.json, "a") if a.json else None
        for row in rows:
            line = (f"{row['collective']:9s} {row['bytes']:>10d} B  median "
                    + "  ".join(f"{s} {row[f'{s} us']:9.1f}" for s in SETTINGS)
                    + "  best " + "  ".join(f"{row[f'{s} best us']:9.1f}" for s in SETTINGS)
                    + f" us; best: x{row['sample:1 best us'] / row['off best us']:.2f} at "
                    f"sample:1, x{row['sample:100 best us'] / row['off best us']:.3f} at "
                    "sample:100" + (" (derived)" if row["sample:100 derived"] else ""))
            print(line, flush=True)
            if out is not None:
                out.write(json.dumps(row) + "\n")
        if out is not None:
            out.close()
    for setting in SETTINGS[1:]:
        comms[setting].finalize()
    pycoll.finalize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", default="shm", help="shm (one host) or tcp")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--max-bytes", type=_parse_bytes, default=64 << 20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="append one JSON line per row (rank 0)")
    ap.add_argument("--collectives", default="allreduce,broadcast",
                    help="comma-separated: allreduce, broadcast, reduce, reduce_scatter")
    ap.add_argument("--rank-body", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_body:
        rank_body(a)
        return
    env = {**os.environ, "PYCOLL_TRANSPORTS": a.transport}
    env.pop("PYCOLL_INTEGRITY", None)
    args = ["--transport", a.transport, "--max-bytes", str(a.max_bytes), "--reps", str(a.reps),
            "--collectives", a.collectives]
    if a.json:
        args += ["--json", os.path.abspath(a.json)]
    rc = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", str(a.ranks),
                         os.path.abspath(__file__), "--rank-body", *args], env=env).returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
