"""The selector's choice for every (collective, size, world size, link layout, ordered) of a
grid is the one recorded in ``selection_grid.json``.

The record was written by the selector of if-chains over algorithm names that the table of
``Algorithm`` records (``pycoll/algorithms/__init__.py``) replaced: the move changed where
each cost is declared, not what any call runs. A deliberate change of the cost model
rewrites the record (``python tests/algorithms/test_selection_grid.py --write``) and says so
in its commit. Pure arithmetic, no processes; the links are literal numbers (not the
transports' declarations) and the cores are fixed, so the record holds on every machine.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pycoll.algorithms import ALGORITHMS
from pycoll.algorithms.cost import Hierarchy, LinkModel, WireFormat
from pycoll.algorithms.selection import ORDERED_ALGORITHMS, Selector
from pycoll.errors import InvalidArgument
from pycoll.transports.base import Capabilities

RECORD = Path(__file__).with_name("selection_grid.json")

SHM = Capabilities("shm", latency_us=1.0, bandwidth_gbps=8.0, same_host_only=True)
TCP = Capabilities("tcp", latency_us=25.0, bandwidth_gbps=3.0, same_host_only=False)
CUDA_IPC = Capabilities("cuda_ipc", latency_us=10.0, bandwidth_gbps=100.0, same_host_only=True,
                        segment_bytes=4 << 20)
VERBS = Capabilities("verbs", latency_us=3.0, bandwidth_gbps=12.0, same_host_only=False)

#: layout name -> (capabilities in use, cores modelled, (nodes, ranks per node) or None)
LAYOUTS: dict[str, tuple[list[Capabilities], int, tuple[int, int] | None]] = {
    "shm-2cores": ([SHM], 2, None),
    "shm-16cores": ([SHM], 16, None),
    "shm-uncounted": ([SHM], 0, None),
    "tcp": ([TCP], 0, None),
    "verbs": ([VERBS], 0, None),
    "cuda_ipc-8cores": ([CUDA_IPC], 8, None),
    "none": ([], 0, None),
    "shm+tcp-2x2": ([SHM, TCP], 0, (2, 2)),
    "shm+tcp-2x4": ([SHM, TCP], 0, (2, 4)),
    "shm+tcp-4x2": ([SHM, TCP], 0, (4, 2)),
    "shm+tcp-3x3": ([SHM, TCP], 0, (3, 3)),
    "shm+tcp-8x8": ([SHM, TCP], 0, (8, 8)),
    "shm+verbs-16x4": ([SHM, VERBS], 0, (16, 4)),
}
WORLDS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 64, 1024]
SIZES = sorted({0, 1, 7, *(1 << k for k in range(3, 29)), *(3 << k for k in range(3, 27))})


def selector(layout: str) -> Selector:
    caps, cores, nodes = LAYOUTS[layout]
    hierarchy = None
    if nodes is not None:
        hierarchy = Hierarchy(nodes[0], nodes[1],
                              replace(LinkModel.from_capabilities([caps[0]]), cores=0),
                              replace(LinkModel.from_capabilities([caps[1]]), cores=0))
    sel = Selector(ALGORITHMS, caps, overrides={}, hierarchy=hierarchy)
    sel.link = replace(sel.link, cores=cores)
    return sel


def worlds(layout: str) -> list[int]:
    nodes = LAYOUTS[layout][2]
    return WORLDS if nodes is None else [nodes[0] * nodes[1]]


def row(sel: Selector, collective: str, p: int, ordered: bool) -> str:
    """The choices over ``SIZES``, run-length coded: "name@first size" at each change."""
    out, last = [], None
    for n in SIZES:
        name = sel.choose(collective, n, p, ordered=ordered)
        if name != last:
            out.append(f"{name}@{n}")
            last = name
    return " ".join(out)


def grid() -> dict[str, str]:
    table = {}
    for layout in LAYOUTS:
        sel = selector(layout)
        for collective in ALGORITHMS:
            for p in worlds(layout):
                for ordered in (False, True):
                    table[f"{layout} {collective} p={p} ordered={int(ordered)}"] = row(
                        sel, collective, p, ordered)
    return table


def test_every_choice_is_the_recorded_one():
    expected = json.loads(RECORD.read_text())
    found = grid()
    assert set(found) == set(expected)
    differ = [f"{key}: recorded {expected[key]!r}, now {found[key]!r}"
              for key in expected if found[key] != expected[key]]
    assert not differ, f"{len(differ)} rows differ:\n" + "\n".join(differ[:20])


@pytest.mark.parametrize("collective", list(ALGORITHMS))
def test_forced_choices_go_through_the_same_table(collective):
    """``algo=`` and ``PYCOLL_ALGO`` name any algorithm of the table, and only those; an
    ordered call refuses a forced one that does not fold in rank order, and ignores the
    job-wide override for it."""
    sel = selector("shm-2cores")
    for name, record in ALGORITHMS[collective].items():
        if record.compressed:       # compress= calls only, and never by PYCOLL_ALGO
            assert sel.choose(collective, 1 << 20, 4, name, wire=WireFormat(0.25, 2.0)) == name
            with pytest.raises(InvalidArgument, match="pass compress="):
                sel.choose(collective, 1 << 20, 4, name)
            with pytest.raises(InvalidArgument, match="only compress="):
                Selector(ALGORITHMS, [SHM], overrides={collective: name})
            continue
        assert sel.choose(collective, 1 << 20, 4, name) == name
        if any(a.compressed for a in ALGORITHMS[collective].values()):
            with pytest.raises(InvalidArgument, match="with compress= runs"):
                sel.choose(collective, 1 << 20, 4, name, wire=WireFormat(0.25, 2.0))
        forced = Selector(ALGORITHMS, [SHM], overrides={collective: name})
        assert forced.choose(collective, 1 << 20, 4) == name
        folds = ORDERED_ALGORITHMS & set(ALGORITHMS[collective])
        if folds:
            assert forced.choose(collective, 1 << 20, 4, ordered=True) in folds
    with pytest.raises(InvalidArgument, match=f"unknown {collective} algorithm 'nope'"):
        sel.choose(collective, 8, 4, "nope")
    with pytest.raises(InvalidArgument, match="unknown collective"):
        Selector(ALGORITHMS, [SHM], overrides={"nope": "ring"})


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    RECORD.write_text(json.dumps(grid(), indent=0, sort_keys=True) + "\n")
