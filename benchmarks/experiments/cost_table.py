"""Print the cost model's algorithm choices at large world sizes as a markdown table.

    python benchmarks/experiments/cost_table.py            # the table in docs/algorithms.md

Pure arithmetic (``pycoll.algorithms.selection.Selector``): no ranks are started. ``tcp`` is a
job spread over hosts (every rank on its own core); ``inproc`` is the in-process transport of the
256/1024-rank tests, whose ranks share this machine's cores (the crowded model).
"""
from __future__ import annotations

import argparse

from pycoll.algorithms import ALGORITHMS
from pycoll.algorithms.selection import Selector
from pycoll.transports import registry

COLLECTIVES = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
               "gather", "scatter"]
SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def _label(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def table(transport: str, worlds: list[int]) -> str:
    caps = [registry.transport_class(transport).capabilities]
    sel = Selector(ALGORITHMS, caps, overrides={})
    head = "| collective | ranks | " + " | ".join(_label(s) for s in SIZES) + " |"
    rows = [head, "|" + "---|" * (len(SIZES) + 2)]
    for coll in COLLECTIVES:
        for p in worlds:
            rows.append(f"| {coll} | {p} | "
                        + " | ".join(sel.choose(coll, s, p) for s in SIZES) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="256,1024")
    ap.add_argument("--transports", default="tcp,inproc")
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    for t in args.transports.split(","):
        print(f"\n{t} (sizes: the collective's bytes as the communicator reports them)\n")
        print(table(t, worlds))


if __name__ == "__main__":
    main()
