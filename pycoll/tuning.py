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

    @classmethod
    def from_capabilities(cls, caps: Sequence[Capabilities]) -> "LinkModel":
        if not caps:
            return cls(PYTHON_STEP_US * 1e-6, 0.0)
        latency = max(c.latency_us for c in caps)
        bandwidth = min(c.bandwidth_gbps for c in caps)
        return cls((latency + PYTHON_STEP_US) * 1e-6, 1.0 / (bandwidth * 1e9))


def _gamma() -> float:
    return 1.0 / (REDUCE_GBPS * 1e9)


def cost_allreduce(algo: str, nbytes: int, p: int, link: LinkModel) -> float:
    a, b, g = link.alpha, link.beta, _gamma()
    if algo == "ring":
        return 2 * (p - 1) * a + (p - 1) / p * nbytes * (2 * b + g)
    if algo == "recursive_doubling":
        pof2 = 1 << (p.bit_length() - 1)
        fold = 0.0 if pof2 == p else 2 * (a + nbytes * b)
        return math.log2(pof2) * (a + nbytes * (b + g)) + fold
    raise KeyError(algo)


COST_MODELS = {"allreduce": cost_allreduce}


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
                 overrides: dict[str, str] | None = None) -> None:
        self.registry = registry
        self.link = LinkModel.from_capabilities(caps)
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
        return min(candidates, key=lambda name: model(name, nbytes, world_size, self.link))
