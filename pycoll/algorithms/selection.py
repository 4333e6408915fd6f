"""Algorithm selection: the cheapest applicable algorithm of the table
(``ALGORITHMS``, ``__init__.py``), overridable per call and per job.

Each algorithm's record declares its cost and when it applies (``cost.py``); choosing is
taking the cheapest of a collective's records, ties to the first in the table's order. The
choice is pure arithmetic on (collective, bytes, world size, the transports in use), the
same on every rank. Overrides: ``algo=`` on a call, or
``PYCOLL_ALGO="allreduce=ring,broadcast=pipeline"`` for the job.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..errors import InvalidArgument
from ..transports.base import Capabilities
from . import ALGORITHMS
from .cost import Algorithm, Hierarchy, LinkModel, Network, WireFormat

#: the names of the algorithms that fold in rank order (``ordered.py``): what
#: deterministic calls run
ORDERED_ALGORITHMS = frozenset(a.name for table in ALGORITHMS.values()
                               for a in table.values() if a.ordered)


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
    """Chooses an algorithm per call from ``registry`` (``ALGORITHMS``); remembers the
    job-wide overrides and the network the costs see."""

    def __init__(self, registry: Mapping[str, Mapping[str, Algorithm]],
                 caps: Sequence[Capabilities], overrides: dict[str, str] | None = None,
                 hierarchy: Hierarchy | None = None) -> None:
        self.registry = registry
        self.link = LinkModel.from_capabilities(caps)
        self.hierarchy = hierarchy
        self.overrides = dict(overrides if overrides is not None
                              else parse_overrides(os.environ.get("PYCOLL_ALGO")))
        for coll, algo in self.overrides.items():
            self._check(coll, algo, "PYCOLL_ALGO")
            if getattr(self.registry[coll][algo], "compressed", False):
                raise InvalidArgument(f"PYCOLL_ALGO: {coll}={algo} moves a compressed wire "
                                      "format, which only compress= (or PYCOLL_COMPRESS) "
                                      "asks for")

    def _check(self, collective: str, algo: str, where: str) -> None:
        known = self.registry.get(collective)
        if known is None:
            raise InvalidArgument(f"{where}: unknown collective {collective!r}; known: "
                                  + ", ".join(sorted(self.registry)))
        if algo not in known:
            raise InvalidArgument(f"{where}: unknown {collective} algorithm {algo!r}; choose one "
                                  "of " + ", ".join(sorted(known)))

    def choose(self, collective: str, nbytes: int, world_size: int, algo: str | None = None,
               ordered: bool = False, wire: WireFormat | None = None) -> str:
        """The algorithm for a call: ``algo`` if given, else ``PYCOLL_ALGO``'s, else the
        cheapest that applies. ``ordered``: the call must fold in rank order
        (``deterministic=True``, or half-precision sums accumulated in float32), which only
        the records marked ``ordered`` do (the cheapest of them is taken); an ordinary call
        never gets them unasked (they may be forced). ``wire``: a compressed call
        (``compress=``: its format's ratio and codec speed), which only the records marked
        ``compressed`` serve (they fold in rank order by construction); other calls never
        get them."""
        if algo is not None:
            self._check(collective, algo, "algo=")
        table = self.registry[collective]
        if wire is not None or (algo is not None and table[algo].compressed):
            return self._compressed(collective, table, nbytes, world_size, algo, wire)
        ordered = ordered and any(a.ordered for a in table.values())
        if algo is not None:
            if ordered and not table[algo].ordered:
                folding = sorted(name for name, a in table.items() if a.ordered)
                raise InvalidArgument(
                    f"algo={algo!r}: {collective} with deterministic=True (or a float16/"
                    "bfloat16 sum accumulated in float32, accumulate='fp32') needs a "
                    f"rank-order fold, which only {', '.join(map(repr, folding))} do; pass "
                    "one of them or leave algo unset (docs/numerics.md)")
            return algo
        if not ordered and collective in self.overrides:
            # (PYCOLL_ALGO's choice for the collective does not fold: ordered calls skip it)
            return self.overrides[collective]
        network = self.network()
        candidates = [a for a in table.values()
                      if a.ordered == ordered and not a.compressed and a.applies(network)]
        if len(candidates) == 1:
            return candidates[0].name
        return min(candidates, key=lambda a: a.cost(nbytes, world_size, network)).name

    def _compressed(self, collective: str, table: Mapping[str, Algorithm], nbytes: int,
                    world_size: int, algo: str | None, wire: WireFormat | None) -> str:
        names = sorted(name for name, a in table.items() if a.compressed)
        if wire is None:
            raise InvalidArgument(f"algo={algo!r}: {collective}'s {algo!r} moves a compressed "
                                  "wire format: pass compress= (docs/numerics.md)")
        if not names:
            raise InvalidArgument(f"{collective} has no compressed algorithm: compress= "
                                  "applies to allreduce, reduce_scatter, allgather and "
                                  "broadcast")
        if algo is not None and algo not in names:
            raise InvalidArgument(
                f"algo={algo!r}: {collective} with compress= runs "
                f"{', '.join(map(repr, names))} only; pass it or leave algo unset "
                "(docs/numerics.md)")
        if algo is not None or len(names) == 1:
            return algo or names[0]
        network = replace(self.network(), wire=wire)
        return min((table[n] for n in names),
                   key=lambda a: a.cost(nbytes, world_size, network)).name

    def compression_pays(self, collective: str, nbytes: int, world_size: int,
                         wire: WireFormat) -> bool:
        """Whether the model expects the compressed call to be faster than the cheapest
        uncompressed algorithm on these links (the rank-order folds included: they run in
        the compressed ones' rounds, so only the bytes and the codec make the difference).
        Never acted on by itself: compression changes the result, so only the user switches
        it on; tools report it."""
        table = self.registry[collective]
        network = self.network()
        plain = min(a.cost(nbytes, world_size, network) for a in table.values()
                    if not a.compressed and a.applies(network))
        squeezed = replace(network, wire=wire)
        return min(a.cost(nbytes, world_size, squeezed) for a in table.values()
                   if a.compressed) < plain

    def network(self) -> Network:
        """What the costs see of the links (read each time: tools set ``link``)."""
        return Network(self.link, self.hierarchy)

    def cost(self, collective: str, algo: str, nbytes: int, world_size: int) -> float:
        """Modelled seconds; infinite for an algorithm the model may not pick here."""
        record = self.registry[collective][algo]
        network = self.network()
        if not record.applies(network):
            return math.inf
        return record.cost(nbytes, world_size, network)
