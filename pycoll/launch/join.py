"""Joining a job: a process's store, rank, world size and job secret, from whatever started it.

Over MPI (``mpi.bootstrap``: rank 0's store address and the secret travel over an mpi4py
communicator), over torchrun's agent store (``torch_store``: no second port), or from the
launcher's environment (``environment.resolve_launch``) with pycoll's own store, which rank 0
serves unless the launcher already runs one. ``pycoll.init`` calls ``join`` and builds the
world communicator on what it returns.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import PycollError

if TYPE_CHECKING:
    from rendezvous import Store


def join(rank: int | None, world_size: int | None, master_addr: str | None,
          master_port: int | None, seconds: float, comm: Any,
          joining: bool = False) -> tuple[Store | None, int, int, str | None, str | None]:
    """(store, rank, size, job secret, store address) of this process: over MPI, over
    torchrun's agent store, or from the launcher's environment with pycoll's own store.
    ``joining``: a process joining a running job (``init(join=True)``): a client of the
    job's store, never its server, whatever rank the environment names."""
    from .. import fastpath
    from ..envvars import env_tls
    from . import mpi as mpi_boot
    from .environment import launcher_name, resolve_launch
    from .secret import agent_store, job_secret, warn_if_open

    env_tls()    # TLS (PYCOLL_TLS_*): all three files or none, before any socket opens
    fastpath.declare_local_ranks(None)      # until this launcher's environment says more

    if comm is None and rank is None and mpi_boot.should_bootstrap(
            launcher_name(), os.environ, master_addr):
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    if comm is not None:
        r, n, store, token, addr = mpi_boot.bootstrap(comm, seconds)
        return store, r, n, token, addr

    info = resolve_launch(rank=rank, world_size=world_size, master_addr=master_addr,
                          master_port=master_port)
    many = info.world_size > 1 or joining
    # one rank per host (in a job of several): its fast-path probe need not load numba
    fastpath.declare_local_ranks(info.local_world_size if many else None)
    agent = agent_store(seconds) if many and info.launcher == "torchrun" else None
    secret, source = job_secret(info, seconds, agent)
    warn_if_open(info, secret, source)
    if not many:
        return None, info.rank, info.world_size, secret, info.master_addr
    if agent is not None and master_port is None and "PYCOLL_MASTER_PORT" not in os.environ:
        # torchrun's own store: no second port (namespaced by run and restart)
        import torch.distributed as dist

        from .torch_store import TorchStoreAdapter
        run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        adapter = TorchStoreAdapter(dist.PrefixStore(f"pycoll/{run}/{restart}/", agent), seconds)
        return adapter, info.rank, info.world_size, secret, info.master_addr
    if info.master_addr is None or info.master_port is None:
        raise PycollError(f"rank {info.rank}: no rendezvous address for a world of "
                          f"{info.world_size}: set MASTER_ADDR and MASTER_PORT (or pass "
                          "master_addr= and master_port=)")
    from rendezvous import TCPStore

    store = TCPStore(info.master_addr, info.master_port,
                     is_server=info.rank == 0 and not info.store_is_external and not joining,
                     token=secret or "", timeout=seconds)
    return store, info.rank, info.world_size, secret, info.master_addr
