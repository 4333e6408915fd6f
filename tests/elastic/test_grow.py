"""grow and join: processes join a running communicator (docs/elastic.md)."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(120)


def _grow_by_two(comm: pycoll.Communicator) -> tuple:
    """Ranks 0-2 grow by the two joiners (which run this function with the grown world)."""
    joined = os.environ.get("PYCOLL_JOIN") == "1"   # the joiners arrive already grown
    if not joined:
        comm = comm.grow(2, timeout=60)
    x = np.full(4, float(comm.rank + 1))
    comm.allreduce(x)
    flag, gone = comm.agree(1)
    comm.barrier()                  # every member has trimmed the lobby by now
    lobby = {k: bytes(comm._store.get(k)) if comm._store.check([k]) else None
             for k in ("pycoll/world/lobby/queue", "pycoll/world/lobby/admit/1")}
    return comm.rank, comm.size, float(x[0]), flag, sorted(gone), joined, lobby


def test_two_processes_join_and_compute_with_the_ranks() -> None:
    out = run_ranks(_grow_by_two, 3, joiners=2)
    ranks = sorted(o[0] for o in out)
    assert ranks == [0, 1, 2, 3, 4]
    for _rank, size, total, flag, gone, _, lobby in out:
        assert (size, total, flag, gone) == (5, 15.0, 1, []), out
        # the admitted joiners' tickets and admissions are gone from the lobby
        assert lobby == {"pycoll/world/lobby/queue": b"",
                         "pycoll/world/lobby/admit/1": None}, out
    assert [o[0] for o in out[:3]] == [0, 1, 2]      # the members keep their numbers


def _grow_with_nobody_waiting(comm: pycoll.Communicator) -> bool:
    return comm.grow() is comm


def test_grow_with_nobody_waiting_returns_the_same_communicator() -> None:
    assert run_ranks(_grow_with_nobody_waiting, 3) == [True] * 3


def _shrink_then_grow(comm: pycoll.Communicator) -> tuple:
    if os.environ.get("PYCOLL_JOIN") != "1":      # the original ranks, not the joiner
        if comm.rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            for _ in range(100):
                comm.allreduce(np.ones(2))
                time.sleep(0.01)
        except pycoll.PycollError:
            pass
        comm = comm.shrink()
        comm = comm.grow(1, timeout=60)
    x = np.full(2, float(comm.rank))
    comm.allreduce(x)
    return comm.size, float(x[0])


def test_a_replacement_joins_the_shrunk_communicator() -> None:
    out = run_ranks(_shrink_then_grow, 4, joiners=1, expect_failure=True)
    assert out[2][0] == "missing"
    for k in (0, 1, 3, 4):
        assert out[k] == ("ok", (4, 6.0)), out[k]


def _bad_count(comm: pycoll.Communicator) -> list[str]:
    errors = []
    for count in (0, -1, "2", True):
        try:
            comm.grow(count)                 # type: ignore[arg-type]
        except pycoll.InvalidArgument as e:
            errors.append(str(e))
    return errors


def test_grow_refuses_a_bad_count() -> None:
    for errors in run_ranks(_bad_count, 2):
        assert len(errors) == 4 and all("count" in e for e in errors)


def _join_times_out(comm: pycoll.Communicator) -> str:
    return "member"


def test_a_joiner_nobody_admits_times_out_with_a_hint() -> None:
    out = run_ranks(_join_times_out, 2, joiners=1, expect_failure=True,
                    collective_timeout=2.0)
    assert out[:2] == [("ok", "member")] * 2
    kind, text = out[2]
    assert kind == "CollectiveTimeout" and "grow()" in text


def test_joiner_of_an_ended_job_says_what_it_waits_for(tmp_path) -> None:
    """A replacement started against a store whose job has ended (nobody is left to call
    grow): soon after it queues, it says once on stderr what it waits for and where (the
    store's address, the lobby), and still gives up at its own deadline, not before."""
    import subprocess
    import sys
    from pathlib import Path

    from rendezvous import StoreServer

    token = "ab" * 16
    server = StoreServer("127.0.0.1", 0, token=token)
    server.start()
    repo = str(Path(__file__).resolve().parents[2])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")},
           "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p),
           "PYCOLL_JOIN": "1", "PYCOLL_RANK": "1", "PYCOLL_WORLD_SIZE": "2",
           "PYCOLL_LOCAL_RANK": "1", "PYCOLL_LOCAL_WORLD_SIZE": "2",
           "PYCOLL_MASTER_ADDR": "127.0.0.1", "PYCOLL_MASTER_PORT": str(server.port),
           "PYCOLL_STORE_EXTERNAL": "1", "PYCOLL_TOKEN": token}
    try:
        proc = subprocess.run([sys.executable, "-c", "import pycoll; pycoll.init(timeout=30)"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    finally:
        server.close()
    err = proc.stderr
    assert proc.returncode != 0, err
    notices = [line for line in err.splitlines() if "waiting to be admitted" in line]
    assert len(notices) == 1, err
    assert f"127.0.0.1:{server.port}" in notices[0] and "pycoll/world/lobby" in notices[0]
    assert "grow()" in notices[0]
    assert "CollectiveTimeout" in err and "no running job admitted this process" in err, err
