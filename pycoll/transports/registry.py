"""The transport registry: which transports exist, and which one serves each pair of ranks.

Adding a transport is one folder (``transport.py`` with the ``Transport`` shape: ``probe``,
``can_connect``, ``address``, ``connect``, ``progress``...; ``channel.py``) plus one line in
``REGISTRY``; what pycoll does around it follows from its ``Capabilities`` and hooks
(``sweep_leftovers``, ``details``), never from its name. The order of
``REGISTRY`` is the default preference; ``PYCOLL_TRANSPORTS`` (an ordered allow-list, like
UCX_TLS or NCCL_NET) replaces it.

The choice for a pair is made from data every rank has after the bootstrap exchange (each
rank's host, machine and probe records), with rules that are symmetric by construction: the
first transport in the order that both ranks published and whose ``can_connect`` holds. So
every rank computes the same transport for every pair, and therefore the same cost model and
the same algorithms (ranks that disagreed would run different message patterns and hang).
"""
from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Any

from ..envvars import env_list
from ..errors import InvalidArgument, TransportError
from . import bitflip
from .base import Capabilities, Channel, PeerInfo, Transport

#: name -> (module, class), in default order of preference
REGISTRY: dict[str, tuple[str, str]] = {
    # shm plus device memory GPU to GPU; usable only where CuPy sees a GPU (else shm serves)
    "cuda_ipc": ("pycoll.transports.cuda_ipc.transport", "CudaIpcTransport"),
    "shm": ("pycoll.transports.shm.transport", "ShmTransport"),
    "verbs": ("pycoll.transports.verbs.transport", "VerbsTransport"),
    "tcp": ("pycoll.transports.tcp.transport", "TcpTransport"),
    "inproc": ("pycoll.transports.inproc.transport", "InprocTransport"),
}


def transport_class(name: str) -> type[Transport]:
    """The class of transport ``name``; the first call also reads the bit-flip test hook's
    ``PYCOLL_TEST_FLIP`` (``bitflip.py``: nothing changes while it is unset)."""
    Channel.recv_request = bitflip.receive_request()
    module, cls = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def capabilities(name: str) -> Capabilities | None:
    """The declared capabilities of transport ``name``; None when its module cannot be
    imported here (a missing dependency: such a transport probes unusable anyway)."""
    try:
        return transport_class(name).capabilities
    except ImportError:
        return None


def in_process() -> list[str]:
    """The transports that connect threads of one process (``Capabilities.in_process``):
    chosen only when named, and what ``testing.run_threads`` runs its ranks over."""
    return [n for n in REGISTRY if (c := capabilities(n)) is not None and c.in_process]


def sweep_leftovers(pids: Iterable[int] | None = None) -> list[str]:
    """Every transport's ``sweep_leftovers`` (once per implementation: a transport built on
    another one inherits its sweep); what was removed."""
    pids = None if pids is None else list(pids)
    removed: list[str] = []
    seen = set()
    for name in REGISTRY:
        try:
            sweep = transport_class(name).sweep_leftovers
        except ImportError:
            continue
        key = getattr(sweep, "__func__", sweep)
        if key not in seen:
            seen.add(key)
            removed += sweep(pids)
    return removed


def allowed_transports() -> list[str]:
    """The ordered allow-list from ``PYCOLL_TRANSPORTS``."""
    names = env_list("PYCOLL_TRANSPORTS")
    if names is None:
        explicit = in_process()
        return [n for n in REGISTRY if n not in explicit]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names:
        raise InvalidArgument(f"PYCOLL_TRANSPORTS={','.join(names)!r}: unknown transport(s) "
                              f"{unknown}; known: {', '.join(REGISTRY)}")
    return names


def probe_all(names: Sequence[str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Probe every allowed transport here: (records of the usable ones, why the others not)."""
    records: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for name in names:
        try:
            record, reason = transport_class(name).probe()
        except ImportError as e:
            record, reason = None, f"its module cannot be imported ({e})"
        if record is None:
            missing[name] = reason
        else:
            records[name] = record
    return records, missing


def choose(a: PeerInfo, b: PeerInfo, order: Sequence[str]) -> str | None:
    """The transport for the pair (a, b): the same answer for (b, a) on any rank."""
    for name in order:
        if name in a.records and name in b.records and transport_class(name).can_connect(a, b):
            return name
    return None


def no_transport(a: PeerInfo, b: PeerInfo, order: Sequence[str],
                 missing: dict[str, str]) -> TransportError:
    """The error for a pair no allowed transport can serve, saying what is missing."""
    why = []
    for name in order:
        if name not in a.records:
            why.append(f"{name} is not usable on rank {a.rank}"
                       + (f" ({missing[name]})" if name in missing else ""))
        elif name not in b.records:
            why.append(f"{name} is not usable on rank {b.rank}")
        else:
            where = "hosts" if a.host != b.host else "processes"
            why.append(f"{name} cannot connect ranks on different {where} "
                       f"({a.host} and {b.host})")
    return TransportError(
        f"rank {a.rank} cannot reach rank {b.rank} with the allowed transports "
        f"{', '.join(order)}: {'; '.join(why)}. Allow another transport with PYCOLL_TRANSPORTS "
        f"(e.g. PYCOLL_TRANSPORTS=shm,tcp)", peer=b.rank)
