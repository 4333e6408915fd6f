"""Run a function on N real rank processes: the harness pycoll's own tests use.

``run_ranks(fn, n)`` starts a rendezvous server in the calling process, forks ``n`` processes,
has each call ``pycoll.init`` as rank k and then ``fn(comm, *args)``, and returns the ``n``
results in rank order. If any rank raises, the others are killed and ``RankFailure`` carries
every rank's traceback. Every process is reaped before it returns, whatever happens.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from typing import Any, Callable, Mapping, Sequence


class RankFailure(AssertionError):
    """One or more ranks failed; ``errors`` maps rank -> (exception type name, traceback)."""

    def __init__(self, errors: dict[int, tuple[str, str]], detail: str = "") -> None:
        self.errors = errors
        lines = [f"{len(errors)} rank(s) failed{detail}:"]
        for rank, (kind, tb) in sorted(errors.items()):
            lines.append(f"--- rank {rank}: {kind}\n{tb}")
        super().__init__("\n".join(lines))


def _rank_main(fn: Callable, rank: int, size: int, port: int, env: Mapping[str, str],
               results: Any, args: Sequence[Any], timeout: float) -> None:
    os.environ.update(env)
    os.environ["PYCOLL_STORE_EXTERNAL"] = "1"
    for var in ("PYCOLL_RANK", "PYCOLL_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        os.environ.pop(var, None)
    try:
        import pycoll
        comm = pycoll.init(rank, size, master_addr="127.0.0.1", master_port=port, timeout=timeout)
        try:
            value = fn(comm, *args)
        finally:
            pycoll.finalize()
        outcome = (rank, "ok", value)
        code = 0
    except BaseException as e:  # reported to the parent, which raises RankFailure
        outcome = (rank, type(e).__name__, traceback.format_exc())
        code = 1
    results.put(outcome)
    results.close()
    results.join_thread()   # flush before os._exit skips the queue's feeder thread
    os._exit(code)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any,
              env: Mapping[str, str] | None = None, timeout: float = 60.0,
              collective_timeout: float = 30.0, expect_failure: bool = False) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` forked ranks; return results by rank.

    ``fn`` must be a module-level function. ``collective_timeout`` is the communicators'
    default deadline; ``timeout`` bounds the whole run. With ``expect_failure`` the per-rank
    outcomes are returned (``("ok", value)`` or ``(exception name, traceback)``) instead of
    raising.
    """
    from rendezvous import StoreServer

    server = StoreServer("127.0.0.1", 0)
    server.start()
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(fn, r, world_size, server.port, dict(env or {}), results, args,
                               collective_timeout))
             for r in range(world_size)]
    outcomes: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
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
