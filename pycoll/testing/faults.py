"""Fault injection on real rank processes: kill a rank in the middle of a collective loop.

Used by ``tests/faults`` and ``benchmarks/fault_detection.py``. :func:`kill_during` forks
``world_size`` ranks (with a rendezvous server in the calling process, as
``pycoll.testing.run_ranks`` does), lets every rank run one collective in a loop, sends
``SIGKILL`` to the victim, and reports for every survivor what it raised and how long after
the kill (``time.monotonic`` is one system-wide clock on Linux, so times compare across the
processes). Every process is reaped before it returns, and ``leaked_segments`` lists any
``/dev/shm/<PYCOLL_SHM_PREFIX>-<pid>-*`` left by the job's ranks.
"""
from __future__ import annotations

import glob
import multiprocessing as mp
import os
import queue
import random
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Survivor:
    rank: int
    kind: str            # exception type name, "ok" (no failure: bad), or "missing"
    message: str
    latency: float | None   # seconds from the kill to the exception


@dataclass
class KillResult:
    world_size: int
    victim: int
    survivors: list[Survivor] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    leaked_segments: list[str] = field(default_factory=list)

    def still_running(self) -> list[int]:
        """Pids of the job's ranks that still exist (should be none: all reaped)."""
        return [pid for pid in self.pids if os.path.exists(f"/proc/{pid}")]

    def misblamed(self, within: float) -> list[tuple[int, str, float | None, str]]:
        """Survivors that did not raise ``PeerLost``/``PeerLostAbort`` naming the victim
        within ``within`` seconds of the kill (a generous bound: far below the deadline, so
        a hang until the deadline shows), as (rank, kind, latency, message)."""
        bad = []
        for s in self.survivors:
            named = f"rank {self.victim} is gone" in s.message or \
                f"peer rank {self.victim}" in s.message
            if (s.kind not in ("PeerLost", "PeerLostAbort") or not named
                    or s.latency is None or s.latency >= within):
                bad.append((s.rank, s.kind, s.latency, s.message))
        return bad

    @property
    def worst(self) -> float | None:
        lat = [s.latency for s in self.survivors if s.latency is not None]
        return max(lat) if len(lat) == len(self.survivors) and lat else None


def _rank_main(rank: int, size: int, port: int, env: Mapping[str, str], q: Any,
               collective: str, nbytes: int, timeout: float, limit: float) -> None:
    os.environ.update(env)
    os.environ["PYCOLL_STORE_EXTERNAL"] = "1"
    code = 0
    try:
        import pycoll
        comm = pycoll.init(rank, size, master_addr="127.0.0.1", master_port=port,
                           timeout=timeout)
        arr = np.ones(max(1, nbytes // 4), dtype=np.float32)
        if collective == "allreduce":
            def step() -> None:
                comm.allreduce(arr, "max")   # max: the values never overflow
        elif collective == "broadcast":
            def step() -> None:
                comm.broadcast(arr, 0)
        else:
            raise ValueError(f"unsupported collective {collective!r}")
        step()
        q.put(("ready", rank, os.getpid(), 0.0, ""))
        stop = time.monotonic() + limit
        try:
            while time.monotonic() < stop:
                step()
            q.put(("ok", rank, os.getpid(), 0.0, "no failure"))
        except Exception as e:  # noqa: BLE001 - reported to the parent
            q.put((type(e).__name__, rank, os.getpid(), time.monotonic(), str(e)))
        pycoll.finalize()
    except BaseException as e:  # noqa: BLE001 - init failure etc.
        q.put(("setup:" + type(e).__name__, rank, os.getpid(), 0.0, str(e)))
        code = 1
    q.close()
    q.join_thread()
    os._exit(code)


def kill_during(world_size: int, collective: str = "allreduce", nbytes: int = 8, *,
                victim: int | None = None, transport: str = "shm",
                env: Mapping[str, str] | None = None, deadline: float = 60.0,
                delay: tuple[float, float] = (0.02, 0.15), wait: float = 30.0,
                seed: int | None = None) -> KillResult:
    """Run ``collective`` on ``nbytes`` in a loop on ``world_size`` ranks and kill one.

    ``deadline`` is the communicators' collective timeout (detection must beat it by far);
    the kill comes a random ``delay`` after every rank finished its first collective.
    """
    from rendezvous import StoreServer

    rng = random.Random(seed)
    if victim is None:
        victim = rng.randrange(world_size)
    full_env = {"PYCOLL_TRANSPORTS": transport, **(env or {})}
    server = StoreServer("127.0.0.1", 0)     # served after the fork (see run_ranks)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world_size, server.port, full_env, q, collective, nbytes,
                               deadline, deadline + wait))
             for r in range(world_size)]
    result = KillResult(world_size, victim)
    outcomes: dict[int, tuple[str, float, str]] = {}
    t_kill = None
    try:
        for p in procs:
            p.start()
        server.start()
        result.pids = [p.pid for p in procs]  # type: ignore[misc]
        ready: set[int] = set()
        limit = time.monotonic() + 60 + 10 * world_size
        while len(ready) < world_size and time.monotonic() < limit:
            try:
                kind, rank, _pid, _t, msg = q.get(timeout=0.1)
            except queue.Empty:
                if any(not p.is_alive() for p in procs):
                    break
                continue
            if kind == "ready":
                ready.add(rank)
            else:
                outcomes[rank] = (kind, 0.0, msg)
        if len(ready) < world_size:
            raise RuntimeError(f"ranks did not start: ready {sorted(ready)}, "
                               f"outcomes {outcomes}")
        time.sleep(rng.uniform(*delay))
        t_kill = time.monotonic()
        os.kill(procs[victim].pid, signal.SIGKILL)  # type: ignore[arg-type]
        until = t_kill + wait
        survivors = set(range(world_size)) - {victim}
        while not survivors <= set(outcomes) and time.monotonic() < until:
            try:
                kind, rank, _pid, t, msg = q.get(timeout=0.1)
                outcomes[rank] = (kind, t, msg)
            except queue.Empty:
                pass
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
                p.join(5)
        q.close()
        server.close()
    for r in range(world_size):
        if r == victim:
            continue
        kind, t, msg = outcomes.get(r, ("missing", 0.0, "reported nothing"))
        latency = t - t_kill if (t and t_kill is not None) else None
        result.survivors.append(Survivor(r, kind, msg, latency))
    from ..transports.shm.segment import SHM_DIR, segment_prefix
    result.leaked_segments = [f for pid in result.pids
                              for f in glob.glob(f"{SHM_DIR}/{segment_prefix(pid)}*")]
    return result
