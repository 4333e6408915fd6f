"""Algorithm selection: an alpha-beta cost model, overridable per call and per job.

Like NCCL's tuner, the choice is pure arithmetic on (collective, bytes, world size, the
transports in use). Each transport declares its latency (alpha) and bandwidth (beta); a
constant per step covers pycoll's own Python overhead, which dominates small messages; the
reduction rate covers the arithmetic. Overrides: ``algo=`` on a call, or
``PYCOLL_ALGO="allreduce=ring,broadcast=pipeline"`` for the job.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

from .errors import InvalidArgument
from .transports.base import Capabilities

PYTHON_STEP_US = 8.0        # measured cost of one primitive step in pycoll itself
REDUCE_GBPS = 6.0           # numpy in-place add, large buffers, this class of machine


@dataclass(frozen=True)
class LinkModel:
    """The slowest link a collective crosses: alpha in seconds, beta in seconds per byte."""

    alpha: float
    beta: float
    segment_bytes: int = 1 << 20   # pipelining granularity (the largest in use)

    @classmethod
    def from_capabilities(cls, caps: Sequence[Capabilities]) -> "LinkModel":
        if not caps:
            return cls(PYTHON_STEP_US * 1e-6, 0.0)
        latency = max(c.latency_us for c in caps)
        bandwidth = min(c.bandwidth_gbps for c in caps)
        segment = max(c.segment_bytes for c in caps)
        return cls((latency + PYTHON_STEP_US) * 1e-6, 1.0 / (bandwidth * 1e9), segment)


def _gamma() -> float:
    return 1.0 / (REDUCE_GBPS * 1e9)


def _lg(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree, dissemination or Bruck."""
    return (p - 1).bit_length()


def _pof2(p: int) -> int:
    """The largest power of two <= p (the ranks left after folding)."""
    return 1 << (p.bit_length() - 1)


def _fold(nbytes: int, p: int, link: LinkModel, reduce: bool = True) -> float:
    """Folding a non-power-of-two world: one full buffer in (reduced) and one out."""
    if _pof2(p) == p:
        return 0.0
    return 2 * link.alpha + 2 * nbytes * link.beta + (nbytes * _gamma() if reduce else 0.0)


# Each model returns seconds for one call: nbytes is the collective's size as the
# communicator reports it (the whole buffer for allreduce/broadcast/reduce, the total over
# ranks for allgather/reduce_scatter/gather/scatter, the send buffer for alltoall).
def cost_allreduce(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b, g = link.alpha, link.beta, _gamma()
    if algo == "ring":
        return 2 * (p - 1) * a + (p - 1) / p * nbytes * (2 * b + g)
    if algo == "recursive_doubling":
        return _lg(_pof2(p)) * (a + nbytes * (b + g)) + _fold(nbytes, p, link)
    if algo == "rabenseifner":
        q = _pof2(p)
        return 2 * _lg(q) * a + (q - 1) / q * nbytes * (2 * b + g) + _fold(nbytes, p, link)
    raise KeyError(algo)


def cost_broadcast(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b = link.alpha, link.beta
    if algo == "binomial":
        return _lg(p) * (a + nbytes * b)
    if algo == "pipeline":
        k = max(1, math.ceil(nbytes / link.segment_bytes))
        return (p - 2 + k) * (a + nbytes / k * b)
    if algo == "scatter_allgather":
        return (_lg(p) + p - 1) * a + 2 * (p - 1) / p * nbytes * b
    raise KeyError(algo)


def cost_reduce(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b, g = link.alpha, link.beta, _gamma()
    if algo == "binomial":
        return _lg(p) * (a + nbytes * (b + g))
    if algo == "ring":  # ring reduce-scatter, then the root gathers p - 1 chunks
        return p * a + (p - 1) / p * nbytes * (2 * b + g)
    raise KeyError(algo)


def cost_allgather(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b = link.alpha, link.beta
    if algo == "ring":
        return (p - 1) * a + (p - 1) / p * nbytes * b
    if algo in ("recursive_doubling", "bruck"):
        # Bruck's wrapping ranges cost a second message in some rounds
        extra = 0 if (algo == "recursive_doubling" and _pof2(p) == p) else 0.5 * _lg(p)
        return (_lg(p) + extra) * a + (p - 1) / p * nbytes * b
    raise KeyError(algo)


def cost_reduce_scatter(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b, g = link.alpha, link.beta, _gamma()
    if algo == "ring":
        return (p - 1) * a + (p - 1) / p * nbytes * (b + g)
    if algo == "recursive_halving":
        q = _pof2(p)
        unfold = 0.0 if q == p else nbytes / p * b
        return (_lg(q) * a + (q - 1) / q * nbytes * (b + g)
                + _fold(nbytes, p, link) / 2 + unfold)
    raise KeyError(algo)


def cost_gather(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b = link.alpha, link.beta
    if algo == "linear":
        return (p - 1) * a + (p - 1) / p * nbytes * b
    if algo == "binomial":
        return _lg(p) * a + (p - 1) / p * nbytes * b
    raise KeyError(algo)


def cost_alltoall(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    return (p - 1) * (link.alpha + nbytes / p * link.beta)


def cost_barrier(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    return _lg(p) * link.alpha


COST_MODELS = {
    "allreduce": cost_allreduce,
    "broadcast": cost_broadcast,
    "reduce": cost_reduce,
    "allgather": cost_allgather,
    "reduce_scatter": cost_reduce_scatter,
    "gather": cost_gather,
    "scatter": cost_gather,       # the mirror image: same messages, opposite direction
    "alltoall": cost_alltoall,
    "barrier": cost_barrier,
}


def parse_overrides(spec: str | None) -> dict[str, str]:
    """Parse ``PYCOLL_ALGO`` ("allreduce=ring,broadcast=pipeline")."""
    result: dict[str, str] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise InvalidArgument(f"PYCOLL_ALGO entry {item!r} must look like collective=algorithm")
        coll, algo = (s.strip() for s in item.split("=", 1))
        result[coll] = algo
    return result


class Selector:
    """Chooses an algorithm per call; remembers the job-wide overrides."""

    def __init__(self, registry: dict[str, dict], caps: Sequence[Capabilities],
                 overrides: dict[str, str] | None = None,
                 hierarchy: "Hierarchy | None" = None) -> None:
        self.registry = registry
        self.link = LinkModel.from_capabilities(caps)
        self.hierarchy = hierarchy
        self.overrides = dict(overrides if overrides is not None
                              else parse_overrides(os.environ.get("PYCOLL_ALGO")))
        for coll, algo in self.overrides.items():
            self._check(coll, algo, "PYCOLL_ALGO")

    def _check(self, collective: str, algo: str, where: str) -> None:
        known = self.registry.get(collective)
        if known is None:
            raise InvalidArgument(f"{where}: unknown collective {collective!r}; known: "
                                  + ", ".join(sorted(self.registry)))
        if algo not in known:
            raise InvalidArgument(f"{where}: unknown {collective} algorithm {algo!r}; choose one of "
                                  + ", ".join(sorted(known)))

    def choose(self, collective: str, nbytes: int, world_size: int, algo: str | None = None) -> str:
        if algo is not None:
            self._check(collective, algo, "algo=")
            return algo
        if collective in self.overrides:
            return self.overrides[collective]
        candidates = self.registry[collective]
        model = COST_MODELS.get(collective)
        if model is None or len(candidates) == 1:
            return next(iter(candidates))
        return min(candidates, key=lambda name: self.cost(collective, name, nbytes, world_size))

    def cost(self, collective: str, algo: str, nbytes: int, world_size: int) -> float:
        """Modelled seconds; infinite for an algorithm the layout cannot use well."""
        if algo == "hierarchical":
            h = self.hierarchy
            return h.cost(collective, nbytes) if h is not None else math.inf
        return COST_MODELS[collective](algo, nbytes, world_size, self.link)


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

    def cost(self, collective: str, nbytes: int) -> float:
        if collective == "allreduce":
            p, a, b, g = self.local, self.intra.alpha, self.intra.beta, _gamma()
            inside = 2 * (p - 1) * a + (p - 1) / p * nbytes * (2 * b + g)
            shard = nbytes / p
            across = min(cost_allreduce(name, int(shard), self.nodes, self.inter)
                         for name in ("ring", "recursive_doubling"))
            return inside + across
        if collective == "broadcast":
            return (math.ceil(math.log2(self.nodes)) * (self.inter.alpha + nbytes * self.inter.beta)
                    + math.ceil(math.log2(self.local)) * (self.intra.alpha + nbytes * self.intra.beta))
        return math.inf
