"""How long a quiet shrink takes when it shares the old channels, against the same shrink
building new ones (the path after a failure), in the same run.

n ranks on this host connect every pair, then shrink by one rank at a time (the last rank
is excluded and leaves) down to 2 ranks. "shared": a plain ``shrink(exclude=[last])`` on a
working communicator (docs/elastic.md: it shares the channels). "new channels": the same
after ``revoke()`` (a revoked communicator is not quiet, so the shrink bootstraps anew, as
after a death, and as torch's ``SHRINK_ABORT``). Timed on every survivor: the shrink call
to the end of its first allreduce of 8 floats that touches every pair (n-1 sends), the
median over survivors and steps; ``--reps`` runs of each, alternating.

    python benchmarks/experiments/shrink_sharing.py --ranks 8 --transports shm tcp --reps 3 \\
        --out benchmarks/out/NAME
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import pycoll
from pycoll.testing import run_ranks


def _connect_all(comm: pycoll.Communicator) -> None:
    x = np.zeros(comm.size)
    comm.alltoall(np.ones(comm.size), x)


def _shrinks(comm: pycoll.Communicator, fresh: bool) -> list[float]:
    """This rank's shrink times (s) until it is excluded or two ranks are left."""
    times = []
    _connect_all(comm)
    while comm.size > 2:
        if comm.rank == comm.size - 1:
            comm.finalize(timeout=5.0)
            return times
        start = time.perf_counter()
        if fresh:
            comm.revoke("benchmark: build new channels")
        comm = comm.shrink(exclude=[comm.size - 1])
        _connect_all(comm)
        times.append(time.perf_counter() - start)
    comm.finalize(timeout=5.0)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--transports", nargs="+", default=["shm", "tcp"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default="")
    args = p.parse_args()
    rows = []
    for transport in args.transports:
        got: dict[str, list[float]] = {"shared": [], "new channels": []}
        for _ in range(args.reps):
            for label, fresh in (("shared", False), ("new channels", True)):
                out = run_ranks(_shrinks, args.ranks, fresh, timeout=300,
                                env={"PYCOLL_TRANSPORTS": transport})
                got[label] += [t for times in out for t in times]
        shared, fresh = (float(np.median(got[k])) * 1e3 for k in ("shared", "new channels"))
        rows.append({"transport": transport, "ranks": args.ranks, "shared_ms": shared,
                     "new_channels_ms": fresh, "samples": len(got["shared"])})
        print(f"{transport}, {args.ranks} ranks down to 2: shrink + first alltoall "
              f"{shared:.1f} ms shared vs {fresh:.1f} ms with new channels "
              f"({fresh / shared:.1f}x), median of {len(got['shared'])}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "shrink_sharing.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
