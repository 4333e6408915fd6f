"""Which peers share this host, and which transport reaches each peer."""
from __future__ import annotations

import os
import socket

from .errors import InvalidArgument

TRANSPORT_CHOICES = ("auto", "shm", "tcp")


def host_identity() -> str:
    """A string equal for processes on the same host (and kernel), different otherwise.

    ``PYCOLL_HOST_ID`` overrides it, which lets tests declare a virtual node layout on one
    machine (hierarchical algorithms then use shm inside a "node" and tcp between).
    """
    override = os.environ.get("PYCOLL_HOST_ID")
    if override:
        return override
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
