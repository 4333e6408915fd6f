"""Driver program of the namespace-hosts Ray test (``test_ray_hosts.py``).

Run on a namespace host: ``python ray_job.py HEAD_ADDR:PORT WORLD``. It runs a ``WORLD``-rank
allreduce with ``pycoll.ray.run(..., address=HEAD_ADDR:PORT, strategy="SPREAD")`` (``run``
connects) and prints one JSON line: per rank its rank, size, hostname, Ray node address,
whether its result was exact, and the transports it used.
"""
from __future__ import annotations

import json
import sys

N = 1000


def job(comm, n):
    import ray

    from pycoll.testing.jobs import allreduce_report

    return dict(allreduce_report(comm, n), node=ray.util.get_node_ip_address())


def main() -> int:
    import ray

    import pycoll.ray

    address, world = sys.argv[1], int(sys.argv[2])
    try:        # run() connects (ray.init(address=...)) and leaves the connection open
        results = pycoll.ray.run(job, world, args=(N,), address=address, strategy="SPREAD",
                                 timeout=60, start_timeout=90, job_timeout=120)
    finally:
        ray.shutdown()
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
