"""Node 0's verdict on a lost host (``ElasticPolicy.lose_host``) when every other rank has
already ended: a pulled cable shows on the store only after its keepalive (~4 s), and the
ranks' own sockets may see it first, shrink and finish. Real processes (they exit 0 or 1);
the other hosts are the policy's ``Job`` with none running, as after they all finished."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pycoll.launch.elastic_policy import ElasticPolicy, Job

pytestmark = pytest.mark.timeout(60)


def _ended(*codes: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", f"raise SystemExit({c})"]) for c in codes]
    for p in procs:
        p.wait(30)
    return procs


def _never(label: str, rank: int) -> subprocess.Popen:
    raise AssertionError(f"no replacement may start for {label} (rank {rank})")


def test_ranks_that_finished_outlived_the_host(capsys):
    procs = _ended(0, 0)
    policy = ElasticPolicy(2, 1, job=Job(2), world=4, max_restarts=2)
    assert policy.judge(procs) == 0
    assert policy.lose_host("h1 (node 1)", ["2", "3"], procs, _never) is None
    err = capsys.readouterr().err
    assert ("host h1 (node 1) was lost with ranks [2, 3] after the other ranks had ended, 2 of "
            "them with 0 (--elastic, --min-ranks 1): they outlived it") in err
    assert policy.lost_hosts == ["2", "3"] and policy.over is None


@pytest.mark.parametrize("codes,min_ranks", [((0, 0), 3), ((1, 1), 1)])
def test_too_few_finished_is_the_loss_verdict(capsys, codes, min_ranks):
    procs = _ended(*codes)
    policy = ElasticPolicy(2, min_ranks, job=Job(0), world=4)
    policy.judge(procs)
    assert policy.lose_host("h1 (node 1)", ["2", "3"], procs, _never) == 1
    assert policy.over == "ranks [2, 3] of host h1 (node 1)"
    assert (f"fewer than {min_ranks} ranks are left (0 running, --min-ranks {min_ranks})"
            in capsys.readouterr().err)
