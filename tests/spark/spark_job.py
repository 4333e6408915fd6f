"""Driver program of the namespace-hosts Spark test (``test_spark_hosts.py``).

Run on a namespace host: ``python spark_job.py spark://ADDR:PORT WORLD``. It connects to the
standalone master, runs a ``WORLD``-rank allreduce with ``pycoll.spark.run`` and prints one
JSON line: per rank its rank, size, hostname, and whether its result was exact.
"""
from __future__ import annotations

import json
import os
import sys

N = 1000


def main() -> int:
    from pyspark import SparkConf, SparkContext

    import pycoll.spark
    from pycoll.testing.jobs import allreduce_report

    master, world = sys.argv[1], int(sys.argv[2])
    conf = (SparkConf().setMaster(master).setAppName("pycoll-spark-hosts")
            .set("spark.ui.enabled", "false")
            .set("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
            .set("spark.driver.memory", "512m")
            .set("spark.executor.memory", "512m")
            .set("spark.executor.cores", "2"))
    sc = SparkContext(conf=pycoll.spark.barrier_conf(conf, world))
    sc.setLogLevel("ERROR")
    try:
        results = pycoll.spark.run(allreduce_report, world, sc=sc, args=(N,), timeout=60,
                                   job_timeout=120)
    finally:
        sc.stop()
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
