"""The cost model's choices for a job of ``-n`` ranks on this host's transports.

The table is what ``Selector.choose`` answers for a communicator built the way
``comm.communicator`` builds one: the transports in use are those ``registry.choose`` picks
for a pair on one node and, with several nodes, for a pair across nodes (from this host's
probe records, as if every host were like this one); several equal nodes add the two-level
``Hierarchy`` model with the transports' declared links. A real job on several nodes may
then measure the links (``PYCOLL_LINK_PROBE``) and the one-host fast path takes small calls
before the selector is asked; both are said in the output, not modelled.
"""
from __future__ import annotations

from typing import Any

from ..algorithms import ALGORITHMS
from ..algorithms.cost import Hierarchy, LinkModel
from ..algorithms.selection import Selector
from ..errors import InvalidArgument
from ..transports import registry
from ..transports.base import PeerInfo

#: 8 B, then 16 B to 256 MiB by powers of 4
SIZES = [8] + [4 ** k for k in range(2, 15)]


def _peer(rank: int, host: str, records: dict[str, Any]) -> PeerInfo:
    return PeerInfo(rank=rank, host=host, machine=host, records=records)


def layout(ranks: int, nodes: int | None, per_node: int | None) -> tuple[int, int]:
    """(nodes, ranks per node) from ``-n`` and one of ``--nodes`` / ``--ranks-per-node``."""
    if ranks < 1:
        raise InvalidArgument(f"-n {ranks}: a job has at least 1 rank")
    if nodes is not None and per_node is not None:
        raise InvalidArgument("give --nodes or --ranks-per-node, not both")
    if per_node is not None:
        if per_node < 1 or ranks % per_node:
            raise InvalidArgument(f"-n {ranks} ranks do not split into equal nodes of "
                                  f"{per_node}")
        nodes = ranks // per_node
    nodes = 1 if nodes is None else nodes
    if nodes < 1 or ranks % nodes:
        raise InvalidArgument(f"-n {ranks} ranks do not split into {nodes} equal nodes")
    return nodes, ranks // nodes


def table(ranks: int, nodes: int | None = None, per_node: int | None = None
          ) -> dict[str, Any]:
    """{layout, transports, notes, sizes, choices: {collective: [algorithm per size]}}."""
    nodes, local = layout(ranks, nodes, per_node)
    order = registry.allowed_transports()
    records, _missing = registry.probe_all(order)
    here, same_node, other_node = (_peer(0, "a", records), _peer(1, "a", records),
                                   _peer(2, "b", records))
    intra = registry.choose(here, same_node, order) if local > 1 else None
    inter = registry.choose(here, other_node, order) if nodes > 1 else None
    if (local > 1 and intra is None) or (nodes > 1 and inter is None):
        raise InvalidArgument(f"no allowed transport ({', '.join(order)}) connects the ranks "
                              "of this layout here: see the transports section")
    in_use = [name for name in (intra, inter) if name is not None]
    caps = [registry.transport_class(name).capabilities for name in in_use]
    hierarchy = None
    if nodes > 1 and local > 1 and intra and inter:
        hierarchy = Hierarchy(nodes, local,
                              LinkModel.from_capabilities([caps[0]]),
                              LinkModel.from_capabilities([caps[1]]))
    selector = Selector(ALGORITHMS, caps, hierarchy=hierarchy)
    choices = {coll: [selector.choose(coll, size, ranks) for size in SIZES]
               for coll in ALGORITHMS}
    notes = ["non-deterministic calls (deterministic=True picks among the ordered "
             "algorithms)"]
    if selector.overrides:
        notes.append("PYCOLL_ALGO forces " + ", ".join(f"{c}={a}" for c, a in
                                                     sorted(selector.overrides.items())))
    if hierarchy is not None:
        notes.append("declared links; a job measures them at init unless PYCOLL_LINK_PROBE=0")
    if nodes == 1 and ranks > 1:
        notes.append("small allreduce/broadcast may take the fast path first (see above)")
    return {"ranks": ranks, "nodes": nodes, "ranks_per_node": local,
            "transports": {"intra_node": intra, "inter_node": inter}, "notes": notes,
            "sizes": SIZES, "choices": choices}
