"""``pycoll.launch.launch``: run N ranks of a Python program on this host, with their store.

The Python API behind ``python -m pycoll.run`` (whose command line is ``cli.py``). The
launcher process runs the job's rendezvous store (``rendezvous.StoreServer``, with a fresh job
token), gives every rank its environment (the PYCOLL_* variables and torchrun's), and hands
the ranks to a ``Supervisor`` (``supervisor.py``: spawning, signals, tear-down, exit codes).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping, Sequence

from .elastic_policy import ElasticPolicy
from .supervisor import EXIT_TIMEOUT, GRACE_PERIOD, Supervisor

__all__ = ["launch", "EXIT_TIMEOUT", "GRACE_PERIOD"]


def _connect_host(bind_host: str) -> str:
    """The address ranks use to reach a server bound to ``bind_host``."""
    if bind_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind_host == "::":
        return "::1"
    return bind_host


def _free_port(host: str) -> int:
    """A port that is free on ``host`` right now (for torch's TCPStore, not ours)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
    except socket.gaierror:
        family, addr = socket.AF_INET, ("127.0.0.1", 0)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(addr)
        return s.getsockname()[1]


def _check_arguments(command: list[str], nprocs: int, timeout: float | None, nnodes: int,
                     node_rank: int, token: str | None, master_port: int, elastic: bool,
                     min_ranks: int, max_restarts: int) -> None:
    if not command:
        raise ValueError("launch: command is empty (expected e.g. ['script.py'] or "
                         "['-m', 'module'])")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"launch: nprocs must be a positive integer, got {nprocs!r}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"launch: timeout must be positive, got {timeout!r}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"launch: node_rank {node_rank} is not in [0, {nnodes})")
    if elastic and (isinstance(min_ranks, bool) or not isinstance(min_ranks, int)
                    or not 1 <= min_ranks <= nprocs * nnodes):
        raise ValueError(f"launch: min_ranks must be an integer in [1, {nprocs * nnodes}] "
                         f"(nprocs x nnodes), got {min_ranks!r}")
    if not elastic and min_ranks != 1:
        raise ValueError(f"launch: min_ranks={min_ranks!r} applies to elastic jobs only: "
                         "pass elastic=True too")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"launch: max_restarts must be an integer >= 0, got {max_restarts!r}")
    if not elastic and max_restarts:
        raise ValueError(f"launch: max_restarts={max_restarts!r} applies to elastic jobs only: "
                         "pass elastic=True too")
    from ..envvars import env_tls
    env_tls()    # TLS: all three files or none, said before a store or a rank starts
    if nnodes > 1 and (not token or not master_port):
        raise ValueError(
            "launch: a job on several hosts needs the same secret and store port on every "
            "node's launcher: export PYCOLL_TOKEN (e.g. $(python -c 'import secrets; "
            "print(secrets.token_hex(16))'), shared the way you share the job's files) and "
            "pass --master-port")


def _rank_environment(base: Mapping[str, str], *, rank: int, world: int, local: int,
                      nprocs: int, node_rank: int, host: str, store_port: int,
                      torch_port: int, token: str, elastic: bool) -> dict[str, str]:
    """``base`` plus what tells a rank its place in the job and where the store is."""
    env = dict(base)
    for inherited in ("PYCOLL_ELASTIC", "PYCOLL_JOIN", "PYCOLL_REPLACES"):
        env.pop(inherited, None)             # this launcher's mode, not an outer job's
    if elastic:
        env["PYCOLL_ELASTIC"] = "1"
    env.update({
        "PYCOLL_RANK": str(rank),
        "PYCOLL_WORLD_SIZE": str(world),
        "PYCOLL_LOCAL_RANK": str(local),
        "PYCOLL_LOCAL_WORLD_SIZE": str(nprocs),
        "PYCOLL_MASTER_ADDR": host,
        "PYCOLL_MASTER_PORT": str(store_port),
        "PYCOLL_STORE_EXTERNAL": "1",
        "PYCOLL_TOKEN": token,
        # torchrun-compatible; MASTER_PORT is a *different* free port, for torch's own
        # TCPStore (env:// init), since ours already holds PYCOLL_MASTER_PORT.
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": str(node_rank),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(torch_port),
    })
    return env


def launch(
    command: Sequence[str],
    nprocs: int,
    *,
    prefix_output: bool = False,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int = 0,
    grace_period: float = GRACE_PERIOD,
    nnodes: int = 1,
    node_rank: int = 0,
    token: str | None = None,
    elastic: bool = False,
    min_ranks: int = 1,
    max_restarts: int = 0,
) -> int:
    """Run ``sys.executable *command`` as ``nprocs`` ranks on this host; return the exit code.

    ``command`` is the argv after the interpreter: ``["script.py", "arg"]`` or
    ``["-m", "pycoll.bench", "allreduce"]``. ``env`` is the base environment of the ranks
    (default: ``os.environ``); the launcher adds the PYCOLL_* and torchrun-style variables.
    The store listens on ``master_addr:master_port`` (port 0: any free port).

    Returns 0 when every rank exits 0; otherwise the first failing rank's exit code
    (128 + signal number if it was killed), 124 on timeout, 128 + signal number when the
    launcher itself received SIGINT/SIGTERM.

    Several hosts (``nnodes`` > 1): one launcher per host, each with its ``node_rank``, the
    same ``nprocs``, ``master_addr:master_port`` (node 0's store, which node 0's launcher
    hosts) and ``token`` (the job secret, from each launcher's environment; see ``nodes.py``).
    Ranks are numbered across hosts; a failing rank on any host ends the job on every host.

    ``elastic``: a rank that fails is lost, not the job's end, while at least ``min_ranks``
    ranks still run (``elastic_policy.py``); the ranks get ``PYCOLL_ELASTIC=1``. Every rank
    ended: 0 when every rank that was not lost exited 0, else the first such failure's
    code; fewer than ``min_ranks`` left: tear-down, the failing rank's code.
    ``max_restarts`` (elastic): up to that many lost ranks are replaced by a new process
    that joins the job (``PYCOLL_JOIN=1``) once the survivors call ``grow``. On several
    hosts ``min_ranks`` and ``max_restarts`` are the whole job's, a host whose launcher is
    lost loses its ranks (node 0 starts their replacements), and node 0's exit code is the
    job's (``nodes.py``).
    """
    command = list(command)
    _check_arguments(command, nprocs, timeout, nnodes, node_rank, token, master_port, elastic,
                     min_ranks, max_restarts)

    import rendezvous  # imported here so that `import pycoll.launch` stays cheap

    token = token or secrets.token_hex(16)
    server = None
    if node_rank == 0:
        server = rendezvous.StoreServer(master_addr, master_port, token=token)
        server.start()
    supervisor = Supervisor(nprocs, grace_period, first_rank=node_rank * nprocs, server=server)
    try:
        host = _connect_host(master_addr)
        store_port = int(server.port) if server is not None else master_port
        torch_port = _free_port(host) if node_rank == 0 else None
        while torch_port == store_port:  # pragma: no cover - port 0 never returns a bound port
            torch_port = _free_port(host)
        job = None
        if nnodes > 1:
            from .nodes import ElasticJob, JobControl
            supervisor.control = JobControl(host, store_port, token, node_rank, nnodes,
                                            elastic=elastic)
            torch_port = supervisor.control.torch_port(torch_port)
            job = ElasticJob(supervisor.control, nprocs, max_restarts) if elastic else None
        if elastic:
            supervisor.elastic = ElasticPolicy(nprocs, min_ranks, first_rank=node_rank * nprocs,
                                               max_restarts=max_restarts, job=job,
                                               world=nprocs * nnodes)
        assert torch_port is not None       # node 0 picked it; the others learnt it above

        base = dict(os.environ if env is None else env)
        # the ranks write into pipes: without this their lines would wait in Python's buffer
        # (and die with a killed rank) instead of showing up as printed
        base.setdefault("PYTHONUNBUFFERED", "1")
        envs = [_rank_environment(base, rank=node_rank * nprocs + local,
                                  world=nnodes * nprocs, local=local, nprocs=nprocs,
                                  node_rank=node_rank, host=host, store_port=store_port,
                                  torch_port=torch_port, token=token, elastic=elastic)
                for local in range(nprocs)]
        supervisor.start(command, envs, prefix_output)
        return supervisor.watch(timeout)
    finally:
        try:
            supervisor.close()
        finally:
            if server is not None:
                try:
                    server.close()
                except Exception:  # pragma: no cover
                    pass
