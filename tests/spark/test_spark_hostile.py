"""Spark's bootstrap channel against hostile input (issue 32, part 5), with real pyspark.

pycoll's Spark bootstrap speaks over ``BarrierTaskContext.allGather`` (Spark's RPC: only the
tasks of the stage reach it) and then over rank 0's store (the job secret keeps strangers
out: tests/faults/test_job_secret.py). What a task can still receive is a message that is not
pycoll's: a task that calls ``allGather`` for its own purposes where pycoll's bootstrap runs,
or a rank 0 of another pycoll version. Each rank that receives one fails naming the task and
what was wrong, instead of a bare ``JSONDecodeError`` or ``TypeError``; and a stranger on
rank 0's store is turned away while the job still runs.
"""
from __future__ import annotations

import pytest
from test_spark import WORLD, sc  # noqa: F401 - the module's SparkContext fixture

from pycoll.testing.jobs import store_stranger

pytestmark = pytest.mark.timeout(180)


def _stage(context, task):
    return dict(context.parallelize(range(WORLD), WORLD).barrier().mapPartitions(task)
                .collect())


def test_a_message_that_is_not_json(sc):  # noqa: F811
    def task(_):
        from pyspark import BarrierTaskContext

        from pycoll.spark import _BarrierComm

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        if rank == 2:
            ctx.allGather("\x00 not pycoll's")
            yield rank, "sent"
            return
        try:
            _BarrierComm(ctx, 60).allgather("my host")
            yield rank, "ok"
        except Exception as e:  # noqa: BLE001 - reported to the test
            yield rank, f"{type(e).__name__}: {e}"

    out = _stage(sc, task)
    for rank in (0, 1, 3):
        assert out[rank].startswith(f"PycollError: rank {rank}: "), out[rank]
        assert "from barrier task 2 that is not pycoll's" in out[rank], out[rank]


@pytest.mark.parametrize("offer", [["ok", "127.0.0.1", "29500x", "s3cr3t"], None, ["ok"],
                                   ["ok", "127.0.0.1", 70000, "s3cr3t"]],
                         ids=["port-text", "null", "short", "port-range"])
def test_a_malformed_offer_from_rank_0(sc, offer):  # noqa: F811
    def task(_):
        import json

        from pyspark import BarrierTaskContext

        from pycoll.launch.mpi import bootstrap
        from pycoll.spark import _BarrierComm

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        if rank == 0:                     # speaks the protocol, but sends a bad offer
            ctx.allGather(json.dumps("host0"))
            ctx.allGather(json.dumps(offer))
            yield rank, "sent"
            return
        try:
            bootstrap(_BarrierComm(ctx, 60), 10.0)
            yield rank, "ok"
        except Exception as e:  # noqa: BLE001 - reported to the test
            yield rank, f"{type(e).__name__}: {e}"

    out = _stage(sc, task)
    for rank in (1, 2, 3):
        assert out[rank].startswith(f"PycollError: rank {rank}: bootstrap: rank 0's "), out[rank]
        assert "s3cr3t" not in out[rank]                 # the secret is never echoed


def test_a_stranger_on_rank_0s_store(sc):  # noqa: F811
    """Rank 1 plays a stranger before joining: it reaches rank 0's store (the address the
    bootstrap broadcast) without the secret and with a wrong one, is refused both times,
    and then the job runs."""
    import pycoll.spark

    out = pycoll.spark.run(store_stranger, WORLD, sc=sc, timeout=60, job_timeout=120)
    assert [x for x, _ in out] == [10.0] * WORLD
    assert out[1][1] and "let in" not in out[1][1], out[1]
