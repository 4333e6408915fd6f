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
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import InvalidArgument
from ..transports.base import Capabilities

#: the algorithms that fold in rank order (``ordered.py``): what deterministic calls run
ORDERED = "ordered"
ORDERED_ALGORITHMS = frozenset({ORDERED, "ordered_gather"})
#: the reducing collectives with ordered algorithms
ORDERED_COLLECTIVES = frozenset({"allreduce", "reduce", "reduce_scatter"})

# Fitted with benchmarks/algorithms_sweep.py (2-rank medians; docs/algorithms.md): the
# step cost is an 8-byte exchange over shm end to end less the 1 us the transport declares;
# REDUCE_GBPS is a large float32 sum's streaming rate.
PYTHON_STEP_US = 11.0       # pycoll's own cost of one primitive step (Python, waiting)
REDUCE_GBPS = 10.0          # numpy in-place add, large buffers, this class of machine


@dataclass(frozen=True)
class LinkModel:
    """The slowest link a collective crosses: alpha in seconds, beta in seconds per byte.

    ``cores`` is the host's CPU count when the whole job runs on this one host (every
    channel is same-host), else 0 (not modelled). Every rank then sees the same value, so
    every rank picks the same algorithm -- a must, or the ranks would run different
    message patterns and deadlock. On a crowded host (more ranks than cores) the CPU, not the
    link, is the bottleneck, and the total work of an algorithm decides (``_bound``).
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


def _gamma() -> float:
    return 1.0 / (REDUCE_GBPS * 1e9)


def _lg(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree, dissemination or Bruck."""
    return (p - 1).bit_length()


def _pof2(p: int) -> int:
    """The largest power of two <= p (the ranks left after folding)."""
    return 1 << (p.bit_length() - 1)


def _oversub(p: int, link: LinkModel) -> float:
    """Ranks per core when the whole job shares one host (1.0 when unknown or not crowded)."""
    return max(1.0, p / link.cores) if link.cores else 1.0


def _alpha(p: int, link: LinkModel, everyone: bool) -> float:
    """Latency of one step. With more ranks than cores a step waits for a descheduled peer:
    measured, a step in which every rank is busy (ring, exchanges) costs about
    oversub**2.5 times as much, a step of a tree (few ranks active) about oversub times."""
    o = _oversub(p, link)
    return link.alpha * (o ** 2.5 if everyone else o)


def _bound(critical: float, work: float, p: int, link: LinkModel,
           everyone: bool = True) -> float:
    """The time is the critical path, unless the CPUs cannot supply the total work (summed
    over ranks, in seconds) that fast: with p ranks on fewer cores, time >= work / cores.
    When every rank is busy at once the crowded cores also thrash (switches, caches): the
    sweep shows such algorithms' work costing about ``oversub`` times more."""
    if not link.cores:
        return critical
    bound = work * (_oversub(p, link) if everyone else 1.0) / min(p, link.cores)
    # among CPU-bound algorithms, prefer the shorter critical path (fewer, larger steps)
    return max(critical, bound) + 0.01 * critical


def _fold(nbytes: int, p: int, link: LinkModel, reduce: bool = True) -> float:
    """Folding a non-power-of-two world: one full buffer in (reduced) and one out."""
    if _pof2(p) == p:
        return 0.0
    return (2 * _alpha(p, link, False) + 2 * nbytes * link.beta
            + (nbytes * _gamma() if reduce else 0.0))


# Each model returns seconds for one call: nbytes is the collective's size as the
# communicator reports it (the whole buffer for allreduce/broadcast/reduce, the total over
# ranks for allgather/reduce_scatter/gather/scatter, the send buffer for alltoall). Formulas
# are Thakur, Rabenseifner and Gropp (2005); "work" is the bytes every rank copies and
# reduces, summed, which bounds the time when ranks outnumber cores.
def cost_allreduce(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b, g = _alpha(p, link, True), link.beta, _gamma()
    q = _pof2(p)
    if algo == "ring":
        per_rank = (p - 1) / p * nbytes * (2 * b + g)
        return _bound(2 * (p - 1) * a + per_rank, p * per_rank, p, link)
    if algo == "recursive_doubling":
        fold = _fold(nbytes, p, link)
        per_rank = _lg(q) * nbytes * (b + g)
        return _bound(_lg(q) * a + per_rank + fold, q * per_rank + fold, p, link)
    if algo == "rabenseifner":
        fold = _fold(nbytes, p, link)
        per_rank = (q - 1) / q * nbytes * (2 * b + g)
        return _bound(2 * _lg(q) * a + per_rank + fold, q * per_rank + fold, p, link)
    if algo == ORDERED:
        rs = _ordered_reduce_scatter(nbytes, p, link)
        rounds = _lg(p) if p > 2 and _pof2(p) == p else p - 1     # the allgather's
        ag = rounds * a + (p - 1) / p * nbytes * b
        return _bound(rs + ag, p * (p - 1) / p * nbytes * (2 * b + 2 * g), p, link)
    if algo == "ordered_gather":     # one round: every buffer to every rank, folded there
        critical = a + (p - 2) * PER_MESSAGE_US * 1e-6 + (p - 1) * nbytes * (b + g)
        return _bound(critical, p * (p - 1) * nbytes * (b + g), p, link)
    raise KeyError(algo)


def _ordered_reduce_scatter(nbytes: int, p: int, link: LinkModel) -> float:
    """The ordered reduce-scatter (``ordered.py``): one round in which every rank posts its
    p - 1 pieces at once, the owner's link bringing in (p - 1) / p of the buffer, and the
    owner's fold of p pieces of 1/p of it (p - 1 passes, segment by segment)."""
    a, b, g = _alpha(p, link, True), link.beta, _gamma()
    return (a + (p - 2) * PER_MESSAGE_US * 1e-6 + (p - 1) / p * nbytes * b
            + (p - 1) / p * nbytes * g)


def cost_broadcast(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    b = link.beta
    if algo == "binomial":
        a = _alpha(p, link, False)
        return _bound(_lg(p) * (a + nbytes * b), (p - 1) * nbytes * b, p, link, False)
    if algo == "pipeline":
        a = _alpha(p, link, True)
        k = max(1, math.ceil(nbytes / link.segment_bytes))
        return _bound((p - 2 + k) * (a + nbytes / k * b), (p - 1) * nbytes * b, p, link)
    if algo == "scatter_allgather":
        a = _alpha(p, link, True)
        critical = (_lg(p) + p - 1) * a + 2 * (p - 1) / p * nbytes * b
        return _bound(critical, (p - 1 + _lg(p) / 2) * nbytes * b, p, link)
    raise KeyError(algo)


#: pycoll's cost of one more posted message when many are in flight at once
PER_MESSAGE_US = 2.0


def _crowd(transfers: int, link: LinkModel) -> int:
    """How many times longer ``transfers`` copies take when they run at once on one host.

    Measured with benchmarks/algorithms_sweep.py (reduce, 128 KiB-64 MiB, 5 rounds): the two
    half-size reductions of a 2-rank ring take as long as one full-size reduction, and the
    first round of a 4-rank binomial tree (two reductions at once) twice as long as the
    second; the copies of one host's ranks contend instead of overlapping, up to one per core.
    """
    return max(1, min(transfers, link.cores)) if link.cores else 1


def cost_reduce(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    b, g = link.beta, _gamma()
    if algo == "binomial":
        a = _alpha(p, link, False)
        # round k has p / 2**(k+1) reductions at once
        rounds = [max(1, p >> (k + 1)) for k in range(_lg(p))]
        critical = sum(a + _crowd(t, link) * nbytes * (b + g) for t in rounds)
        return _bound(critical, (p - 1) * nbytes * (b + g), p, link, False)
    if algo == "ordered_gather":     # every buffer to the root, folded there (one round)
        critical = (_alpha(p, link, False) + (p - 2) * PER_MESSAGE_US * 1e-6
                    + (p - 1) * nbytes * (b + g))
        return _bound(critical, (p - 1) * nbytes * (b + g), p, link, False)
    if algo == ORDERED:  # ordered reduce-scatter, then the root gathers p - 1 chunks at once
        critical = (_ordered_reduce_scatter(nbytes, p, link) + _alpha(p, link, False)
                    + (p - 1) / p * nbytes * b)
        return _bound(critical, (p - 1) * nbytes * (b + g) + (p - 1) / p * nbytes * b, p,
                      link, False)
    if algo == "ring":  # ring reduce-scatter (every rank at once), the root gathers p-1 chunks
        a = _alpha(p, link, True)
        critical = (p * a + _crowd(p, link) * (p - 1) / p * nbytes * (b + g)
                    + (p - 1) / p * nbytes * b)
        # the contention is in the critical path already: no thrash factor on the work
        return _bound(critical, (p - 1) * nbytes * (b + g) + (p - 1) / p * nbytes * b, p, link,
                      False)
    raise KeyError(algo)


def cost_allgather(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b = _alpha(p, link, True), link.beta
    work = (p - 1) * nbytes * b
    if algo == "ring":
        return _bound((p - 1) * a + (p - 1) / p * nbytes * b, work, p, link)
    if algo in ("recursive_doubling", "bruck"):
        # Bruck's ranges wrap in some rounds, which costs a second message there
        extra = 0 if (algo == "recursive_doubling" and _pof2(p) == p) else 0.5 * _lg(p)
        return _bound((_lg(p) + extra) * a + (p - 1) / p * nbytes * b, work, p, link)
    raise KeyError(algo)


def cost_reduce_scatter(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b, g = _alpha(p, link, True), link.beta, _gamma()
    if algo == "ring":
        per_rank = (p - 1) / p * nbytes * (b + g)
        return _bound((p - 1) * a + per_rank, p * per_rank, p, link)
    if algo == ORDERED:
        return _bound(_ordered_reduce_scatter(nbytes, p, link),
                      (p - 1) * nbytes * (b + g), p, link)
    if algo == "recursive_halving":
        q = _pof2(p)
        fold = 0.0 if q == p else _fold(nbytes, p, link) / 2 + nbytes / p * b
        per_rank = (q - 1) / q * nbytes * (b + g)
        return _bound(_lg(q) * a + per_rank + fold, q * per_rank + fold, p, link)
    raise KeyError(algo)


def cost_gather(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    """Gather and scatter (its mirror image: the same messages, the other way)."""
    a, b = _alpha(p, link, False), link.beta
    if algo == "linear":
        # the root posts every message at once and waits once
        critical = a + (p - 2) * PER_MESSAGE_US * 1e-6 + (p - 1) / p * nbytes * b
        return _bound(critical, (p - 1) / p * nbytes * b, p, link, False)
    if algo == "binomial":
        # Store and forward: the half of the data bound for the far subtree crosses the
        # root's link and then, once staged whole, the next level's (measured: linear wins
        # from a few KiB with 4 ranks); blocks are copied lg(p)/2 times on average.
        work = (p - 1) / p * nbytes * b * max(1.0, _lg(p) / 2)
        critical = _lg(p) * a + (p - 1) / p * nbytes * b + nbytes / 2 * b
        return _bound(critical, work, p, link, False)
    raise KeyError(algo)


def cost_alltoall(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b = _alpha(p, link, True), nbytes / p * link.beta
    if algo == "bruck":
        return math.inf     # needs equal blocks everywhere, which no rank can know: opt-in
    if algo == "scattered":
        blocks = -(-(p - 1) // 32)
        # measured: no slower per byte than the pairwise rounds (4 ranks, 128 KiB-256 MiB)
        return blocks * a + (p - 1) * (PER_MESSAGE_US * 1e-6 + b)
    return (p - 1) * (a + b)


def cost_barrier(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    return _lg(p) * _alpha(p, link, True)


COST_MODELS = {
    "allreduce": cost_allreduce,
    "broadcast": cost_broadcast,
    "reduce": cost_reduce,
    "allgather": cost_allgather,
    "reduce_scatter": cost_reduce_scatter,
    "gather": cost_gather,
    "scatter": cost_gather,
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
                 hierarchy: Hierarchy | None = None) -> None:
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
            raise InvalidArgument(f"{where}: unknown {collective} algorithm {algo!r}; choose one "
                                  "of " + ", ".join(sorted(known)))

    def choose(self, collective: str, nbytes: int, world_size: int, algo: str | None = None,
               ordered: bool = False) -> str:
        """The algorithm for a call: ``algo`` if given, else ``PYCOLL_ALGO``'s, else the
        cheapest. ``ordered``: the call must fold in rank order (``deterministic=True``, or
        half-precision sums accumulated in float32), which only ``ORDERED_ALGORITHMS`` do
        (the cheapest of them is taken); an ordinary call never gets them unasked (they may
        be forced)."""
        ordered = ordered and collective in ORDERED_COLLECTIVES
        if algo is not None:
            self._check(collective, algo, "algo=")
            if ordered and algo not in ORDERED_ALGORITHMS:
                folding = sorted(ORDERED_ALGORITHMS & set(self.registry[collective]))
                raise InvalidArgument(
                    f"algo={algo!r}: {collective} with deterministic=True (or a float16/"
                    "bfloat16 sum accumulated in float32, accumulate='fp32') needs a "
                    f"rank-order fold, which only {', '.join(map(repr, folding))} do; pass "
                    "one of them or leave algo unset (docs/numerics.md)")
            return algo
        names = self.registry[collective]
        if ordered:                   # (PYCOLL_ALGO's choice for the collective does not fold)
            candidates = [name for name in names if name in ORDERED_ALGORITHMS]
        elif collective in self.overrides:
            return self.overrides[collective]
        else:
            candidates = [name for name in names if name not in ORDERED_ALGORITHMS]
        model = COST_MODELS.get(collective)
        if model is None or len(candidates) == 1:
            return candidates[0]
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
            # the node's p cross-node allreduces (one shard each) share its network link
            shard, shared = nbytes / p, replace(self.inter, beta=self.inter.beta * p)
            across = min(cost_allreduce(name, int(shard), self.nodes, shared)
                         for name in ("ring", "recursive_doubling"))
            return inside + across
        if collective == "broadcast":
            inter = self.inter.alpha + nbytes * self.inter.beta
            intra = self.intra.alpha + nbytes * self.intra.beta
            return (math.ceil(math.log2(self.nodes)) * inter
                    + math.ceil(math.log2(self.local)) * intra)
        return math.inf
