"""Spark barrier mode (``pycoll.spark``) with real pyspark and a real JVM.

``local-cluster[2,2,1024]`` runs a master and two workers inside the driver's JVM and each
worker's executor as a JVM of its own (2 cores each: the 4 slots a 4-task barrier stage
needs at once); every task runs in a Python worker process of its executor. One session
serves every test of the module (starting it costs seconds); it is stopped at the end.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install "
                                                "'pycoll[spark]')")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime: no java on PATH and JAVA_HOME is not set "
                "(apt-get install -y openjdk-17-jre-headless)", allow_module_level=True)

import pycoll.spark  # noqa: E402
from pycoll.spark import SparkRankFailed  # noqa: E402
from pycoll.testing.jobs import fails_on  # noqa: E402

pytestmark = pytest.mark.timeout(180)

WORLD = 4


@pytest.fixture(scope="module")
def sc():
    from pyspark import SparkConf, SparkContext

    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    # the executors' Python workers: this interpreter (its venv has pycoll, editable)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"      # nothing of the test listens outside
    conf = (SparkConf().setMaster(f"local-cluster[2,{WORLD // 2},1024]")
            .setAppName("pycoll-spark-test")
            .set("spark.ui.enabled", "false")
            .set("spark.driver.memory", "512m")
            .set("spark.executor.memory", "512m")
            .set("spark.sql.shuffle.partitions", "2")
            .set("spark.python.worker.reuse", "true")
            .set("spark.executorEnv.OMP_NUM_THREADS", "1"))
    context = SparkContext(conf=pycoll.spark.barrier_conf(conf, WORLD))
    context.setLogLevel("ERROR")
    try:
        yield context
    finally:
        context.stop()
        # stop the JVM too (pyspark keeps its gateway for the next SparkContext): no process
        # or socket of this test outlives it, and forked ranks of later tests inherit none
        gateway = SparkContext._gateway
        if gateway is not None:
            gateway.shutdown()
            proc = getattr(gateway, "proc", None)
            if proc is not None:           # the JVM exits when its stdin closes
                if proc.stdin is not None:
                    proc.stdin.close()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(30)
        SparkContext._gateway = None
        SparkContext._jvm = None
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_allreduce_over_four_barrier_tasks(sc):
    def job(comm, n):
        import socket

        import numpy as np

        import pycoll

        x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
        pycoll.allreduce(x)                                  # the default communicator
        y = np.full(3, comm.rank, dtype=np.int64)
        comm.allreduce(y, op="max")
        return comm.rank, comm.size, x, y, os.getpid(), socket.gethostname()

    results = pycoll.spark.run(job, WORLD, sc=sc, args=(1000,), timeout=60, job_timeout=120)
    assert len(results) == WORLD
    expected = np.arange(1000, dtype=np.float64) * sum(range(1, WORLD + 1))
    for r, (rank, size, x, y, _, _) in enumerate(results):
        assert (rank, size) == (r, WORLD)
        np.testing.assert_array_equal(x, expected)           # exact: small integers
        np.testing.assert_array_equal(y, np.full(3, WORLD - 1))
    assert len({pid for *_, pid, _ in results}) == WORLD      # four processes, not threads


def test_a_raising_rank_fails_the_job_naming_it(sc):
    with pytest.raises(SparkRankFailed) as info:
        pycoll.spark.run(fails_on, WORLD, sc=sc, args=(2,), timeout=60, job_timeout=120)
    err = info.value
    assert err.rank == 2, str(err)
    assert "rank 2 of 4" in str(err)
    assert "ValueError: rank 2's data is bad" in str(err), str(err)
    assert "Py4JJavaError" in type(err.__cause__).__name__    # Spark's report, kept

    # the executors' Python workers finalized: the next job in them starts cleanly
    def again(comm):
        import numpy as np

        x = np.full(2, comm.rank + 1.0)
        comm.allreduce(x)
        return x

    for x in pycoll.spark.run(again, WORLD, sc=sc, timeout=60, job_timeout=120):
        np.testing.assert_array_equal(x, np.full(2, 10.0))


def test_a_rank_whose_process_dies_is_named(sc):
    """No Python error to read: the rank is named by the ranks that lost it, or by Spark's
    report of which barrier task (partition id = rank) failed, whichever reaches the driver
    first."""
    def job(comm):
        import numpy as np

        if comm.rank == 1:
            os._exit(3)                    # a crash: no exception, no abort record
        x = np.ones(8)
        comm.allreduce(x)
        return x

    with pytest.raises(SparkRankFailed) as info:
        pycoll.spark.run(job, WORLD, sc=sc, timeout=60, job_timeout=120)
    assert info.value.rank == 1, str(info.value)
    assert "rank 1 of 4" in str(info.value)


def test_a_result_that_does_not_pickle_names_its_rank(sc):
    def job(comm):
        import threading

        return threading.Lock() if comm.rank == 3 else comm.rank

    with pytest.raises(SparkRankFailed, match="does its result pickle") as info:
        pycoll.spark.run(job, WORLD, sc=sc, timeout=60, job_timeout=120)
    assert info.value.rank == 3, str(info.value)


def test_bad_num_tasks_is_refused_before_spark_runs_anything(sc):
    with pytest.raises(pycoll.InvalidArgument, match="num_tasks"):
        pycoll.spark.run(lambda comm: None, 0, sc=sc)


def test_job_timeout_cancels_the_job(sc):
    """Last in the module: the cancelled tasks' Python workers take a few seconds to go."""
    def job(comm):
        import time

        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(pycoll.spark.SparkJobTimeout, match="job_timeout=3"):
        pycoll.spark.run(job, WORLD, sc=sc, timeout=60, job_timeout=3)
    assert time.monotonic() - start < 50      # cancelled: the tasks would sleep 60 s
