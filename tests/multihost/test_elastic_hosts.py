"""Elastic recovery across namespace hosts: a rank killed, a host's ranks killed, a host's
cable pulled; every survivor ends on the same shrunk communicator and its checked
collectives give the right results, the cut-off ranks exit by themselves, nothing hangs.

One trial per fault kind here (``PYCOLL_ELASTIC_HOST_TRIALS`` for more), 4 hosts x 2 ranks
and the store in a namespace of its own; ``benchmarks/elastic_hosts.py`` runs many and
measures detection and recovery. The trials and the judge are in ``elastic_jobs.py``; the
judge's own tests below need no namespaces.
"""
from __future__ import annotations

import os
import random

import pytest

from pycoll.testing.hosts import NamespaceHosts, available

from .elastic_jobs import (
    EXIT_LIMIT,
    FAULTS,
    HOSTS,
    ElasticTrial,
    cut_off_in_agree,
    elastic_trial,
)

ok, why = available()
needs_hosts = pytest.mark.skipif(not ok, reason=f"namespace hosts unavailable: {why}")
TRIALS = max(1, int(os.environ.get("PYCOLL_ELASTIC_HOST_TRIALS", "1")))


@needs_hosts
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.timeout(60 + (100 + EXIT_LIMIT + 10) * TRIALS)
def test_survivors_shrink_and_go_on(fault, tmp_path):
    """kill: SIGKILL to a random rank; host: to both ranks of a random host; cable: a random
    host's eth0 down (its ranks lose the store and the others). All at a random moment of a
    loop of mixed checked collectives."""
    rng = random.Random(f"{fault}-{os.getpid()}")
    problems = []
    with NamespaceHosts(HOSTS + 1) as hosts:
        for t in range(TRIALS):
            out = tmp_path / f"trial{t}"
            out.mkdir()
            trial = elastic_trial(hosts, fault, out, rng)
            problems += [f"trial {t}: {p}" for p in trial.problems()]
    assert not problems, "\n".join(problems)


# -- the judge ---------------------------------------------------------------------------------

def _recovered(rank: int, size: int, **extra: object) -> dict:
    res = {"outcome": "recovered", "final_size": size, "final_rank": rank, "final_ok": True,
           "t_error": 10.5, "t_first_ok": 10.8, "error": "PeerLost", "message": "",
           "recover_errors": "", "recoveries": 1}
    res.update(extra)
    return res


def _host_kill(lost: list[int]) -> ElasticTrial:
    """A trial as a host kill that went right: 8 ranks, ``lost`` killed at t=10."""
    trial = ElasticTrial("host", 8, lost=lost, target="host 1", injected=10.0)
    for new, r in enumerate(trial.survivors):
        trial.results[r] = _recovered(new, 6)
        trial.exits[r] = (0, 2.0)
    for r in lost:
        trial.exits[r] = (-9, 0.01)
    return trial


def test_judge_passes_a_good_trial_and_measures_it():
    trial = _host_kill([2, 3])
    assert trial.problems() == []
    assert trial.detection() == pytest.approx([0.5] * 6)
    assert trial.recovery() == pytest.approx([0.3] * 6)


@pytest.mark.parametrize("spoil, says", [
    (lambda t: t.results.pop(4), "survivor rank 4: no result"),
    (lambda t: t.results[5].update(outcome="wrong"), "survivor rank 5: wrong"),
    (lambda t: t.results[0].update(outcome="excluded"), "survivor rank 0: excluded"),
    (lambda t: t.results[7].update(final_size=7, final_rank=6), "sizes [6, 7]"),
    (lambda t: t.results[7].update(final_rank=0), "ranks [0, 0, 1, 2, 3, 4]"),
    (lambda t: t.exits.update({6: (None, None)}), "survivor rank 6: recovered but exit code"),
    (lambda t: t.results[4].update(error="CollectiveTimeout"), "survivor rank 4: waited until"),
    (lambda t: t.results[4].update(recover_errors=" -> CollectiveTimeout"),
     "survivor rank 4: waited until"),
    (lambda t: t.results.update({2: _recovered(0, 2)}), "lost rank 2 (host 1): recovered"),
])
def test_judge_fails_what_must_fail(spoil, says):
    trial = _host_kill([2, 3])
    spoil(trial)
    problems = "\n".join(trial.problems())
    assert says in problems, problems


def test_judge_requires_cut_off_ranks_to_exit():
    trial = _host_kill([2, 3])
    trial.fault = "cable"
    trial.exits[2] = (0, 8.0)
    trial.exits[3] = (None, None)          # still running at EXIT_LIMIT: hung
    problems = "\n".join(trial.problems())
    assert "cut-off rank 3: still running" in problems and "rank 2" not in problems
    assert trial.cutoff_exits() == [8.0]


@needs_hosts
@pytest.mark.timeout(150)
def test_a_rank_cut_off_in_agree_raises_a_pycoll_error_and_exits(tmp_path):
    """A rank whose cable is pulled while it agrees (the loop's agree, as in mixed_step) is
    cut off from the store: it must raise a ``pycoll.PycollError`` that names the agree (code
    catching ``PycollError`` to recover must see it) and exit within the documented bound
    of a pulled cable, as a rank failing in a collective does."""
    from .jobs import bound_seconds

    with NamespaceHosts(3) as hosts:
        seen = cut_off_in_agree(hosts, tmp_path)
    assert seen.get("type"), f"rank 1 raised nothing: {seen['log']}"
    assert seen["pycoll_error"] and "agree" in seen["message"], (
        f"rank 1 raised {seen['type']}: {seen['message'][:500]}")
    limit = bound_seconds() + 3.0
    assert seen["exit_s"] is not None and seen["exit_s"] <= limit, (
        f"rank 1 exited {seen['exit_s']} s after the cable was pulled (bound {limit:g} s): "
        f"{seen['log'][-1500:]}")
