"""deterministic=True across hosts: the same bits whatever the placement.

Four ranks as two network-namespace hosts of two (ranks in blocks, and dealt round-robin),
and as four ranks of one host: every rank's result of every case has the same digest in the
three runs, and it is the rank-order fold the contract names (computed here, in the test).
Without torch the cases leave out bfloat16 (deterministic_job.DTYPES)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pycoll.testing import run_ranks
from pycoll.testing.hosts import NamespaceHosts

from . import deterministic_job as job
from .jobs import _run_job

pytestmark = pytest.mark.timeout(300)


def _contract(dtype: str, count: int, salt: int, n: int) -> object:
    xs = [job.inputs(r, count, dtype, salt) for r in range(n)]
    if dtype in ("float16", "bfloat16"):
        wide = [job.f32(x) for x in xs]
        acc = wide[0].copy()
        for x in wide[1:]:
            acc = acc + x
        return (job.torch.from_numpy(job.bf16(acc)).view(job.torch.bfloat16)
                if dtype == "bfloat16"
                else acc.astype(np.float16))
    acc = xs[0].copy()
    for x in xs[1:]:
        acc = acc + x
    return acc


def _expected(n: int) -> list[dict]:
    per_rank: list[dict] = [{} for _ in range(n)]
    for coll, dtype, count, salt in job.cases():
        full = _contract(dtype, count, salt, n)
        for r in range(n):
            if coll == "allreduce":
                per_rank[r][f"{coll}/{dtype}/{count}"] = job.digest(full)
            else:
                per = count // n
                per_rank[r][f"{coll}/{dtype}/{count}"] = job.digest(full[r * per:(r + 1) * per])
    return per_rank


def _one_host(comm):
    return job.run(comm)


def test_placements_give_the_contracts_bits(tmp_path):
    expected = _expected(4)
    assert run_ranks(_one_host, 4, env={"PYCOLL_TRANSPORTS": "shm"}, timeout=100,
                     collective_timeout=30) == expected
    with NamespaceHosts(2) as hosts:
        for cyclic in (False, True):
            out = tmp_path / ("cyclic" if cyclic else "block")
            out.mkdir()
            results = _run_job(hosts, 2, out, job=Path(job.__file__), cyclic=cyclic)
            for res in results:
                assert res["digests"] == expected[res["rank"]], (cyclic, res["rank"])
            hosts_of = {res["rank"]: res["host"] for res in results}
            assert len(set(hosts_of.values())) == 2
