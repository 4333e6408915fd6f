"""revoke, agree and shrink on real processes (docs/elastic.md)."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(120)


def _die(comm: pycoll.Communicator) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# -- revoke -----------------------------------------------------------------------------------
def _revoke_while_others_wait(comm: pycoll.Communicator) -> dict:
    x = np.ones(4)
    comm.allreduce(x)
    if comm.rank == 0:
        time.sleep(0.3)                  # the others are blocked in the recv by now
        comm.revoke("operator asked")
        try:
            comm.allreduce(x)
        except pycoll.Revoked as e:
            return {"own": str(e), "by": e.revoked_by}
        return {"own": "no error"}
    start = time.monotonic()
    try:
        comm.recv(x, 0)                  # rank 0 never sends: only the revocation ends it
    except pycoll.Revoked as e:
        return {"waited": time.monotonic() - start, "by": e.revoked_by, "reason": e.reason,
                "text": str(e)}
    return {"waited": None}


def test_revoke_reaches_a_rank_blocked_on_another_peer() -> None:
    out = run_ranks(_revoke_while_others_wait, 3)
    assert "revoked" in out[0]["own"] and out[0]["by"] == 0
    for r in (1, 2):
        assert out[r]["by"] == 0 and out[r]["reason"] == "operator asked", out[r]
        assert "rank 0" in out[r]["text"] and "shrink" in out[r]["text"]
        assert out[r]["waited"] < 10.0       # the abort poll, not the 30 s deadline


# -- agree ------------------------------------------------------------------------------------
def _agree_all_alive(comm: pycoll.Communicator) -> list:
    results = [comm.agree(0b111 if comm.rank != 2 else 0b101)]
    results.append(comm.agree())                          # default flag 1
    comm.revoke("test")                                   # agree works on a revoked one too
    results.append(comm.agree(6))
    with pytest.raises(pycoll.InvalidArgument):
        comm.agree("yes")                                 # type: ignore[arg-type]
    return [(flag, sorted(gone)) for flag, gone in results]


def test_agree_returns_the_and_of_the_flags_on_every_rank() -> None:
    out = run_ranks(_agree_all_alive, 4)
    assert out == [[(0b101, []), (1, []), (6, [])]] * 4


def _agree_with_a_dead_rank(comm: pycoll.Communicator) -> tuple:
    if comm.rank == 1:
        _die(comm)
    time.sleep(0.2 if comm.rank == 0 else 0.0)
    flag, gone = comm.agree(comm.rank + 8)      # 8 & 10 & 11 (rank 1's 9 never votes)
    return flag, sorted(gone)


def test_agree_terminates_with_a_dead_rank_and_names_it() -> None:
    out = run_ranks(_agree_with_a_dead_rank, 4, expect_failure=True)
    assert out[1][0] == "missing"
    for r in (0, 2, 3):
        assert out[r] == ("ok", (8 & 10 & 11, [1])), out[r]


def _agree_timeout(comm: pycoll.Communicator) -> str:
    if comm.rank == 2:
        time.sleep(4)                 # alive, never agrees in time
        return "slept"
    try:
        comm.agree(1, timeout=1.0)
    except pycoll.CollectiveTimeout as e:
        return str(e)
    return "no error"


def test_agree_names_a_live_rank_that_never_calls() -> None:
    out = run_ranks(_agree_timeout, 3)
    for r in (0, 1):
        assert "rank(s) [2]" in out[r] and "neither took part nor died" in out[r]


# -- shrink -----------------------------------------------------------------------------------
def _shrink_after_death(comm: pycoll.Communicator) -> dict:
    group = comm.new_group([0, 2, 3])
    x = np.ones(8)
    comm.allreduce(x)
    if comm.rank == 1:
        _die(comm)
    try:
        for _ in range(50):
            comm.allreduce(x)
    except pycoll.PycollError as e:
        first = type(e).__name__
    else:
        first = "none"
    new = comm.shrink()
    y = np.full(3, float(new.rank + 1))
    new.allreduce(y)
    refused = {}
    for name, c in (("old", comm), ("group", group)):
        if c is None:
            continue
        try:
            c.allreduce(np.ones(2))
            refused[name] = "accepted"
        except pycoll.Revoked:
            refused[name] = "Revoked"
    return {"first": first, "rank": new.rank, "size": new.size, "y": y.tolist(),
            "refused": refused, "name": new.name}


def test_survivors_shrink_and_compute_correctly() -> None:
    out = run_ranks(_shrink_after_death, 4, expect_failure=True)
    assert out[1][0] == "missing"
    got = [out[r][1] for r in (0, 2, 3)]
    assert sorted(g["rank"] for g in got) == [0, 1, 2]
    for g in got:
        assert g["size"] == 3 and g["y"] == [6.0] * 3, g
        assert g["refused"]["old"] == "Revoked"
        assert g["refused"]["group"] == "Revoked"
        assert g["name"] == got[0]["name"] != "world"
    assert [g["rank"] for g in got] == [0, 1, 2]      # renumbered in the old order


def _shrink_excluding_a_live_rank(comm: pycoll.Communicator) -> dict:
    x = np.ones(4)
    comm.allreduce(x)
    if comm.rank == 3:
        with pytest.raises(pycoll.InvalidArgument, match="in exclude"):
            comm.shrink(exclude=[3])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                comm.allreduce(x)
            except pycoll.Revoked as e:
                return {"excluded_saw": type(e).__name__}
            time.sleep(0.05)
        return {"excluded_saw": "nothing"}
    new = comm.shrink(exclude=[3])
    y = np.full(2, 1.0)
    new.allreduce(y)
    return {"size": new.size, "y": y.tolist()}


def test_shrink_excludes_a_live_rank_which_then_gets_revoked() -> None:
    out = run_ranks(_shrink_excluding_a_live_rank, 4)
    assert out[3] == {"excluded_saw": "Revoked"}
    assert out[:3] == [{"size": 3, "y": [3.0, 3.0]}] * 3


def _mismatched_excludes(comm: pycoll.Communicator) -> str:
    try:
        comm.shrink(exclude=[3] if comm.rank < 2 else [])
    except pycoll.InvalidArgument as e:
        return str(e)
    except pycoll.PycollError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_ranks_passing_different_excludes_all_get_an_error() -> None:
    out = run_ranks(_mismatched_excludes, 4)
    for text in out:
        assert "different exclude lists" in text, out


def _bad_input(comm: pycoll.Communicator) -> list[str]:
    errors = []
    for exclude in ([7], ["x"], [-1]):
        try:
            comm.shrink(exclude=exclude)
        except pycoll.InvalidArgument as e:
            errors.append(str(e))
    comm.allreduce(np.ones(2))        # nothing was revoked by the refused calls
    return errors


def test_bad_exclude_is_refused_before_anything_happens() -> None:
    out = run_ranks(_bad_input, 2)
    for errors in out:
        assert len(errors) == 3 and all("exclude" in e for e in errors), errors


def _fenced_rank(comm: pycoll.Communicator) -> str:
    """Rank 2 loses its store lease (as when the store cannot reach it): the others go on
    without it; when it asks, it learns it is excluded."""
    comm.allreduce(np.ones(2))
    if comm.rank == 2:
        comm._lease.close()          # noqa: SLF001 - the test cuts the rank off the store
        time.sleep(0.5)
        try:
            comm.shrink()
        except pycoll.Excluded as e:
            return f"Excluded: {e}"
        return "not excluded"
    time.sleep(0.2)
    new = comm.shrink()
    y = np.ones(2)
    new.allreduce(y)
    return f"size {new.size} sum {y[0]}"


def test_a_rank_cut_off_from_the_store_is_fenced_out() -> None:
    out = run_ranks(_fenced_rank, 3)
    assert out[:2] == ["size 2 sum 2.0"] * 2
    assert out[2].startswith("Excluded:") and "go on without it" in out[2]


def _world_shrink(comm: pycoll.Communicator) -> tuple:
    if comm.rank == 0:
        _die(comm)
    try:
        pycoll.allreduce(np.ones(2))
    except pycoll.PycollError:
        pass
    new = pycoll.shrink()
    y = np.ones(2)
    pycoll.allreduce(y)                  # the module-level calls use the shrunk world
    return new is pycoll.world(), pycoll.get_world_size(), float(y[0])


def test_pycoll_shrink_replaces_the_default_world() -> None:
    out = run_ranks(_world_shrink, 3, expect_failure=True)
    assert out[0][0] == "missing"
    assert out[1:] == [("ok", (True, 2, 2.0))] * 2


def _agree_while_another_rank_fails(comm: pycoll.Communicator) -> dict:
    """Ranks 0 and 1 reach an agree of the normal flow; rank 2 fails elsewhere (here:
    revokes) and goes to recover instead of voting: their agree must give up at once, alike
    on both, not wait for the deadline; then everyone shrinks."""
    if comm.rank == 2:
        time.sleep(0.3)
        comm.revoke("rank 2 failed elsewhere")
        seen = "revoked it"
    else:
        start = time.monotonic()
        try:
            comm.agree(1, timeout=20)
            seen = "agreed"
        except pycoll.Revoked as e:
            seen = f"Revoked after {time.monotonic() - start:.1f}s: {e.reason}"
    new = comm.shrink()
    return {"seen": seen, "size": new.size}


def test_an_agree_gives_up_when_a_rank_fails_elsewhere() -> None:
    out = run_ranks(_agree_while_another_rank_fails, 3)
    for r in (0, 1):
        assert out[r]["seen"].startswith("Revoked after") and "elsewhere" in out[r]["seen"]
        assert float(out[r]["seen"].split()[2][:-2]) < 10, out
    assert [o["size"] for o in out] == [3, 3, 3]
