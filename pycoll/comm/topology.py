"""Which ranks share a node: host identities, the node layout, hierarchical groups."""
from __future__ import annotations

import os
import socket

from ..errors import InvalidArgument


def host_identity(rank: int | None = None) -> str:
    """A string equal for processes on the same host (and kernel), different otherwise.

    Two overrides declare a virtual node layout on one machine, so hierarchical algorithms
    (shm inside a "node", tcp between nodes) can run in CI: ``PYCOLL_VIRTUAL_NODE_SIZE=k``
    puts world ranks ``[0, k)``, ``[k, 2k)``, ... on separate virtual nodes, and
    ``PYCOLL_HOST_ID`` names this process's node outright.
    """
    override = os.environ.get("PYCOLL_HOST_ID")
    if override:
        return override
    vsize = os.environ.get("PYCOLL_VIRTUAL_NODE_SIZE")
    if vsize and rank is not None:
        if not vsize.isdigit() or int(vsize) < 1:
            raise InvalidArgument(f"PYCOLL_VIRTUAL_NODE_SIZE={vsize!r} must be a positive integer")
        return f"virtual-node-{rank // int(vsize)}"
    return machine_identity()


def machine_identity() -> str:
    """The real machine (hostname and boot id), whatever virtual layout is declared."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def node_layout(hosts: list[str]) -> list[tuple[int, int]]:
    """(node index, local index) of every rank; nodes numbered by their lowest rank."""
    nodes: dict[str, int] = {}
    local_counts: dict[str, int] = {}
    layout = []
    for host in hosts:
        node = nodes.setdefault(host, len(nodes))
        local = local_counts.get(host, 0)
        local_counts[host] = local + 1
        layout.append((node, local))
    return layout


def is_uniform(layout: list[tuple[int, int]]) -> bool:
    """True when there are several nodes, each with the same number (> 1) of ranks."""
    counts: dict[int, int] = {}
    for node, _ in layout:
        counts[node] = counts.get(node, 0) + 1
    sizes = set(counts.values())
    return len(counts) > 1 and len(sizes) == 1 and sizes.pop() > 1


def hierarchy_members(layout: list[tuple[int, int]], rank: int, kind: str) -> list[int]:
    """The ranks of ``rank``'s node in local order (``"node"``), or the ranks with its local
    index on every node in node order (``"cross"``): the two levels of a hierarchical
    collective, known to every rank from the layout alone (no exchange needed)."""
    node, local = layout[rank]
    if kind == "node":
        ranks = [r for r, (n, _) in enumerate(layout) if n == node]
        return sorted(ranks, key=lambda r: layout[r][1])
    ranks = [r for r, (_, lo) in enumerate(layout) if lo == local]
    return sorted(ranks, key=lambda r: layout[r][0])


def ring_crossings(layout: list[tuple[int, int]]) -> int:
    """How many edges of a ring in rank order leave the busiest node: 1 when each node's
    ranks are consecutive (block placement), up to the ranks per node when they are dealt
    round-robin (cyclic placement). Those edges share the node's network link."""
    size = len(layout)
    leaving: dict[int, int] = {}
    for r in range(size):
        node, nxt = layout[r][0], layout[(r + 1) % size][0]
        if node != nxt:
            leaving[node] = leaving.get(node, 0) + 1
    return max(leaving.values(), default=1)
