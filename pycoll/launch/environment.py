"""Launch-environment detection: who started this process, and as which rank?

``detect_launch()`` reads the environment left by one of the launchers pycoll understands and
returns a :class:`LaunchInfo`; ``resolve_launch()`` does the same but lets explicit arguments
(those of ``pycoll.init``) override what the environment says, then validates the result.

Sources, highest priority first (the first launcher whose marker variable is present wins):

=========  ==================================  ==========================================
launcher   marker / rank & size variables      local rank & local size
=========  ==================================  ==========================================
pycoll     PYCOLL_RANK, PYCOLL_WORLD_SIZE      PYCOLL_LOCAL_RANK, PYCOLL_LOCAL_WORLD_SIZE
torchrun   RANK, WORLD_SIZE                    LOCAL_RANK, LOCAL_WORLD_SIZE
openmpi    OMPI_COMM_WORLD_RANK / _SIZE        OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE
mpich      PMI_RANK, PMI_SIZE                  MPI_LOCALRANKID, MPI_LOCALNRANKS
slurm      SLURM_PROCID, SLURM_NTASKS          SLURM_LOCALID, SLURM_NTASKS_PER_NODE
none       (nothing set)                       world size 1, rank 0
=========  ==================================  ==========================================

``srun --mpi=pmi2`` (PMI_* agreeing with SLURM_*) counts as Slurm. Variables of launchers
pycoll does not read (``HOROVOD_*``) are an error, not a world of one. ``PMIX_RANK`` alone (a
PMIx launcher: prterun, Open MPI 5) has no world size: ``init()`` bootstraps over MPI then.

Store address rules (the store is pycoll's rendezvous server, not torch's TCPStore):

* ``PYCOLL_MASTER_ADDR`` / ``PYCOLL_MASTER_PORT`` always win over the launcher's variables.
* pycoll (``python -m pycoll.run``): the launcher already runs the store at
  PYCOLL_MASTER_ADDR:PYCOLL_MASTER_PORT (``PYCOLL_STORE_EXTERNAL=1``).
* torchrun: torch's own TCPStore already listens on MASTER_PORT, so pycoll's store (embedded in
  rank 0) uses ``MASTER_PORT + 1`` unless PYCOLL_MASTER_PORT says otherwise.
* Slurm on several nodes: the first host of the step's node list, port ``15000 + job id %
  10000``, unless MASTER_ADDR / MASTER_PORT are set (``slurm.py``); a batch script run without
  srun is an error at once instead of a rank 0 waiting for ranks that never start.
* Open MPI, MPICH, Slurm and explicit arguments: MASTER_ADDR / MASTER_PORT, port default 29500.
  These launchers do not say where rank 0 runs; when every rank is on this host (local size ==
  world size) the address defaults to 127.0.0.1, otherwise it must be given explicitly.
* ``PYCOLL_STORE_EXTERNAL=1`` with any launcher means "a store is already running there (e.g.
  ``python -m rendezvous serve``); rank 0 must not start one".

Errors are :class:`pycoll.InvalidArgument` (a ``ValueError``) naming the variable or argument and
the launcher detected. Apart from that exception class this module uses only the standard
library, so it is cheap to import and can be loaded on its own (it then raises ``ValueError``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

try:  # pycoll.InvalidArgument (a ValueError); plain ValueError when loaded on its own
    from ..errors import InvalidArgument as _InvalidArgument
    _LaunchError: type[ValueError] = _InvalidArgument
except ImportError:  # pragma: no cover - exercised by the standalone-load test
    _LaunchError = ValueError

__all__ = [
    "LaunchInfo",
    "detect_launch",
    "resolve_launch",
    "DEFAULT_MASTER_PORT",
    "LAUNCHERS",
]

#: Port of the store when a launcher gives none (MPI, Slurm, explicit rank/world size).
DEFAULT_MASTER_PORT = 29500

#: Every value ``LaunchInfo.launcher`` can take.
LAUNCHERS = ("pycoll", "torchrun", "openmpi", "mpich", "slurm", "pmix", "none")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job, and where the job's rendezvous store is.

    ``master_addr``/``master_port`` name pycoll's store (not torch's). ``store_is_external``
    is True when something other than rank 0 runs that store (``python -m pycoll.run``, or
    ``PYCOLL_STORE_EXTERNAL=1``); otherwise rank 0 embeds it. ``master_addr`` and
    ``master_port`` may be None only when ``world_size == 1``.
    """

    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    master_addr: str | None
    master_port: int | None
    launcher: str
    store_is_external: bool
    token: str | None

    @property
    def is_single_process(self) -> bool:
        """True for a one-rank job, which needs no store at all."""
        return self.world_size == 1


# --------------------------------------------------------------------------------------------
# raw detection: which launcher, and the (unparsed) strings it left us


@dataclass
class _Raw:
    launcher: str
    # each value is (source name, text) so errors can name the variable; None = absent
    rank: tuple | None = None
    world_size: tuple | None = None
    local_rank: tuple | None = None
    local_world_size: tuple | None = None


def _get(env: Mapping[str, str], name: str) -> tuple | None:
    value = env.get(name)
    if value is None:
        return None
    return (name, value)


def _first(env: Mapping[str, str], *names: str) -> tuple | None:
    for name in names:
        found = _get(env, name)
        if found is not None:
            return found
    return None


def _slurm_local_world_size(env: Mapping[str, str]) -> tuple | None:
    """Tasks on this node: SLURM_NTASKS_PER_NODE if it is a plain number, else this node's
    entry of SLURM_TASKS_PER_NODE (format ``2(x3),1``) picked by SLURM_NODEID."""
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node is not None and per_node.strip().isdigit():
        return ("SLURM_NTASKS_PER_NODE", per_node)
    tasks = env.get("SLURM_TASKS_PER_NODE")
    node = env.get("SLURM_NODEID")
    if tasks is None or node is None or not node.strip().isdigit():
        return None
    counts = []
    for part in tasks.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts.extend([m.group(1)] * int(m.group(2) or 1))
    node_id = int(node)
    if node_id >= len(counts):
        return None
    return ("SLURM_TASKS_PER_NODE", counts[node_id])


#: (launcher, rank, world size, local rank, local world size) variables, in priority order;
#: a launcher is detected by its rank or world-size variable. Slurm is special (below).
_LAUNCHER_VARS = (
    ("pycoll", "PYCOLL_RANK", "PYCOLL_WORLD_SIZE", "PYCOLL_LOCAL_RANK", "PYCOLL_LOCAL_WORLD_SIZE"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


#: the variable that carries the rank / the world size, per launcher (for "is not set")
_RANK_VARS = {name: rank for name, rank, *_ in _LAUNCHER_VARS} | {"slurm": "SLURM_PROCID"}
_SIZE_VARS = {name: size for name, _, size, *_ in _LAUNCHER_VARS} | {"slurm": "SLURM_NTASKS"}


#: variables of launchers pycoll does not read: a process started by one must not silently
#: become a world of one
_UNSUPPORTED = (("HOROVOD_RANK", "horovodrun"), ("HOROVOD_SIZE", "horovodrun"))


def _slurm() -> ModuleType | None:
    """The Slurm helpers (``slurm.py``), or None when this file is loaded on its own."""
    try:
        from . import slurm
        return slurm
    except ImportError:  # pragma: no cover - standalone load (see the module docstring)
        return None


def _detect_raw(env: Mapping[str, str]) -> _Raw:
    slurm = _slurm()
    for launcher, rank, size, local_rank, local_size in _LAUNCHER_VARS:
        if launcher == "mpich" and slurm is not None and slurm.is_srun_of_pmi(env):
            break                     # srun --mpi=pmi2: Slurm, which knows the hosts
        if rank in env or size in env:
            return _Raw(launcher, _get(env, rank), _get(env, size), _get(env, local_rank),
                        _get(env, local_size))
    if "SLURM_PROCID" in env:
        return _Raw(
            "slurm",
            _get(env, "SLURM_PROCID"),
            _first(env, "SLURM_NTASKS", "SLURM_NPROCS"),
            _get(env, "SLURM_LOCALID"),
            _slurm_local_world_size(env),
        )
    if "PMIX_RANK" in env:
        # a PMIx launcher (prterun, Open MPI 5's mpirun with a non-Open-MPI program, srun
        # --mpi=pmix without SLURM_*): the rank, but no world size in the environment; plain
        # init() bootstraps over MPI (mpi.should_bootstrap), which asks PMIx for the world
        return _Raw("pmix", _get(env, "PMIX_RANK"), None, None, None)
    for var, name in _UNSUPPORTED:
        if var in env:
            raise _fail(f"environment variable {var}", "none",
                        f"is set: this process was started by {name}, whose environment pycoll "
                        "does not read; start it with python -m pycoll.run, torchrun, mpiexec "
                        "or srun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
    return _Raw("none")


# --------------------------------------------------------------------------------------------
# parsing and validation


def _fail(what: str, launcher: str, problem: str) -> ValueError:
    return _LaunchError(f"pycoll launch environment (launcher detected: {launcher}): "
                        f"{what} {problem}")


def _describe(source: tuple | None) -> str:
    if source is None:  # pragma: no cover - callers only describe values they parsed
        return "the value"
    name, value = source
    if name.startswith("argument "):
        return f"{name}={value!r}"
    return f"environment variable {name}={value!r}"


def _parse_int(source: tuple | None, launcher: str) -> int | None:
    if source is None:
        return None
    name, value = source
    if isinstance(value, bool):
        raise _fail(_describe(source), launcher, "is not an integer")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 10)
    except ValueError:
        raise _fail(_describe(source), launcher, "is not an integer") from None


def _parse_bool(env: Mapping[str, str], name: str, launcher: str) -> bool:
    value = env.get(name)
    if value is None:
        return False
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise _fail(f"environment variable {name}={value!r}", launcher, "is not a boolean (use 1 or 0)")


def launcher_name(env: Mapping[str, str] | None = None) -> str:
    """Which launcher started this process (one of ``LAUNCHERS``), before any validation."""
    return _detect_raw(os.environ if env is None else env).launcher


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Describe this process's place in the job from the environment alone.

    Raises ``pycoll.InvalidArgument``, a ``ValueError`` (naming the variable and the launcher
    detected), when the environment is incomplete or inconsistent. With nothing set: a
    single-process job (rank 0 of 1).
    """
    return resolve_launch(env=env)


def resolve_launch(
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> LaunchInfo:
    """Merge explicit arguments over the detected environment and validate the result.

    Each argument that is not None replaces the corresponding value from the environment
    (``master_port`` is pycoll's store port, used as given). Raises ``pycoll.InvalidArgument``
    (a ``ValueError``) naming the offending variable or argument and the launcher detected.
    """
    if env is None:
        env = os.environ
    raw = _detect_raw(env)
    launcher = raw.launcher
    r, ws = _rank_and_size(raw, rank, world_size)
    lr, lws = _local_rank(raw, ws)
    # what the arguments and the environment say, each checked, before any default
    given_addr = _given_address(env, launcher, master_addr)
    port_src, port = _given_port(env, launcher, master_port)
    external = _parse_bool(env, "PYCOLL_STORE_EXTERNAL", launcher)
    slurm = None
    if ws > 1 and launcher == "slurm" and master_addr is None and rank is None:
        slurm = _slurm_step(env, ws)
    addr = _store_address(given_addr, env, launcher, ws, lws, slurm,
                          pinned=master_addr is not None or external)
    port = _store_port(port, port_src, env, launcher, ws, slurm)
    return LaunchInfo(
        rank=r,
        world_size=ws,
        local_rank=lr,
        local_world_size=lws,
        master_addr=addr,
        master_port=port,
        launcher=launcher,
        store_is_external=external,
        token=env.get("PYCOLL_TOKEN") or None,
    )


def _rank_and_size(raw: _Raw, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): the arguments over the launcher's variables; (0, 1) when nothing
    says otherwise."""
    launcher = raw.launcher
    rank_src = ("argument rank", rank) if rank is not None else raw.rank
    world_src = ("argument world_size", world_size) if world_size is not None else raw.world_size
    if launcher != "none" or rank_src is not None or world_src is not None:
        if world_src is None:
            if rank_src is not None and launcher == "none":
                raise _LaunchError(
                    "pycoll launch environment (launcher detected: none): argument rank was given "
                    "but world_size was not (pass world_size, or launch with python -m pycoll.run, "
                    "torchrun, mpirun or srun)"
                )
            if launcher == "pmix":
                raise _fail("environment variable PMIX_RANK", launcher,
                            "is set, but PMIx puts no world size in the environment: install "
                            "mpi4py (pycoll.init() then bootstraps over MPI.COMM_WORLD), or set "
                            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
            missing = _SIZE_VARS.get(launcher, "world_size")
            raise _fail(f"environment variable {missing}", launcher,
                        "is not set (world size unknown)")
        if rank_src is None:
            if launcher == "none":
                raise _LaunchError(
                    "pycoll launch environment (launcher detected: none): argument world_size was "
                    "given but rank was not"
                )
            raise _fail(f"environment variable {_RANK_VARS[launcher]}", launcher,
                        "is not set (rank unknown)")

    r = _parse_int(rank_src, launcher)
    ws = _parse_int(world_src, launcher)
    if ws is None:
        return 0, 1
    assert r is not None
    if ws < 1:
        raise _fail(_describe(world_src), launcher, "must be at least 1")
    if not 0 <= r < ws:
        raise _fail(_describe(rank_src), launcher, f"must be in [0, {ws}) (world size {ws})")
    return r, ws


def _local_rank(raw: _Raw, ws: int) -> tuple[int | None, int | None]:
    """(local rank, local world size) as the launcher says, each None if it does not."""
    launcher = raw.launcher
    lr = _parse_int(raw.local_rank, launcher)
    lws = _parse_int(raw.local_world_size, launcher)
    if lws is not None and not 1 <= lws <= ws:
        raise _fail(_describe(raw.local_world_size), launcher,
                    f"must be in [1, {ws}] (world size {ws})")
    if lr is not None:
        bound = lws if lws is not None else ws
        if not 0 <= lr < bound:
            raise _fail(_describe(raw.local_rank), launcher, f"must be in [0, {bound})")
    if launcher == "none" and lr is None and lws is None and ws == 1:
        return 0, 1
    return lr, lws


def _given_address(env: Mapping[str, str], launcher: str, master_addr: str | None) -> str | None:
    """The store's address as the argument or the environment gives it (PYCOLL_* first)."""
    if master_addr is not None:
        source: tuple | None = ("argument master_addr", master_addr)
    else:
        source = _first(env, "PYCOLL_MASTER_ADDR", "MASTER_ADDR")
    if source is None:
        return None
    addr = source[1].strip()
    if not addr:
        raise _fail(_describe(source), launcher, "is empty")
    return addr


def _given_port(env: Mapping[str, str], launcher: str,
                master_port: int | None) -> tuple[tuple | None, int | None]:
    """(source, port) of the store as the argument or the environment gives it."""
    if master_port is not None:
        source: tuple | None = ("argument master_port", master_port)
        port = _parse_int(source, launcher)
    elif "PYCOLL_MASTER_PORT" in env:
        source = _get(env, "PYCOLL_MASTER_PORT")
        port = _parse_int(source, launcher)
    elif launcher == "torchrun" and "MASTER_PORT" in env:
        # torch's TCPStore already owns MASTER_PORT; pycoll's store takes the next one.
        source = _get(env, "MASTER_PORT")
        port = _parse_int(source, launcher)
        assert port is not None
        if not 1 <= port <= 65534:
            raise _fail(
                _describe(source), launcher,
                "must be in [1, 65534] (pycoll's store uses MASTER_PORT+1 under torchrun; "
                "set PYCOLL_MASTER_PORT to choose another)",
            )
        port += 1
    elif "MASTER_PORT" in env:
        source = _get(env, "MASTER_PORT")
        port = _parse_int(source, launcher)
    else:
        return None, None
    if port is not None and not 0 <= port <= 65535:
        raise _fail(_describe(source), launcher, "must be in [0, 65535]")
    return source, port


def _slurm_step(env: Mapping[str, str], ws: int) -> ModuleType | None:
    """The Slurm helpers (``slurm.py``) for a job of several tasks whose store address
    Slurm's host list names; an error at once for a batch script run without srun."""
    slurm = _slurm()
    if slurm is not None and slurm.outside_srun(env):
        raise _fail("SLURM_NTASKS", "slurm",
                    f"is {ws} but this process is not a task of srun (a batch script or "
                    "salloc shell run directly): it would wait for ranks that never "
                    "start. Launch the program with srun (e.g. srun python train.py)")
    return slurm


def _store_address(addr: str | None, env: Mapping[str, str], launcher: str, ws: int,
                   lws: int | None, slurm: ModuleType | None, pinned: bool) -> str | None:
    """Where rank 0's store listens: ``addr`` as given, else what the launcher implies
    (``pinned``: given as an argument, or the store runs elsewhere; never moved to
    loopback)."""
    if slurm is not None and addr is None and (lws is None or lws != ws):
        listed = slurm.node_list(env)
        if listed is not None and listed[1]:
            addr = listed[1][0]       # rank 0 runs on the step's first node
    if ws == 1:
        return addr
    if addr is None:
        if launcher in ("pycoll", "torchrun"):
            var = "PYCOLL_MASTER_ADDR" if launcher == "pycoll" else "MASTER_ADDR"
            raise _fail(f"environment variable {var}", launcher,
                        "is not set (store address unknown)")
        if (lws is not None and lws == ws) or launcher == "none":
            # every rank is on this host, or explicit rank/world_size with no address: a
            # single-host job, by convention
            return "127.0.0.1"
        raise _fail(
            "the store address", launcher,
            "is not set: set MASTER_ADDR (or PYCOLL_MASTER_ADDR, or pass master_addr) to "
            f"the host of rank 0; {launcher} does not say where rank 0 runs",
        )
    if lws == ws and not pinned and not is_loopback(addr):
        # Every rank runs on this host: the store (hosted by rank 0) and the data ports
        # listen on loopback only, out of reach of the network whatever MASTER_ADDR says.
        return "127.0.0.1"
    return addr


def _store_port(port: int | None, source: tuple | None, env: Mapping[str, str], launcher: str,
                ws: int, slurm: ModuleType | None) -> int | None:
    """The store's port: ``port`` as given, else what the launcher implies."""
    if slurm is not None and port is None:
        port = slurm.derived_port(env)
    if ws == 1:
        return port
    if port is None:
        if launcher == "pycoll":
            raise _fail("environment variable PYCOLL_MASTER_PORT", launcher,
                        "is not set (store port unknown)")
        if launcher == "torchrun":
            raise _fail("environment variable MASTER_PORT", launcher,
                        "is not set (store port unknown)")
        return DEFAULT_MASTER_PORT
    if port == 0:
        raise _fail(
            _describe(source) if source else "the store port", launcher,
            "is 0; a multi-rank job needs a fixed store port that every rank knows",
        )
    return port


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback (``localhost``, 127.0.0.0/8, ::1)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
