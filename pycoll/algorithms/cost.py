"""The alpha-beta cost model's parts, and ``Algorithm``: the record each algorithm module
declares for every collective it serves (its run function, its cost, when the model may pick
it), which ``ALGORITHMS`` (``__init__.py``) lists and ``selection.py`` iterates.

Like NCCL's tuner, the model is pure arithmetic on (collective, bytes, world size, the
transports in use). Each transport declares its latency (alpha) and bandwidth (beta); a
constant per step covers pycoll's own Python overhead, which dominates small messages; the
reduction rate covers the arithmetic. Each cost returns seconds for one call: ``nbytes`` is
the collective's size as the communicator reports it (the whole buffer for
allreduce/broadcast/reduce, the total over ranks for allgather/reduce_scatter/gather/scatter,
the send buffer for alltoall). Formulas are Thakur, Rabenseifner and Gropp (2005); "work" is
the bytes every rank copies and reduces, summed, which bounds the time when ranks outnumber
cores (``bound``).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..transports.base import Capabilities

# Calibrated with benchmarks/algorithms_sweep.py (docs/algorithms.md, "How the choice is made").
PYTHON_STEP_US = 11.0       # pycoll's own cost of one primitive step (Python, waiting)
REDUCE_GBPS = 10.0          # numpy in-place add, large buffers, this class of machine
#: pycoll's cost of one more posted message when many are in flight at once
PER_MESSAGE_US = 2.0


@dataclass(frozen=True)
class LinkModel:
    """The slowest link a collective crosses: alpha in seconds, beta in seconds per byte.

    ``cores`` is the host's CPU count when the whole job runs on this one host (every
    channel is same-host), else 0 (not modelled). Every rank then sees the same value, so
    every rank picks the same algorithm -- a must, or the ranks would run different
    message patterns and deadlock. On a crowded host (more ranks than cores) the CPU, not the
    link, is the bottleneck, and the total work of an algorithm decides (``bound``).
    """

    alpha: float
    beta: float
    segment_bytes: int = 1 << 20   # pipelining granularity (the largest in use)
    cores: int = 0

    @classmethod
    def from_capabilities(cls, caps: Sequence[Capabilities]) -> LinkModel:
        if not caps:
            return cls(PYTHON_STEP_US * 1e-6, 0.0)
        latency = max(c.latency_us for c in caps)
        bandwidth = min(c.bandwidth_gbps for c in caps)
        segment = max(c.segment_bytes for c in caps)
        cores = (os.cpu_count() or 0) if all(c.same_host_only for c in caps) else 0
        return cls((latency + PYTHON_STEP_US) * 1e-6, 1.0 / (bandwidth * 1e9), segment, cores)


@dataclass(frozen=True)
class Hierarchy:
    """A uniform multi-node layout: ``nodes`` nodes of ``local`` ranks, and their links.

    Hierarchical algorithms run the intra-node steps on ``intra`` (shm) and the
    inter-node steps on ``inter`` (tcp), each with its own alpha and beta.
    """

    nodes: int
    local: int
    intra: LinkModel
    inter: LinkModel


@dataclass(frozen=True)
class WireFormat:
    """What a compressed call (``compress=``) puts on the wire, as its costs price it:
    ``ratio``, wire bytes per input byte (``Codec.ratio``), and ``codec_gbps``, input GB/s
    of one quantisation or dequantisation pass (``Codec.pass_gbps``: each format's codec
    runs at its own speed, and the numpy fallback far slower than the compiled one)."""

    ratio: float = 1.0
    codec_gbps: float = float("inf")


@dataclass(frozen=True)
class Network:
    """What a cost sees of the links: the slowest one in use (``link``) and, on a uniform
    multi-node layout, its two levels (``hierarchy``, else None); ``wire``: the format of
    the compressed call being priced (the costs of compressed records read it)."""

    link: LinkModel
    hierarchy: Hierarchy | None = None
    wire: WireFormat = WireFormat()


#: ``cost(nbytes, p, network)``: modelled seconds of one call
Cost = Callable[[int, int, Network], float]


def always(network: Network) -> bool:
    return True


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of one collective: ``run`` (the signature of its collective,
    ``__init__.py``), ``cost`` (seconds, from the model's parts here), ``ordered`` (it folds
    in rank order: what ``deterministic=True`` calls run, and only they, unless forced),
    ``applies(network)`` (whether the model may pick it unasked; ``algo=`` and
    ``PYCOLL_ALGO`` run it regardless), ``compressed`` (it moves a compressed wire format,
    ``compressed.py``: what ``compress=`` calls run, and only they; its ``run`` takes the
    ``Compression`` last and its cost prices ``Network.wire``: its ratio of the bytes, its
    codec's speed)."""

    collective: str
    name: str
    run: Callable[..., Any]
    cost: Cost
    ordered: bool = False
    applies: Callable[[Network], bool] = always
    compressed: bool = False


def gamma() -> float:
    """Seconds per byte reduced."""
    return 1.0 / (REDUCE_GBPS * 1e9)


def lg(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree, dissemination or Bruck."""
    return (p - 1).bit_length()


def pof2(p: int) -> int:
    """The largest power of two <= p (the ranks left after folding)."""
    return 1 << (p.bit_length() - 1)


def oversub(p: int, link: LinkModel) -> float:
    """Ranks per core when the whole job shares one host (1.0 when unknown or not crowded)."""
    return max(1.0, p / link.cores) if link.cores else 1.0


def alpha(p: int, link: LinkModel, everyone: bool) -> float:
    """Latency of one step. With more ranks than cores a step waits for a descheduled peer:
    measured, a step in which every rank is busy (ring, exchanges) costs about
    oversub**2.5 times as much, a step of a tree (few ranks active) about oversub times."""
    o = oversub(p, link)
    return link.alpha * (o ** 2.5 if everyone else o)


def bound(critical: float, work: float, p: int, link: LinkModel,
          everyone: bool = True) -> float:
    """The time is the critical path, unless the CPUs cannot supply the total work (summed
    over ranks, in seconds) that fast: with p ranks on fewer cores, time >= work / cores.
    When every rank is busy at once the crowded cores also thrash (switches, caches): the
    sweep shows such algorithms' work costing about ``oversub`` times more."""
    if not link.cores:
        return critical
    limit = work * (oversub(p, link) if everyone else 1.0) / min(p, link.cores)
    # among CPU-bound algorithms, prefer the shorter critical path (fewer, larger steps)
    return max(critical, limit) + 0.01 * critical


def fold_cost(nbytes: int, p: int, link: LinkModel, reduce: bool = True) -> float:
    """Folding a non-power-of-two world: one full buffer in (reduced) and one out."""
    if pof2(p) == p:
        return 0.0
    return (2 * alpha(p, link, False) + 2 * nbytes * link.beta
            + (nbytes * gamma() if reduce else 0.0))


def crowd(transfers: int, link: LinkModel) -> int:
    """How many times longer ``transfers`` copies take when they run at once on one host.

    Measured with benchmarks/algorithms_sweep.py (reduce, 128 KiB-64 MiB, 5 rounds): the two
    half-size reductions of a 2-rank ring take as long as one full-size reduction, and the
    first round of a 4-rank binomial tree (two reductions at once) twice as long as the
    second; the copies of one host's ranks contend instead of overlapping, up to one per core.
    """
    return max(1, min(transfers, link.cores)) if link.cores else 1
