"""The cost model's choices: the table in docs/algorithms.md is what the code picks, and the
crossovers measured by benchmarks/algorithms_sweep.py (docs/performance.md, the cost model's choice)
hold. Pure arithmetic (no processes): ``Selector.choose`` on the declared capabilities."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pycoll.algorithms import ALGORITHMS
from pycoll.algorithms.selection import Selector
from pycoll.transports.shm.transport import ShmTransport

ROOT = Path(__file__).resolve().parents[2]
SIZES = [1 << k for k in range(3, 29)]


def test_docs_table_is_what_the_model_picks():
    table = subprocess.run([sys.executable, str(ROOT / "tools" / "selection_table.py")],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert table.count("\n") > 20
    assert table.strip() in (ROOT / "docs" / "algorithms.md").read_text(), \
        "docs/algorithms.md is stale: paste the output of tools/selection_table.py"


@pytest.fixture
def one_host() -> Selector:
    """Every rank over shm on a 2-core host: the machine the sweep measured."""
    sel = Selector(ALGORITHMS, [ShmTransport.capabilities], overrides={})
    sel.link = replace(sel.link, cores=2)
    return sel


def test_reduce_two_ranks_is_binomial_at_every_size(one_host):
    # measured: binomial 1.13-1.41x faster than the ring from 512 KiB up
    assert {one_host.choose("reduce", n, 2) for n in SIZES} == {"binomial"}


def test_reduce_four_ranks_turns_to_the_ring_for_large_messages(one_host):
    assert one_host.choose("reduce", 8 << 10, 4) == "binomial"
    # measured: the ring 1.11-1.36x faster from 2 MiB
    assert {one_host.choose("reduce", n, 4) for n in SIZES if n >= 2 << 20} == {"ring"}


def test_alltoall_scattered_from_three_ranks(one_host):
    # measured with 4 ranks: scattered at least as fast as pairwise at every size
    for p in (3, 4, 8):
        assert {one_host.choose("alltoall", n * p, p) for n in SIZES} == {"scattered"}


def test_gather_and_scatter_linear_on_a_small_host(one_host):
    for coll in ("gather", "scatter"):
        assert {one_host.choose(coll, n, 4) for n in SIZES} == {"linear"}
