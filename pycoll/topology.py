"""Which peers share this host, and which transport reaches each peer."""
from __future__ import annotations

import os
import socket

from .errors import InvalidArgument

TRANSPORT_CHOICES = ("auto", "shm", "tcp")


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


def transport_choice() -> str:
    choice = os.environ.get("PYCOLL_TRANSPORT", "auto").lower() or "auto"
    if choice not in TRANSPORT_CHOICES:
        raise InvalidArgument(f"PYCOLL_TRANSPORT={choice!r}: choose one of "
                              + ", ".join(TRANSPORT_CHOICES))
    return choice


def assign_transports(rank: int, hosts: list[str], choice: str) -> dict[int, str]:
    """Map every other rank to the name of the transport that reaches it."""
    mine = hosts[rank]
    result = {}
    for peer, host in enumerate(hosts):
        if peer == rank:
            continue
        same_host = host == mine
        if choice == "tcp" or not same_host:
            if choice == "shm":
                raise InvalidArgument(
                    f"PYCOLL_TRANSPORT=shm, but rank {peer} runs on another host ({host}); "
                    "shared memory only reaches ranks on this host: unset PYCOLL_TRANSPORT")
            result[peer] = "tcp"
        else:
            result[peer] = "shm"
    return result


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
