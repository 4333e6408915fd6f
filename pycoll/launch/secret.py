"""The job secret: every multi-rank job is authenticated unless nothing can share a secret.

The secret keys the store's handshake and the proof a rank gives on another rank's data port
(HMAC). Without one, anybody who reaches the store can read a rank's nonce, forge the proof
with the empty key, join as a rank, feed wrong data and post forged abort records. Where it
comes from, best first:

1. ``PYCOLL_TOKEN`` (``python -m pycoll.run`` generates one and hands it to its ranks through
   their environment, never the command line);
2. MPI launchers (mpiexec/mpirun of MPICH or Open MPI) with mpi4py installed: rank 0 draws
   one and broadcasts it over ``MPI.COMM_WORLD`` (the launcher's own channels, not the
   network the store listens on);
3. torchrun (its agent hosts a store: ``TORCHELASTIC_USE_AGENT_STORE``): rank 0 draws one
   and shares it through that store (at MASTER_ADDR:MASTER_PORT). Anyone who can reach that
   store can read it, so this only keeps out strangers who cannot; it is used because nothing
   better exists there, and init says so;
4. none. If every rank runs on this host the store and data ports listen on loopback only
   (``environment.py``); otherwise init logs a loud warning saying what an attacker could do
   and how to set ``PYCOLL_TOKEN``.
"""
from __future__ import annotations

import importlib.util
import secrets
from typing import Any

from .. import debug
from .environment import LaunchInfo, is_loopback

SECRET_KEY = "pycoll/job-secret"


def job_secret(info: LaunchInfo, timeout: float,
               agent: Any = None) -> tuple[str | None, str]:
    """(the secret or None, where it came from) for this job; the same on every rank.
    ``agent``: a client of torchrun's agent store (``agent_store``), when there is one."""
    if info.token:
        return info.token, "PYCOLL_TOKEN"
    if info.world_size < 2:
        return None, "a world of one"
    if info.launcher in ("openmpi", "mpich"):
        token = _through_mpi(info)
        if token is not None:
            return token, "MPI (broadcast over MPI.COMM_WORLD)"
    if agent is not None:
        token = _through_torchrun_store(agent)
        if token is not None:
            return token, "torchrun's store"
    return None, "none"


def _through_mpi(info: LaunchInfo) -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return None
    try:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_size() != info.world_size or comm.Get_rank() != info.rank:
            return None     # an mpi4py built for another MPI: a singleton world, not ours
        return comm.bcast(secrets.token_hex(16) if info.rank == 0 else None, root=0)
    except Exception as e:  # noqa: BLE001 - any MPI trouble: go on without this source
        debug.logger.info("job secret: MPI unavailable (%s)", e)
        return None


def agent_store(timeout: float) -> Any:
    """A client of torchrun's agent store (MASTER_ADDR:MASTER_PORT), or None when this is
    not torchrun with an agent store, torch is missing, or the store does not answer."""
    import os

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None     # torch-style variables without torchrun's agent: no store to ask
    if not host or not port or importlib.util.find_spec("torch") is None:
        return None
    try:
        from datetime import timedelta

        import torch.distributed as dist
        return dist.TCPStore(host, int(port), is_master=False,
                             timeout=timedelta(seconds=min(timeout, 30.0)))
    except Exception as e:  # noqa: BLE001 - no torch store after all: go on without
        debug.logger.info("torchrun's store unavailable (%s)", e)
        return None


def _through_torchrun_store(store: Any) -> str | None:
    try:
        return bytes(store.compare_set(SECRET_KEY, "", secrets.token_hex(16))).decode()
    except Exception as e:  # noqa: BLE001
        debug.logger.info("job secret: torchrun's store unavailable (%s)", e)
        return None


def warn_if_open(info: LaunchInfo, token: str | None, source: str) -> None:
    """Say, loudly, when a job's ports are reachable from the network without a secret, or
    with one that anybody reaching torchrun's store can read."""
    if info.world_size < 2 or info.master_addr is None or is_loopback(info.master_addr):
        return
    if token is None:
        debug.logger.warning(
            "rank %d: this job has no secret (PYCOLL_TOKEN is not set and launcher %r offers "
            "no private channel to share one) and its store listens on %s: anybody who can "
            "reach that address can join as a rank, feed wrong results into collectives and "
            "abort the job. Set the same random PYCOLL_TOKEN for every rank (e.g. "
            "PYCOLL_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')), or "
            "launch with python -m pycoll.run, which does it for you.",
            info.rank, info.launcher, info.master_addr)
    elif source == "torchrun's store" and info.rank == 0:
        debug.logger.warning(
            "rank 0: the job secret is shared through torchrun's store at MASTER_ADDR:"
            "MASTER_PORT (nothing better exists under torchrun): whoever can reach that store "
            "can read it. Set PYCOLL_TOKEN for every rank to keep the job private.")
