"""Measured links for the cost model: a short probe at init on jobs that span several nodes.

A transport's declared latency and bandwidth say what the hardware could do, not what this
job gets: a 100 Gbit NIC shaped to 2 Gbit, a congested switch, TCP over a slow VPN. What
decides between a flat ring and a hierarchical algorithm is the ratio of the links inside a
node to those between nodes, so ``probe_links`` measures both once, when a communicator of
several equal nodes is created:

* rank 0 and the next rank of its node (shared memory, usually), then rank 0 and the first
  rank of node 1 (the network): 8-byte round trips (alpha: half the median round trip) and a
  stream of ``PROBE_BYTES`` acknowledged once (beta: seconds per byte);
* rank 0 publishes the numbers through the store, so every rank builds the same cost model
  (ranks that chose differently would run different algorithms and deadlock).

It costs one store round for everybody and, for the two pairs, ~10 round trips plus
``PROBE_BYTES`` one way: ~50 ms on a 2 Gbit/s link. ``PYCOLL_LINK_PROBE=0`` turns it off
(the declared numbers are used); ``PYCOLL_INTER_NODE_GBPS`` / ``PYCOLL_INTER_NODE_LATENCY_US``
declare the network instead of measuring it.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rendezvous import Store

from ..envvars import env_bool, env_float
from ..errors import PycollError
from ..tags import collective_tag, tag_low_bits
from ..timeouts import watched_multi_get

#: bytes streamed one way to measure a link's bandwidth
PROBE_BYTES = 8 << 20
#: the stream's message size
PROBE_MESSAGE = 1 << 20
#: timed 8-byte round trips (after two untimed ones)
ROUND_TRIPS = 10


@dataclass(frozen=True)
class Measured:
    """One link: latency of a primitive step (seconds) and seconds per byte."""

    alpha: float
    beta: float

    @property
    def gbps(self) -> float:
        return 1e-9 / self.beta if self.beta > 0 else float("inf")


def declared_inter_node() -> Measured | None:
    """``PYCOLL_INTER_NODE_GBPS`` (GB/s) and ``PYCOLL_INTER_NODE_LATENCY_US``, if set."""
    gbps = env_float("PYCOLL_INTER_NODE_GBPS", 0.0, minimum=0.0)
    if gbps <= 0:
        return None
    latency = env_float("PYCOLL_INTER_NODE_LATENCY_US", 50.0, minimum=0.0)
    return Measured(latency * 1e-6, 1.0 / (gbps * 1e9))


def enabled() -> bool:
    return env_bool("PYCOLL_LINK_PROBE", True)


def _measure(peers: Any, peer: int, leader: bool, tag: int) -> Measured | None:
    """Round trips, then a one-way stream acknowledged once, between this rank and ``peer``;
    the leader returns the numbers, the other side only answers."""
    small = np.zeros(1, dtype=np.float64)
    trips = []
    for i in range(ROUND_TRIPS + 2):
        start = time.perf_counter()
        if leader:
            peers.wait([peers.isend(peer, small, tag)])
            peers.wait([peers.irecv(peer, small, tag)])
        else:
            peers.wait([peers.irecv(peer, small, tag)])
            peers.wait([peers.isend(peer, small, tag)])
        if i >= 2:
            trips.append(time.perf_counter() - start)
    block = np.zeros(PROBE_MESSAGE // 8, dtype=np.float64)
    count = PROBE_BYTES // PROBE_MESSAGE
    start = time.perf_counter()
    if leader:
        peers.wait([peers.isend(peer, block, tag) for _ in range(count)])
        peers.wait([peers.irecv(peer, small, tag)])
    else:
        for _ in range(count):
            peers.wait([peers.irecv(peer, block, tag)])
        peers.wait([peers.isend(peer, small, tag)])
    stream = time.perf_counter() - start
    if not leader:
        return None
    alpha = statistics.median(trips) / 2
    beta = max(stream - 2 * alpha, 1e-9) / (count * PROBE_MESSAGE)
    return Measured(alpha, beta)


def probe_links(peers: Any, store: Store, rank: int, layout: list[tuple[int, int]],
                comm_id: int, timeout: float,
                watch: Callable[[], None] | None = None) -> dict[str, Measured]:
    """Measure (rank 0) or wait for (everyone else) the intra- and inter-node links of a
    layout of several equal nodes; every rank returns the same numbers. ``store``: this
    communicator's scoped store; ``peers``: its primitives (deadline set here); ``watch``:
    see ``timeouts.watched_multi_get``."""
    tag = collective_tag(0, tag_low_bits("link_probe", comm_id), 0)
    local_peer = next(r for r, (n, lo) in enumerate(layout) if n == layout[0][0] and lo == 1)
    remote_peer = next(r for r, (n, lo) in enumerate(layout) if n == 1 and lo == 0)
    declared = declared_inter_node()
    peers.deadline = time.monotonic() + timeout
    found: dict[str, Measured | None] = {}
    try:
        if rank in (0, local_peer):
            found["intra"] = _measure(peers, local_peer if rank == 0 else 0, rank == 0, tag)
        if declared is None and rank in (0, remote_peer):
            found["inter"] = _measure(peers, remote_peer if rank == 0 else 0, rank == 0, tag)
    except PycollError as e:
        if rank == 0:    # the others wait for rank 0's word: tell them, do not let them wait
            store.set("link_probe", json.dumps({"error": str(e)}))
        raise
    finally:
        peers.posted.clear()
    if rank == 0:
        result = {k: [v.alpha, v.beta] for k, v in found.items() if v is not None}
        store.set("link_probe", json.dumps(result))
    else:
        result = json.loads(watched_multi_get(store, ["link_probe"], timeout, watch)[0])
        if "error" in result:
            raise PycollError(f"rank {rank}: measuring the links at init failed on rank 0: "
                              f"{result['error']} (PYCOLL_LINK_PROBE=0 skips the measurement)")
    links = {k: Measured(*v) for k, v in result.items()}
    if declared is not None:
        links["inter"] = declared
    return links
