"""Run a function on N ranks: the harness pycoll's own tests use.

``run_ranks(fn, n)`` starts a rendezvous server in the calling process, forks ``n`` processes,
has each call ``pycoll.init`` as rank k and then ``fn(comm, *args)``, and returns the ``n``
results in rank order. If any rank raises, the others are killed and ``RankFailure`` carries
every rank's traceback. Every process is reaped before it returns, whatever happens.

``run_threads(fn, n)`` does the same with ``n`` threads of this process over the in-process
transport and an in-process store, so algorithms, selection and the bootstrap can be tested
at hundreds or thousands of ranks.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def fd_targets() -> list[str]:
    """What each of this process's open file descriptors points at (``/proc/self/fd``):
    "socket:[inode]", a path, "anon_inode:[pidfd]"..."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue                 # closed meanwhile (the listing's own fd, say)
    return targets


def mapped_segments() -> set[str]:
    """The pycoll shared-memory files (``/dev/shm/<PYCOLL_SHM_PREFIX>-...``) this process has
    mapped, also those already unlinked, read from ``/proc/self/maps``."""
    from ..transports.shm.segment import SHM_DIR, name_prefix
    mine = f"{SHM_DIR}/{name_prefix()}-"
    with open("/proc/self/maps") as f:
        return {line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                for line in f if mine in line}


def held_counts(comm: Any) -> dict[str, Any]:
    """What a communicator tree holds in this process, counted by the kernel where it can
    be: the tree's open channels per transport, this process's sockets, and its mapped
    segments (channel segments apart from the fast path's slot segments, ``-fast``)."""
    segments = mapped_segments()
    fast = {p for p in segments if p.endswith("-fast")}
    return {"channels": dict(comm.open_channels()),
            "sockets": sum(t.startswith("socket:") for t in fd_targets()),
            "channel segments": len(segments - fast), "fast-path segments": len(fast)}


def tcp_connections() -> list[tuple[str, int, str, int]]:
    """(local address, local port, remote address, remote port) of this process's
    ESTABLISHED TCP connections, IPv4 and IPv6, read from the kernel's tables (not from
    pycoll's bookkeeping), for tests that count or inspect real sockets."""
    mine = {t[8:-1] for t in fd_targets() if t.startswith("socket:[")}

    def endpoint(text: str, family: int) -> tuple[str, int]:
        raw, port = text.rsplit(":", 1)
        data = bytes.fromhex(raw)
        # the kernel prints each 32-bit word in host (little-endian) order
        words = b"".join(data[i:i + 4][::-1] for i in range(0, len(data), 4))
        return socket.inet_ntop(family, words), int(port, 16)

    found = []
    for table, family in (("/proc/self/net/tcp", socket.AF_INET),
                          ("/proc/self/net/tcp6", socket.AF_INET6)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[9] in mine and fields[3] == "01":      # 01: ESTABLISHED
                found.append(endpoint(fields[1], family) + endpoint(fields[2], family))
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now, for a server a test starts a moment later.

    Drawn below the kernel's ephemeral range (``ip_local_port_range``): a port the kernel
    hands out itself (``bind(0)``) can be taken meanwhile by any outgoing connection of the
    job's own ranks, and the server then fails with "address already in use".
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10000, max(10001, low))
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:   # a crowded range: let the kernel choose
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RankFailure(AssertionError):
    """One or more ranks failed; ``errors`` maps rank -> (exception type name, traceback)."""

    def __init__(self, errors: dict[int, tuple[str, str]], detail: str = "") -> None:
        self.errors = errors
        lines = [f"{len(errors)} rank(s) failed{detail}:"]
        for rank, (kind, tb) in sorted(errors.items()):
            lines.append(f"--- rank {rank}: {kind}\n{tb}")
        super().__init__("\n".join(lines))


def _rank_main(fn: Callable, rank: int, size: int, port: int, env: Mapping[str, str],
               results: Any, args: Sequence[Any], timeout: float,
               torch_forked: bool = False) -> None:
    os.environ.update(env)
    if torch_forked:
        # forked from a process that had torch: if it ran a parallel op there, GNU OpenMP's
        # pool was started, and it is not fork-safe (this process has the pool's state but
        # none of its threads: the first parallel op here waits for them for ever). On one
        # thread torch never enters the pool.
        import torch
        torch.set_num_threads(1)
    os.environ["PYCOLL_STORE_EXTERNAL"] = "1"
    from ..transports.progress import WaitPolicy
    WaitPolicy.most_ranks = 0     # forked: the parent's layout (e.g. of run_threads) is not ours
    WaitPolicy.configure(1)
    for var in ("PYCOLL_RANK", "PYCOLL_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        os.environ.pop(var, None)
    index = rank                     # where the result goes
    if rank >= size:                 # a joiner (``joiners``): its rank comes from grow
        rank, size = 0, 1
    try:
        import pycoll
        comm = pycoll.init(rank, size, master_addr="127.0.0.1", master_port=port, timeout=timeout)
        try:
            value = fn(comm, *args)
        finally:
            pycoll.finalize()
        outcome = (index, "ok", value)
        code = 0
    except BaseException as e:  # reported to the parent, which raises RankFailure
        outcome = (index, type(e).__name__, traceback.format_exc())
        code = 1
    results.put(outcome)
    results.close()
    results.join_thread()   # flush before os._exit skips the queue's feeder thread
    os._exit(code)


def _cuda_initialised() -> bool:
    """Whether this process initialised CUDA (pycoll's device runtime or torch's)."""
    runtime = sys.modules.get("pycoll.cuda.runtime")
    if runtime is not None and runtime.initialised():
        return True
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without CUDA support
        return False


def cuda_env() -> dict[str, str]:
    """The environment device-memory tests run under: CuPy and the GPU where CuPy sees one,
    otherwise pycoll's CPU simulator of CUDA (``PYCOLL_CUDA_SIMULATOR=1``; a simulated run
    is never a GPU run). An explicit ``PYCOLL_CUDA_SIMULATOR`` is kept as it is. Initialises
    no CUDA here: whether a device is visible is asked in a child process, so that this one
    can still fork ranks that use CUDA."""
    if os.environ.get("PYCOLL_CUDA_SIMULATOR", "").strip():
        return {}
    from ..cuda.runtime import missing_reason
    if missing_reason() is None and _gpu_visible():
        return {}
    return {"PYCOLL_CUDA_SIMULATOR": "1"}


_GPU_VISIBLE: list[bool] = []


def _gpu_visible() -> bool:
    if not _GPU_VISIBLE:
        import subprocess
        code = ("import sys; from pycoll.cuda.runtime import unavailable_reason; "
                "sys.exit(0 if unavailable_reason() is None else 1)")
        env = {k: v for k, v in os.environ.items() if k != "PYCOLL_CUDA_SIMULATOR"}
        try:
            visible = subprocess.run([sys.executable, "-c", code], env=env, timeout=120,
                                     capture_output=True).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            visible = False
        _GPU_VISIBLE.append(visible)
    return _GPU_VISIBLE[0]


def same_host_transport() -> str:
    """The transport the default allow-list gives two ranks of one host, host memory
    included: the first one in the registry's order that is usable here (cuda_ipc where CuPy
    and a CUDA driver, or the simulator, are there: its host messages are shm's; else shm)."""
    from ..transports import registry
    order = registry.allowed_transports()
    records, _missing = registry.probe_all(order)
    return next(name for name in order if name in records)


def wait_for_path(path: str | os.PathLike[str], timeout: float, what: str) -> None:
    """Wait until ``path`` exists (another rank's sign that it reached a point: ``what``),
    for ``timeout`` seconds at most; AssertionError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what} ({path} does not exist)")
        time.sleep(0.01)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any,
              env: Mapping[str, str] | None = None, timeout: float = 60.0,
              collective_timeout: float = 30.0, expect_failure: bool = False,
              rank_env: Mapping[int, Mapping[str, str]] | None = None,
              start_method: str | None = None, joiners: int = 0) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` forked ranks; return results by rank.

    ``fn`` must be a module-level function. ``collective_timeout`` is the communicators'
    default deadline; ``timeout`` bounds the whole run. With ``expect_failure`` the per-rank
    outcomes are returned (``("ok", value)`` or ``(exception name, traceback)``) instead of
    raising. ``rank_env`` adds variables for some ranks only (rank -> variables).
    ``start_method="spawn"`` starts fresh interpreters instead: the default (None) where
    this process has initialised CUDA (or torch has), since CUDA cannot be used in a process
    forked from one that initialised it; fork otherwise. Ranks forked from a process that
    imported torch run torch on one thread (GNU OpenMP's pool, once started, is not
    fork-safe). ``joiners``: that many more processes
    call ``pycoll.init(join=True)`` (they join when the ranks call ``grow``) and then ``fn``;
    their results follow the ranks'.
    """
    from rendezvous import StoreServer

    # bound and listening now, served only after the fork: a process with threads should not
    # fork (a lock another thread holds stays held in the child; Python 3.12 warns)
    server = StoreServer("127.0.0.1", 0)
    method = start_method or ("spawn" if _cuda_initialised() else "fork")
    ctx: Any = mp.get_context(method)
    torch_forked = method == "fork" and "torch" in sys.modules
    results = ctx.Queue()
    joining = {"PYCOLL_JOIN": "1"}
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(fn, r, world_size, server.port,
                               {**(env or {}), **(rank_env or {}).get(r, {}),
                                **(joining if r >= world_size else {})}, results, args,
                               collective_timeout, torch_forked))
             for r in range(world_size + joiners)]
    world_size += joiners        # results: the ranks', then the joiners'
    outcomes: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        server.start()
        while len(outcomes) < world_size and time.monotonic() < deadline:
            try:
                rank, kind, value = results.get(timeout=0.1)
                outcomes[rank] = (kind, value)
                continue
            except queue.Empty:
                pass
            if not expect_failure and any(k != "ok" for k, _ in outcomes.values()):
                break  # a rank failed: stop waiting for the others
            if all(not p.is_alive() for p in procs) and results.empty():
                break
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(2.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        while True:  # collect late results
            try:
                rank, kind, value = results.get_nowait()
                outcomes.setdefault(rank, (kind, value))
            except queue.Empty:
                break
        results.close()
        server.close()
    if expect_failure:
        return [outcomes.get(r, ("missing", f"rank {r} reported nothing (exit code "
                                            f"{procs[r].exitcode})")) for r in range(world_size)]
    errors = {r: o for r, o in outcomes.items() if o[0] != "ok"}
    for r in range(world_size):
        if r not in outcomes:
            errors[r] = ("missing", f"no result (exit code {procs[r].exitcode}; "
                                    f"timeout {timeout} s)")
    if errors:
        raise RankFailure(errors)
    return [outcomes[r][1] for r in range(world_size)]


def run_threads(fn: Callable[..., Any], world_size: int, *args: Any,
                env: Mapping[str, str] | None = None, timeout: float = 300.0,
                collective_timeout: float = 120.0) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` threads of this process; results by rank.

    Ranks talk over the in-process transport (``Capabilities.in_process``: inproc) and bootstrap
    through a ``rendezvous.LocalStore``. ``env`` is applied to this process for the duration
    (threads share it). A rank still running at ``timeout`` is reported (threads cannot be
    killed; every collective ends at ``collective_timeout`` anyway).
    """
    import threading

    from rendezvous import LocalStore

    from ..comm.communicator import Communicator
    from ..transports import registry
    from ..transports.progress import WaitPolicy

    settings = {"PYCOLL_TRANSPORTS": ",".join(registry.in_process()), **dict(env or {})}
    saved_env = {k: os.environ.get(k) for k in settings}
    saved_policy = (WaitPolicy.most_ranks, WaitPolicy.crowded, WaitPolicy.spin_seconds,
                    WaitPolicy.hot_spins, WaitPolicy.liveness_seconds)
    os.environ.update(settings)
    store = LocalStore(timeout=collective_timeout)
    outcomes: dict[int, tuple[str, Any]] = {}

    def rank_main(rank: int) -> None:
        try:
            comm = Communicator.create(store, rank, world_size, timeout=collective_timeout)
            try:
                outcomes[rank] = ("ok", fn(comm, *args))
            finally:
                comm.finalize()
        except BaseException as e:  # reported to the caller
            outcomes[rank] = (type(e).__name__, traceback.format_exc())

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True,
                                name=f"pycoll-rank{r}") for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        (WaitPolicy.most_ranks, WaitPolicy.crowded, WaitPolicy.spin_seconds,
         WaitPolicy.hot_spins, WaitPolicy.liveness_seconds) = saved_policy
    errors = {r: o for r, o in outcomes.items() if o[0] != "ok"}
    for r in range(world_size):
        if r not in outcomes:
            errors[r] = ("missing", f"rank {r} still running after {timeout} s")
    if errors:
        first = dict(sorted(errors.items())[:4])
        raise RankFailure(first, f" (of {len(errors)} failed ranks, the first 4)")
    return [outcomes[r][1] for r in range(world_size)]
