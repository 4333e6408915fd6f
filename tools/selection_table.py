"""Print the table of docs/algorithms.md: what the cost model picks, per world size and size.

    .venv/bin/python tools/selection_table.py

It calls ``Selector.choose`` with this repository's constants for two layouts: every rank
over shm on one 2-core host (this machine), and every rank over tcp (cores not modelled).
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pycoll.algorithms import ALGORITHMS  # noqa: E402
from pycoll.algorithms.selection import Selector  # noqa: E402
from pycoll.transports.shm.transport import ShmTransport  # noqa: E402
from pycoll.transports.tcp.transport import TcpTransport  # noqa: E402

SIZES = [1 << k for k in range(3, 29)]      # 8 B .. 256 MiB
ROWS = [("allreduce", "allreduce"), ("broadcast", "broadcast"), ("reduce", "reduce"),
        ("allgather", "allgather"), ("reduce_scatter", "reduce_scatter"),
        ("gather / scatter", "gather"), ("alltoall", "alltoall")]


def human(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def choices(selector: Selector, collective: str, p: int) -> str:
    picks = [(n, selector.choose(collective, n, p)) for n in SIZES]
    parts = [picks[0][1]]
    for (_, before), (n, now) in zip(picks, picks[1:]):
        if now != before:
            parts.append(f"≥{human(n)}: {now}")
    return ", ".join(parts)


def main() -> None:
    # no Hierarchy (one node): "hierarchical" costs infinity and is never picked
    shm = Selector(ALGORITHMS, [ShmTransport.capabilities], overrides={})
    shm.link = replace(shm.link, cores=2)
    tcp = Selector(ALGORITHMS, [TcpTransport.capabilities], overrides={})
    tcp.link = replace(tcp.link, cores=0)
    print("| collective | p | shm, one 2-core host | tcp (cores not modelled) |")
    print("|---|---|---|---|")
    for label, collective in ROWS:
        for p in (2, 3, 4, 8):
            print(f"| {label} | {p} | {choices(shm, collective, p)} | "
                  f"{choices(tcp, collective, p)} |")


if __name__ == "__main__":
    main()
